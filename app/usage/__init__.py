"""Usage per key: requests, pages and tokens counted, kept per UTC day, and page budgets.

    reading     the engine's own `usage` read off answers in the relay (app/proxy.py), and a
                stream's usage chunk asked for and taken out when the client did not ask
    Meter       counts per key name and model (Prometheus at once, the store in batches),
                reserves budgeted pages before a request is sent
    base        counts, days, budgets, and the `UsageStore` interface
    SqliteUsage a table in the job store's SQLite file (OCRVL_DATA_DIR), for one gateway
    RedisUsage  hashes in the job store's Redis (OCRVL_REDIS_URL): replicas add into one total

`meter.metering(settings, keyring, metrics)` opens it at the lifespan; nothing above knows which
store. (No imports here: `ocrvl keys usage` loads only what it reads with.)
"""
