"""app/ has no import circles: no module imports, at any depth (a deferred import inside a
function or a TYPE_CHECKING block counts too), a module that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"


def _modules() -> dict[str, Path]:
    found = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    wanted: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            wanted.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            wanted.add(base)
            wanted.update(f"{base}.{alias.name}" for alias in node.names)
    edges = set()
    for imported in wanted:
        target = imported
        while target and target not in known:  # `from app.x import name`: the module app.x
            target = target.rpartition(".")[0]
        # a module's own packages are imported on the way to it, by Python, not by the module
        if target and target != name and not name.startswith(target + "."):
            edges.add(target)
    return edges


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_finder_sees_a_circle() -> None:
    """The check itself: two modules that import each other are one circle."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set()}
    assert _circles(graph) == [["a", "b"]]


def test_app_has_no_import_circles() -> None:
    """Every module of app/ can be imported without importing itself back."""
    modules = _modules()
    known = set(modules)
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    assert _circles(graph) == []
