"""Durable state: jobs, their page results and their documents, behind one small interface.

    Store (base)      the interface, and the `Job` record it keeps
    SqliteStore       the embedded default: one SQLite file and a documents folder in
                      OCRVL_DATA_DIR, for one gateway
    RedisStore        when OCRVL_REDIS_URL is set: several replicas share jobs through Redis
    files             batch files (`/v1/files`): SqliteFiles, and RedisFiles (redisfiles)
    results           the results cache's pages: SqliteResults, and RedisResults
                      (redisresults); app/documents/cache.py consults it
    idempotency       Idempotency-Key records of submissions (app/idempotency.py uses them)

`open_store(settings)` picks one at the lifespan; nothing above this package knows which.
Batches (app/batches/) keep the same records as jobs, in their own tables or key prefix
(`open_store(settings, batches=True)`), and their files beside them (`open_files`).
"""

from __future__ import annotations

from app.settings import Settings
from app.store.base import ACTIVE, ENDED, Job, Store, new_job_id
from app.store.files import Files
from app.store.idempotency import Idempotency, RedisIdempotency, SqliteIdempotency
from app.store.results import ResultsCache, SqliteResults


def open_store(settings: Settings, *, batches: bool = False) -> Store:
    """Redis when OCRVL_REDIS_URL is set, else SQLite in OCRVL_DATA_DIR (not yet opened);
    `batches`: the batches' records rather than the jobs'."""
    if settings.redis_url is not None:
        from app.store.redisdb import BATCHES, P, RedisStore  # noqa: PLC0415 (replicas only)

        return RedisStore(settings.redis_url.get_secret_value(), BATCHES if batches else P)
    from app.store.sqlite import BATCHES as TABLES  # noqa: PLC0415
    from app.store.sqlite import Layout, SqliteStore  # noqa: PLC0415

    return SqliteStore(settings.data_dir, TABLES if batches else Layout())


def open_files(settings: Settings) -> Files:
    """The batch files' store, beside the jobs' (not yet opened)."""
    if settings.redis_url is not None:
        from app.store.redisfiles import RedisFiles  # noqa: PLC0415

        return RedisFiles(settings.redis_url.get_secret_value())
    from app.store.files import SqliteFiles  # noqa: PLC0415

    return SqliteFiles(settings.data_dir)


async def open_results(settings: Settings) -> ResultsCache | None:
    """The results cache's store, opened (None with OCRVL_CACHE=off): Redis when
    OCRVL_REDIS_URL is set, else the data dir's SQLite file."""
    if settings.cache == "off":
        return None
    ttl, cap = settings.cache_ttl, settings.cache_max_bytes
    store: ResultsCache
    if settings.redis_url is not None:
        from app.store.redisresults import RedisResults  # noqa: PLC0415 (replicas only)

        store = RedisResults(settings.redis_url.get_secret_value(), ttl, cap)
    else:
        store = SqliteResults(settings.data_dir, ttl, cap)
    await store.open()
    return store


def open_idempotency(settings: Settings) -> Idempotency:
    """The Idempotency-Key records' store (not yet opened): Redis or the data dir's SQLite."""
    if settings.redis_url is not None:
        return RedisIdempotency(settings.redis_url.get_secret_value(), settings.idempotency_ttl)
    return SqliteIdempotency(settings.data_dir, settings.idempotency_ttl)


__all__ = [
    "ACTIVE", "ENDED", "Files", "Idempotency", "Job", "ResultsCache", "Store", "new_job_id",
    "open_files", "open_idempotency", "open_results", "open_store",
]  # fmt: skip
