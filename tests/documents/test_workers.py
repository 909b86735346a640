"""The preprocessing pool: its size, and surviving a worker that dies."""

from __future__ import annotations

import os

import pytest

from app.documents.errors import DocumentError
from app.documents.workers import Preprocessor
from app.settings import Settings
from tests.conftest import settings_for

pytestmark = pytest.mark.anyio


def test_default_workers_are_cores_minus_one_and_at_least_one() -> None:
    """OCRVL_PREPROCESS_WORKERS defaults to the usable cores - 1, never 0."""
    cores = len(os.sched_getaffinity(0))
    assert settings_for("http://127.0.0.1:9").preprocess_workers == max(cores - 1, 1)


def test_workers_can_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable sets the pool size; 0 is refused at start-up."""
    monkeypatch.setenv("OCRVL_BACKENDS", "http://127.0.0.1:9")
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_PREPROCESS_WORKERS", "3")
    assert Settings().preprocess_workers == 3
    monkeypatch.setenv("OCRVL_PREPROCESS_WORKERS", "0")
    with pytest.raises(ValueError, match="greater than 0"):
        Settings()


async def test_a_dead_worker_fails_its_page_and_the_pool_recovers() -> None:
    """A worker killed mid-task (a decoder crash, the OOM killer) fails that task with a 400
    saying so; the next task runs in a fresh pool."""
    pool = Preprocessor(1)
    try:
        with pytest.raises(DocumentError) as caught:
            await pool.run(os._exit, 1)
        assert caught.value.code == "preprocess_failed"
        assert await pool.run(int, "42") == 42
    finally:
        pool.close()


async def test_workers_run_behind_the_event_loop() -> None:
    """Workers run at a lower CPU priority than the gateway process."""
    pool = Preprocessor(1)
    try:
        assert await pool.run(os.nice, 0) == os.nice(0) + 10
    finally:
        pool.close()
