"""Rasterisings counted in the gateway's own worker processes (spawned: a patch in the test's
process never reaches them). `counting(log)` makes every pool started after it run
`counted` as its initializer: the workers' own start, then each `raster.page_image` (a page at
full resolution: the layout path) and `raster.render` (a page read whole) appends a line
`<function> <page index>` to `log`, and each page's pixels kept for the gateway
(`raster.Pixels.kept`) a line `kept -1` (the page is not known there). The caller reads it
with `rasterisings` (or `logged`, the kept pixels too) once its request has answered: every
worker call of the request has returned by then."""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.documents import raster, workers

COUNTED = ("page_image", "render")


def counted(log: str, parent: int) -> None:
    """A worker's start (`workers.worker_started`), with its rasterisings written to `log`."""
    workers.worker_started(parent)
    for name in COUNTED:
        setattr(raster, name, functools.partial(_logged, getattr(raster, name), name, log))
    pixels = getattr(raster, "Pixels", None)  # None: a checkout before 2026-12-05 (bench)
    if pixels is not None:
        pixels.kept = functools.partial(_kept, pixels.kept, log)


def _logged(real: Callable[..., Any], name: str, log: str, source: Any, index: int) -> Any:
    _line(log, f"{name} {index}")
    return real(source, index)


def _kept(real: Callable[..., Any], log: str, *args: Any) -> Any:
    pixels = real(*args)
    if pixels is not None:
        _line(log, "kept -1")
    return pixels


def _line(log: str, line: str) -> None:
    with open(log, "a", encoding="utf-8") as out:  # one short O_APPEND write: whole lines
        out.write(f"{line}\n")


@contextlib.contextmanager
def counting(log: Path) -> Iterator[Path]:
    """Pools started inside count their workers' rasterisings in `log` (emptied first)."""
    log.write_text("")
    original = workers.worker_started
    workers.worker_started = functools.partial(counted, str(log))  # type: ignore[assignment]
    try:
        yield log
    finally:
        workers.worker_started = original


def logged(log: Path) -> collections.Counter[tuple[str, int]]:
    """(what, page index) -> how many times, from `log`; the log emptied for the next."""
    lines = log.read_text().split()
    log.write_text("")
    return collections.Counter(zip(lines[::2], map(int, lines[1::2]), strict=True))


def rasterisings(log: Path) -> collections.Counter[tuple[str, int]]:
    """(function, page index) -> how many times the pages were rasterised (`logged`)."""
    return collections.Counter({k: n for k, n in logged(log).items() if k[0] in COUNTED})
