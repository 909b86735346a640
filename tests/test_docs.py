"""The docs hold together: every relative Markdown link in README.md, docs/*.md and
bench/**/README.md reaches a file that exists, and every `#anchor` one of a heading there (as
GitHub makes a heading's anchor); README.md and each docs/*.md answers its question in 25 KB."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINKED = sorted({*DOCS, *(ROOT / "bench").glob("**/README.md")})
MAX_BYTES = 25_000

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target): the target up to whitespace (a title may follow) or `)`
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], ""
    for line in text.splitlines():
        fence = FENCE.match(line)
        if fence and (not fenced or fence.group(1)[0] == fenced[0]):
            fenced = "" if fenced else fence.group(1)
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: its rendered words lower-cased, every character but
    letters, digits, `-`, `_` and spaces dropped, each space a `-`."""
    text = CODE_SPAN.sub(lambda match: match.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML shows nothing of its tags
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the file: its headings' (a repeat gets -1, -2, …) and HTML ones."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The targets of the file's Markdown links, code spans and blocks left out."""
    targets = []
    for line in _prose(path.read_text(encoding="utf-8")):
        targets.extend(LINK.findall(CODE_SPAN.sub("", line)))
    return targets


def _shown(file: Path) -> str:
    return str(file.relative_to(ROOT)) if ROOT in file.parents else str(file)


def _broken(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or not target:
            continue  # https:, mailto:: not this repository's
        name, _, anchor = target.partition("#")
        file = (path.parent / unquote(name)).resolve() if name else path
        if not file.exists():
            broken.append(f"{target}: no {_shown(file)}")
        elif anchor and file.suffix == ".md" and unquote(anchor) not in anchors(file):
            broken.append(f"{target}: no heading of {_shown(file)} has that anchor")
    return broken


@pytest.mark.parametrize("path", LINKED, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    """Each relative link names a file of the repository, and its `#anchor` a heading of it."""
    assert _broken(path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_a_doc_fits_in_25_kb(path: Path) -> None:
    """README.md and each docs/*.md stays within 25 KB: a longer one answers several questions
    and is split (one question a doc), its measurement history kept in bench/results/README.md."""
    assert path.stat().st_size <= MAX_BYTES, f"{path.relative_to(ROOT)}: split it"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Gateway memory (`python -m bench.memory`)", "gateway-memory-python--m-benchmemory"),
        ("Chat images at the model's size (`OCRVL_RESIZE_IMAGES=on`)",
         "chat-images-at-the-models-size-ocrvl_resize_imageson"),
        ("Batches: `/v1/files` and `/v1/batches`", "batches-v1files-and-v1batches"),
        ("H200, pass 13: `--compile` against eager", "h200-pass-13---compile-against-eager"),
        ("The [plugin](x.md) & *its* <b>rotary</b>", "the-plugin--its-rotary"),
        ("Über 1.5 → faster", "über-15--faster"),
    ],
)  # fmt: skip
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    """The anchor of a heading is the one GitHub renders (code, links, HTML, symbols, Unicode)."""
    assert slug(heading) == anchor


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    """The check fails on a link to no file and on an anchor no heading has, not on code."""
    (tmp_path / "other.md").write_text("# Other\n\n## A part\n\n## A part\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Doc\n\n[ok](other.md#a-part-1) [ok](#doc) [web](https://example.com/x.md#nope)\n"
        "[gone](missing.md) [bad](other.md#no-such) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
    )
    assert [line.partition(":")[0] for line in _broken(doc)] == ["missing.md", "other.md#no-such"]


ERROR_CODE = re.compile(r"\bcode\s*=\s*\"([a-z][a-z_]+)\"")  # code="..." and `code = "..."`


def test_every_error_code_the_gateway_sets_is_named_in_the_docs() -> None:
    """Each `code` the gateway's errors carry (a literal in app/) is named in README.md or a
    doc, as docs/clients.md says: a client can look up any code it gets."""
    codes = {
        code
        for path in (ROOT / "app").rglob("*.py")
        for code in ERROR_CODE.findall(path.read_text(encoding="utf-8"))
    }
    assert len(codes) > 30  # the scan finds them (43 when written)
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)
    assert sorted(c for c in codes if not re.search(rf"\b{c}\b", text)) == []
