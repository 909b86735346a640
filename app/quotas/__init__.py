"""Per-key limits: requests per minute and requests in flight, one key at a time.

    admit (dependency)  authenticate, then Quotas.admit(name)   → Grant, or RateLimited (429)
    Quotas              RPM in `limits`' moving window + a concurrency slot, memory or Redis
    (app/context.py)    x-ratelimit-* headers on the answer; the slot back once it is sent

The lifespan builds one `Quotas` (Redis when OCRVL_REDIS_URL is set and answers, memory while it
does not) and closes it; routes take `Admitted` instead of `KeyName`. docs/limits.md says more.
"""

from app.quotas.asgi import Admitted
from app.quotas.limiter import Limits, Quotas

__all__ = ["Admitted", "Limits", "Quotas"]
