"""Document jobs in the drill: submitted, long-polled to their end, checked page by page."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson

from bench.soak.clients import Clients, pages_ok
from bench.soak.report import Attempt

ENDED = ("succeeded", "failed", "cancelled", "expired")


@dataclass
class JobRecord:
    """One job as the drill saw it."""

    id: str
    pages: int
    submitted_at: float
    status: str = "queued"
    pages_ok: int = 0
    ended_at: float | None = None
    detail: str = ""


async def run_job(clients: Clients, data: bytes, pages: int, records: list[JobRecord],
                  deadline: float) -> None:  # fmt: skip
    """Submit `data`, long-poll it until it ends (or `deadline`, in run seconds), check it."""
    attempts: list[Attempt] = []
    started = clients.now()
    # the same PDF every time: the results cache must not answer it, or no engine reads it
    fields = {"max_tokens": str(clients.max_tokens), "cache": "false"}
    response = await clients.send(
        "POST", "/v1/ocr/jobs", attempts, files={"file": ("j.pdf", data)}, data=fields
    )
    if response is None or response.status_code != 202:
        detail = "no answer" if response is None else f"{response.status_code}: {response.text}"
        clients.keep("job", started, attempts, False, f"submit: {detail}")
        return
    record = JobRecord(orjson.loads(response.content)["id"], pages, started)
    records.append(record)
    while record.status not in ENDED and clients.now() < deadline:
        polled = await clients.send("GET", f"/v1/ocr/jobs/{record.id}?wait=20", attempts)
        if polled is not None and polled.status_code == 200:
            record.status = orjson.loads(polled.content)["status"]
        elif polled is not None:
            record.detail = f"poll {polled.status_code}: {polled.text[:200]}"
            break
        else:
            await asyncio.sleep(1)
    if record.status == "succeeded":
        result = await clients.send("GET", f"/v1/ocr/jobs/{record.id}/result", attempts)
        ok, record.detail = pages_ok(result, pages)
        if result is not None and result.status_code == 200:
            shown = orjson.loads(result.content)["pages"]
            good = [p for p in shown if not p.get("error") and p.get("text") is not None]
            record.pages_ok = len(good)
        record.ended_at = clients.now()
    else:
        ok = False
        record.detail = record.detail or f"ended {record.status}"
    clients.keep("job", started, attempts, ok, f"{record.id}: {record.detail}")
