"""The output and error files written at a batch's end, into a real SQLite file store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from app.batches.lines import output_line
from app.batches.results import file_id, write_files
from app.store.files import SqliteFiles

pytestmark = pytest.mark.anyio


async def chunks_of(*chunks: list[bytes]) -> AsyncIterator[list[bytes]]:
    """Kept lines as Store.page_chunks gives them."""
    for chunk in chunks:
        yield chunk


async def read(files: SqliteFiles, identity: str | None) -> list[dict[str, object]]:
    """A stored file's lines."""
    assert identity is not None
    return [
        orjson.loads(raw)
        for raw in b"".join([c async for c in files.content(identity)]).splitlines()
    ]


async def test_expired_lines_go_to_the_error_file_and_rewrites_keep_the_ids(tmp_path: Path) -> None:
    """Kept answers split by outcome; `unrun` lines not kept become `batch_expired` errors; a
    second write (a gateway that took the batch over) replaces the same two files."""
    files = SqliteFiles(tmp_path)
    await files.open()
    try:
        source = tmp_path / "input.jsonl"
        source.write_bytes(b'{"custom_id": "a"}\n\n{"custom_id": "b"}\n{"custom_id": "c"}\n')
        kept = [
            output_line("a", 200, "r1", {"ok": True}),
            output_line("b", 400, "r3", {"error": {"message": "no"}}),
        ]
        for _ in range(2):
            output, errors = await write_files(
                files,
                "batch_x",
                "key",
                chunks_of(kept[:1], kept[1:]),
                ttl=60,
                unrun=(source, {1, 3}),
            )
            assert (output, errors) == (file_id("batch_x", "output"), file_id("batch_x", "error"))
        assert [line["custom_id"] for line in await read(files, output)] == ["a"]
        failed = await read(files, errors)
        assert [line["custom_id"] for line in failed] == ["b", "c"]
        assert failed[1]["response"] is None
        assert failed[1]["error"] == {
            "code": "batch_expired",
            "message": "the batch's completion window ended before this request ran",
            "line": 4,
        }
        listed = await files.listing("key", 10, None)
        assert sorted(record.id for record in listed) == sorted([output, errors])
        assert {record.purpose for record in listed} == {"batch_output"}
        assert await write_files(files, "batch_y", "key", chunks_of(), ttl=60) == (None, None)
    finally:
        await files.close()
