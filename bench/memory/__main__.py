"""Gateway memory: bursts of big pages in flight, RSS at its peak and after.

    python -m bench.memory [--sizes 64,256,512] [--rounds 3] [--body-mb 1.33]
                           [--delay-ms 1000] [--rewrite] [--tag T] [--out DIR]

A stand-in backend that answers each chat request after `--delay-ms` (so every page of a burst
is in the gateway at once) and a real `ocrvl serve` in front of it (bench.overhead's processes).
For each size N: `--rounds` bursts of N concurrent requests of a ~1.33 MB body (a data-URL
image, the size of a dense page PaddleOCR sends as PNG); the gateway's RSS is sampled every
10 ms. Prints and writes idle RSS, peak RSS, RSS a few seconds after the last burst, and both
against the bytes in flight (targets: peak <= idle + 1.3 x in flight; after <= idle + 50 MB).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from app.bench.report import keep
from bench.overhead import CLIENT_KEY, MODEL, REWRITTEN, ROOT
from bench.overhead.processes import running
from bench.overhead.report import machine
from tests.support.pages import chat_body

MB = 1024 * 1024
SETTLE = 5.0  # seconds after the last burst before "after" is read


def rss(pid: int) -> int:
    """Resident set size of `pid` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Sampler:
    """Samples a process's RSS in a thread; `peak` since the last `reset()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self) -> None:
        """Start a new peak from now."""
        self.peak = rss(self.pid)


def body(size_mb: float, model: str) -> bytes:
    """A chat body carrying a data-URL image of about `size_mb` MB."""
    image = os.urandom(int(size_mb * MB * 3 / 4))
    limits = {"min_pixels": 112896, "max_pixels": 1003520}
    return orjson.dumps(chat_body(image, model=model, mime="image/png", max_completion_tokens=4096,
                                  temperature=0, mm_processor_kwargs=limits))  # fmt: skip


async def burst(url: str, payload: bytes, size: int) -> list[int]:
    """`size` concurrent requests; their statuses."""
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as c:
        responses = await asyncio.gather(
            *(c.post("/v1/chat/completions", content=payload) for _ in range(size))
        )
    return [r.status_code for r in responses]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every size, in a fresh gateway each, so one size's heap does not carry into the next."""
    payload = body(args.body_mb, REWRITTEN if args.rewrite else MODEL)
    rows = []
    for size in args.sizes:
        with (
            tempfile.TemporaryDirectory() as workdir,
            running(
                Path(workdir), served=MODEL, backend_delay_ms=args.delay_ms, pinned=False
            ) as servers,
        ):
            pid = servers.pids["gateway"]
            asyncio.run(burst(servers.gateway, payload, 1))  # warm: imports, first connection
            time.sleep(1)
            idle = rss(pid)
            with Sampler(pid) as sampler:
                statuses: list[int] = []
                for _ in range(args.rounds):
                    statuses += asyncio.run(burst(servers.gateway, payload, size))
                peak = sampler.peak
            time.sleep(SETTLE)
            after = rss(pid)
        in_flight = size * len(payload)
        row = {
            "in_flight": size,
            "body_bytes": len(payload),
            "bytes_in_flight": in_flight,
            "idle_rss": idle,
            "peak_rss": peak,
            "after_rss": after,
            "peak_over_idle_per_byte_in_flight": (peak - idle) / in_flight,
            "after_over_idle": after - idle,
            "ok": statuses.count(200),
            "requests": len(statuses),
            "statuses": {str(code): statuses.count(code) for code in sorted(set(statuses))},
        }
        print(
            f"{size:>4} in flight ({in_flight / MB:.0f} MB): idle {idle / MB:.0f} MB, "
            f"peak {peak / MB:.0f} MB ({row['peak_over_idle_per_byte_in_flight']:.2f} x in "
            f"flight over idle), after {after / MB:.0f} MB (+{(after - idle) / MB:.0f} MB); "
            f"{row['ok']}/{row['requests']} ok",
            flush=True,
        )
        rows.append(row)
    return {"rows": rows}


def _others(statuses: dict[str, int]) -> str:
    others = {code: n for code, n in statuses.items() if code != "200"}
    return "(" + ", ".join(f"{n}x {code}" for code, n in others.items()) + ") " if others else ""


def markdown(result: dict[str, Any]) -> str:
    """The table and the targets."""
    lines = [
        f"# Gateway memory under bursts ({result['date']} {result['tag']})".replace(" )", ")"),
        "",
        f"Body {result['rows'][0]['body_bytes'] / MB:.2f} MB per request, backend answers after "
        f"{result['delay_ms']:g} ms, {result['rounds']} bursts per size, a fresh `ocrvl serve` "
        f"per size; model rewritten: {result['rewrite']}. Machine: {result['machine']['cpu']}, "
        f"{result['machine']['nproc']} cores.",
        "",
        "| in flight | MB in flight | idle MB | peak MB | (peak - idle) / in flight | "
        "after MB | after - idle MB | ok |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['in_flight']} | {row['bytes_in_flight'] / MB:.0f} | "
            f"{row['idle_rss'] / MB:.0f} | {row['peak_rss'] / MB:.0f} | "
            f"{row['peak_over_idle_per_byte_in_flight']:.2f} | {row['after_rss'] / MB:.0f} | "
            f"{row['after_over_idle'] / MB:+.0f} | {row['ok']}/{row['requests']} "
            f"{_others(row['statuses'])}|"
        )
    lines += [
        "",
        "Targets: (peak - idle) / in flight <= 1.3; after - idle <= 50 MB.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run and write bench/results/memory-DATE[-TAG].{md,json}."""
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument(
        "--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[64, 256, 512]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-mb", type=float, default=1.33)
    parser.add_argument("--delay-ms", type=float, default=1000)
    parser.add_argument("--rewrite", action="store_true", help="send a name the gateway rewrites")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    result = {
        "date": datetime.date.today().isoformat(),
        "tag": args.tag,
        "delay_ms": args.delay_ms,
        "rounds": args.rounds,
        "rewrite": args.rewrite,
        "machine": machine(),
        **measure(args),
    }
    stem = args.out / ("memory-" + result["date"] + (f"-{args.tag}" if args.tag else ""))
    keep(stem, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
