"""`make check`'s lock check: locks/ agree with pyproject.toml and with this venv, offline.

    python scripts/lockcheck.py [ROOT]      (run with the gateway venv's Python)

Fails, naming each problem, when a pin lacks hashes; when a requirement of pyproject.toml (its
dependencies, the bench extra, the dev group, the build backend) has no pin or a pin outside its
range; when a lock pins what nothing in pyproject.toml needs any more (walked through the
installed packages' own metadata, for this interpreter's markers); when locks/dev.txt moves a
pin of locks/gateway.txt; or when this venv holds other versions than its locks (rebuild it
with `make venv`). The fix for the first four is `make lock`.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)\s*(?:;\s*(.+?))?\s*$")
PROJECT = "paddleocr-vl-server"
MISSING = ""  # in a walk's result: some package was not installed, so the walk is partial


@dataclass(frozen=True)
class Pin:
    """One line of a lock: a name, its version, its marker, its hashes."""

    name: str
    version: str
    marker: Marker | None
    hashes: int

    def applies(self) -> bool:
        """Whether this interpreter installs it."""
        return self.marker is None or self.marker.evaluate({"extra": ""})


def read_lock(path: Path) -> list[Pin]:
    """The pins of a uv/pip-tools lock (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    pins = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "-")):  # comments, `# via` lines, options
            continue
        head, *hashes = re.split(r"\s+--hash=", line)
        match = PIN.match(head)
        if match is None:
            raise SystemExit(f"{path}: not a pinned requirement: {head!r}")
        name, version, marker = match.groups()
        pins.append(
            Pin(canonicalize_name(name), version, Marker(marker) if marker else None, len(hashes))
        )
    return pins


def applicable(pins: Iterable[Pin]) -> dict[str, Pin]:
    """The pins this interpreter installs, by name."""
    return {pin.name: pin for pin in pins if pin.applies()}


def walk(
    roots: Iterable[Requirement], pins: dict[str, Pin], where: str, project: dict[str, Any]
) -> tuple[set[str], list[str]]:
    """Every package `roots` need here and the problems found: the project's requirements as
    pyproject.toml has them now, everything else's from its installed metadata."""
    problems: list[str] = []
    needed: set[tuple[str, frozenset[str]]] = set()
    todo = [(r, frozenset(r.extras)) for r in roots]
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if name == PROJECT:
            own = list(project["dependencies"])
            for extra in extras:
                own += project.get("optional-dependencies", {}).get(extra, [])
            todo += [(Requirement(text), frozenset(Requirement(text).extras)) for text in own]
            continue
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{where}: {requirement} is needed but not pinned")
            continue
        if not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{where}: {name}=={pin.version} is outside {requirement}")
        key = (name, extras)
        if key in needed:
            continue
        needed.add(key)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:  # installed_drift names it; the walk stops short
            needed.add((MISSING, frozenset()))
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": extra}) for extra in (extras or {""})
            ):
                todo.append((sub, frozenset(sub.extras)))
    return {name for name, _ in needed}, problems


def check(root: Path) -> list[str]:
    """Every disagreement between pyproject.toml, locks/ and this venv."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    locks = {
        name: read_lock(root / "locks" / f"{name}.txt") for name in ("gateway", "dev", "build")
    }
    problems = [
        f"locks/{name}.txt: {pin.name}=={pin.version} has no --hash"
        for name, pins in locks.items()
        for pin in pins
        if pin.hashes == 0
    ]
    own = Requirement(f"{PROJECT}[bench]")
    dev = [Requirement(text) for text in pyproject["dependency-groups"]["dev"]]
    build = [Requirement(text) for text in pyproject["build-system"]["requires"]]
    for name, roots in (
        ("gateway", [Requirement(PROJECT)]),
        ("dev", [own, *dev]),
        ("build", build),
    ):
        pins = applicable(locks[name])
        needed, found = walk(roots, pins, f"locks/{name}.txt", pyproject["project"])
        problems += found
        if MISSING in needed:
            continue  # what looks unneeded may be needed by what is missing
        problems += [
            f"locks/{name}.txt: {pin} is pinned but nothing in pyproject.toml needs it"
            for pin in sorted(set(pins) - needed)
        ]
    gateway = {(pin.name, str(pin.marker)): pin.version for pin in locks["gateway"]}
    for pin in locks["dev"]:
        runtime = gateway.get((pin.name, str(pin.marker)))
        if runtime is not None and runtime != pin.version:
            problems.append(f"locks/dev.txt moves {pin.name} from {runtime} to {pin.version}")
    problems += installed_drift(applicable([*locks["dev"], *locks["build"]]))
    return problems


def installed_drift(pins: dict[str, Pin]) -> list[str]:
    """Where this venv differs from its locks (pip and the project itself aside)."""
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()
    }
    installed.pop(canonicalize_name(PROJECT), None)
    installed.pop("pip", None)
    problems = [
        f"{sys.prefix}: {name} {installed.get(name, 'is missing')}, the locks pin {pin.version}"
        for name, pin in sorted(pins.items())
        if installed.get(name) != pin.version
    ]
    problems += [
        f"{sys.prefix}: {name} {version} is installed but in no lock"
        for name, version in sorted(installed.items())
        if name not in pins
    ]
    return problems


def main() -> int:
    """Print each problem; exit 1 when there is any."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("lockcheck: run `make lock`, then `make venv` (docs/development.md)", file=sys.stderr)
        return 1
    print("lockcheck: locks/ agree with pyproject.toml and with this venv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
