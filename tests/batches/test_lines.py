"""The input file read a line at a time: a line over the cap is refused by number and never
held whole (measured with tracemalloc, Python's own allocation tracer)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import orjson

from app.batches.lines import read_lines, validation_errors

CHAT = "/v1/chat/completions"
MiB = 1024 * 1024


def line(custom_id: str, padding: int = 0) -> bytes:
    """One request line, its body padded to about `padding` bytes."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * padding}]}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def test_lines_over_the_cap_come_as_none_and_the_rest_as_they_are(tmp_path: Path) -> None:
    """Exactly at the cap passes, one byte over does not, blank lines are skipped, numbering
    counts every line; a last line without a newline is read too."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"a" * 10 + b"\n\n" + b"b" * 11 + b"\n" + b"c" * 10)
    assert list(read_lines(path, 10)) == [(1, b"a" * 10 + b"\n"), (3, None), (4, b"c" * 10)]
    assert [number for number, _ in read_lines(path)] == [1, 3, 4]


def test_a_line_over_the_cap_fails_validation_naming_it(tmp_path: Path) -> None:
    """A line over OCRVL_MAX_BODY_BYTES: line_too_large with its number and the setting."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(line("a") + b"\n" + line("b", 5000) + b"\n" + line("c") + b"\n")
    count, errors = validation_errors(path, CHAT, 100, 4096)
    assert count == 3
    assert [(e["code"], e["line"]) for e in errors] == [("line_too_large", 2)]
    assert "OCRVL_MAX_BODY_BYTES" in errors[0]["message"]
    assert "line 2 is over 4096 bytes" in errors[0]["message"]


def test_a_huge_line_is_never_held_whole(tmp_path: Path) -> None:
    """A 64 MiB line against a 1 MiB cap: validation allocates a few MiB at its peak (the cap
    and a skip chunk), never the line (before, it read the line whole: 64 MiB and more)."""
    path = tmp_path / "in.jsonl"
    with path.open("wb") as out:
        out.write(line("a") + b"\n")
        out.write(b'{"custom_id": "big", "body": "')
        for _ in range(64):
            out.write(b"x" * MiB)
        out.write(b'"}\n')
        out.write(line("c") + b"\n")
    tracemalloc.start()
    try:
        count, errors = validation_errors(path, CHAT, 100, MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (count, [e["line"] for e in errors]) == (3, [2])
    assert peak < 8 * MiB, f"validation allocated {peak / MiB:.1f} MiB at its peak"
