"""The same load from `hey` (Go, every core), to tell the engine's limit from the load generator's.

`ocrvl bench sweep` is one Python process; on the H200 it used 60-84 % of a core at c = 384-512.
If it were the limit, hey at the same concurrency would answer more pages a second. hey sends
one body for the whole run (one page, the sweep's body: 256 tokens, ignore_eos) and has no
warm-up, so its pages/s is counted over the second half of the run only, from its per-request
CSV (start offset + response time = when each answer ended):

    summary = run(HEY, gateway_url, key, body_path, concurrency=512, duration=60)

The one page is processed in full every time: the GPU profiles turn vLLM's multimodal processor
cache (`mm-processor-cache-gb: 0`) and prefix caching off. Requests that failed are not in hey's
CSV (it prints only answered ones), so `answered` counts the statuses of the answered ones; the
sweep is the place for error rates.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from app.bench.stats import spread

CSV_HEADER = (
    "response-time,DNS+dialup,DNS,Request-write,Response-delay,Response-read,status-code,offset"
)


def command(
    binary: str, url: str, key: str, body: Path, *, concurrency: int, duration: float
) -> list[str]:
    """hey's command line: POST `body` for `duration` seconds from `concurrency` workers, no
    client timeout (pages take tens of seconds under load), per-request CSV on stdout."""
    return [
        binary, "-z", f"{duration:g}s", "-c", str(concurrency), "-t", "0", "-m", "POST",
        "-T", "application/json", "-H", f"Authorization: Bearer {key}", "-D", str(body),
        "-o", "csv", f"{url}/v1/chat/completions",
    ]  # fmt: skip


def summary(csv: str, duration: float) -> dict[str, Any]:
    """Pages/s and latency of the 200s that ended in the run's second half, and every status."""
    lines = csv.strip().splitlines()
    if not lines or lines[0].strip() != CSV_HEADER:
        raise ValueError(f"not hey's CSV output: {csv[:200]!r}")
    statuses: Counter[int] = Counter()
    latencies = []
    start = duration / 2
    for line in lines[1:]:
        fields = line.split(",")
        latency, status, offset = float(fields[0]), int(fields[6]), float(fields[7])
        statuses[status] += 1
        if status == 200 and start <= offset + latency <= duration:
            latencies.append(latency)
    return {
        "window_s": [start, duration],
        "pages_per_s": len(latencies) / (duration - start),
        "pages": len(latencies),
        "latency_s": spread(latencies),
        "answered": {str(code): count for code, count in sorted(statuses.items())},
    }


def run(
    binary: str, url: str, key: str, body: Path, *, concurrency: int, duration: float
) -> dict[str, Any]:
    """Run hey against `url` and summarise it; the concurrency and duration go with it."""
    result = subprocess.run(
        command(binary, url, key, body, concurrency=concurrency, duration=duration),
        capture_output=True, text=True, check=True, timeout=duration + 600,
    )  # fmt: skip
    return {"concurrency": concurrency, "duration_s": duration} | summary(result.stdout, duration)
