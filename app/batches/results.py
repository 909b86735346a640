"""The batch's output and error files, written from its kept lines once it ends.

Each file's id comes from the batch's own (unguessable) id, so a gateway that dies while writing
them and is replaced writes the same two files again rather than two more. Lines go to a spooled
file a chunk at a time, as they are read from the store (memory stays flat however many lines
the batch has), then into the file store, which keeps them for OCRVL_JOB_TTL.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import orjson

from app import scratch
from app.batches.lines import is_error, output_line, read_lines
from app.store import Files
from app.store.files import FileRecord

OUTPUT = "batch_output"


def file_id(batch_id: str, which: str) -> str:
    """The id of the batch's `which` ("output", "error") file: the same on every gateway."""
    digest = hashlib.sha256(f"{batch_id}:{which}".encode()).hexdigest()
    return f"file-{digest[:32]}"


def _write(bodies: list[bytes], good: BinaryIO, bad: BinaryIO, counts: list[int]) -> None:
    """A chunk of kept lines, each to the output or the error file (blocking)."""
    for body in bodies:
        failed = is_error(orjson.loads(body))
        (bad if failed else good).write(body)
        counts[failed] += 1


async def _split(chunks: AsyncIterator[list[bytes]], folder: Path) -> tuple[Path, int, Path, int]:
    """The kept lines, read a chunk at a time, written to an output and an error file as they
    come: the batch's lines are never all in memory at once."""
    output, errors = folder / "output.jsonl", folder / "errors.jsonl"
    counts = [0, 0]
    good = await asyncio.to_thread(output.open, "wb")
    try:
        bad = await asyncio.to_thread(errors.open, "wb")
        try:
            async for bodies in chunks:
                await asyncio.to_thread(_write, bodies, good, bad, counts)
        finally:
            await asyncio.to_thread(bad.close)
    finally:
        await asyncio.to_thread(good.close)
    return output, counts[0], errors, counts[1]


def expired_lines(path: Path, kept: set[int], into: Path, batch_id: str) -> int:
    """Append an error line (`batch_expired`) for each line of `path` not in `kept` (blocking)."""
    written = 0
    with into.open("ab") as errors:
        for number, raw in read_lines(path):
            if number in kept:
                continue
            try:
                custom_id = orjson.loads(raw or b"").get("custom_id")
            except (orjson.JSONDecodeError, AttributeError):
                custom_id = None
            message = "the batch's completion window ended before this request ran"
            error = {"code": "batch_expired", "message": message, "line": number}
            errors.write(output_line(custom_id, None, f"{batch_id}-l{number}", None, error))
            written += 1
    return written


async def write_files(
    files: Files,
    batch_id: str,
    owner: str,
    chunks: AsyncIterator[list[bytes]],
    *,
    ttl: float,
    unrun: tuple[Path, set[int]] | None = None,
) -> tuple[str | None, str | None]:
    """(output file id, error file id), None for a file that would be empty; `chunks`: the
    kept lines in order (Store.page_chunks); `unrun`: the input file and the lines kept, the
    rest written as `batch_expired` errors."""
    folder = Path(await asyncio.to_thread(scratch.folder, "batch"))
    try:
        output, good, errors, bad = await _split(chunks, folder)
        if unrun is not None:
            bad += await asyncio.to_thread(expired_lines, unrun[0], unrun[1], errors, batch_id)
        now = time.time()
        ids: list[str | None] = []
        for which, path, count in (("output", output, good), ("error", errors, bad)):
            if not count:
                ids.append(None)
                continue
            size = await asyncio.to_thread(os.path.getsize, path)
            name = f"{batch_id}_{which}.jsonl"
            record = FileRecord(file_id(batch_id, which), owner, name, OUTPUT, size, now, now + ttl)
            await files.put(record, path)
            ids.append(record.id)
        return ids[0], ids[1]
    finally:
        await asyncio.to_thread(_remove, folder)


def _remove(folder: Path) -> None:
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
