"""Serving decisions: which backend takes a page, or whether it waits, or is shed.

capacity    pages a backend serves at once: an operator's override, else learnt from its KV cache;
            what a request costs (Work: units, a page being PAGE_UNITS, and sequences)
queue       the bounded admission queue, fair across API keys (round-robin by key)
routing     the least loaded backend with a free slot
admission   the Scheduler that `proxy` asks "which backend, or wait, or shed" and nothing else
"""

from __future__ import annotations

from app.scheduling.admission import Lease, Scheduler
from app.scheduling.capacity import PAGE, PAGE_UNITS, Work

__all__ = ["PAGE", "PAGE_UNITS", "Lease", "Scheduler", "Work"]
