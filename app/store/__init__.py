"""Durable state: jobs, their page results and their documents, behind one small interface.

    Store (base)      the interface, and the `Job` record it keeps
    SqliteStore       the embedded default: one SQLite file and a documents folder in
                      OCRVL_DATA_DIR, for one gateway
    RedisStore        when OCRVL_REDIS_URL is set: several replicas share jobs through Redis

`open_store(settings)` picks one at the lifespan; nothing above this package knows which. Usage
totals and batches (later) add their records here, beside the jobs.
"""

from __future__ import annotations

from app.settings import Settings
from app.store.base import ACTIVE, ENDED, Job, Store, new_job_id


def open_store(settings: Settings) -> Store:
    """Redis when OCRVL_REDIS_URL is set, else SQLite in OCRVL_DATA_DIR (not yet opened)."""
    if settings.redis_url is not None:
        from app.store.redisdb import RedisStore  # noqa: PLC0415 (only replicas need it)

        return RedisStore(settings.redis_url.get_secret_value())
    from app.store.sqlite import SqliteStore  # noqa: PLC0415

    return SqliteStore(settings.data_dir)


__all__ = ["ACTIVE", "ENDED", "Job", "Store", "new_job_id", "open_store"]
