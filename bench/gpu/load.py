"""Method 2's load at one endpoint: a closed loop of the varied corpus, every request kept.

    python3 -m bench.gpu.load URL --name NAME[,NAME2...] --out DIR --api ocr|layout
        [--layout on|off] --concurrency C [--ramp 10] [--window 120] [--latencies 10] [--bin 10]
        [--max-seconds 330] [--pages 200] [--median 400] [--sigma 0.6] [--key KEY]

`--api ocr`: `POST /v1/ocr`, one corpus page a request as a data URL, `"cache": false`, its
drawn length as `max_tokens` (by blocks, each block its share: `corpus.split`); `--api layout`:
the layout service's `POST /v1/layout`. README.md ("Method 2") says why and how. Each NAME is a
window, decided online by `bench.gpu.method`, the next starting where one ended; after the last
the load stops (requests in flight are cancelled and kept as such). Writes DIR/NAME.requests.csv
(every request of the load: client, start, end, status, tokens, page; seconds from its start)
and DIR/NAME.json (settings and the window's figures; `--reread DIR/NAME.requests.csv`
recomputes them).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.gpu import corpus, method


@dataclass(frozen=True)
class Page:
    """One page of the corpus as a request carries it."""

    number: int
    url: bytes  # data:image/jpeg;base64,...
    tokens: int  # its drawn output length
    blocks: int  # the blocks its kind has (a layout read gives each its share)


def pages(count: int, lengths: corpus.Lengths) -> list[Page]:
    """The corpus's first `count` pages, drawn now (nothing is stored)."""
    made = []
    for number in range(count):
        data = base64.b64encode(corpus.draw(number))
        blocks = len(corpus.KINDS[corpus.kind_of(number)[0]][1])
        made.append(Page(number, b"data:image/jpeg;base64," + data, lengths.of(number), blocks))
    return made


def outcome(read: dict[str, Any]) -> str:
    """A page's status in the CSV: `page_error`, `cached` (the results cache answered: no
    engine work, so not counted) or 200."""
    return "page_error" if read.get("error") else "cached" if read.get("cached") else "200"


class Load:
    """One window's run: its requests, records and the window once decided."""

    def __init__(self, args: argparse.Namespace, corpus_pages: list[Page]) -> None:
        self.args, self.pages = args, corpus_pages
        self.order = random.Random(args.seed)  # noqa: S311 (a reproducible order)
        self.records: list[method.Record] = []
        self.numbers: list[int] = []  # the page of each record
        self.flying: dict[int, tuple[int, float, int]] = {}  # task id: (client, start, page)
        self.began = time.perf_counter()
        self.names = args.name.split(",")  # a window each, one after the other in this load
        self.windows: list[tuple[float, float]] = []
        self.capped = False
        self.stop = asyncio.Event()
        self.headers = {"content-type": "application/json"}
        if args.key:
            self.headers["authorization"] = f"Bearer {args.key}"

    def now(self) -> float:
        return time.perf_counter() - self.began

    def body(self, page: Page) -> tuple[str, bytes]:
        """The request's path and body."""
        if self.args.api == "layout":
            return "/v1/layout", b'{"images":["' + page.url + b'"]}'
        tokens = (
            page.tokens if self.args.layout == "off" else corpus.split(page.tokens, page.blocks)
        )
        tail = orjson.dumps({"layout": self.args.layout, "max_tokens": tokens, "cache": False})
        tail = tail[1:]
        return "/v1/ocr", b'{"file":"' + page.url + b'",' + tail

    async def one(self, http: httpx.AsyncClient, worker: int, page: Page) -> None:
        """A request, recorded whatever becomes of it (cancelled ones by `run`)."""
        key = id(asyncio.current_task())
        start = self.now()
        self.flying[key] = (worker, start, page.number)
        path, body = self.body(page)
        status, tokens = "200", 0
        try:
            reply = await http.post(self.args.url + path, content=body, headers=self.headers)
            status = str(reply.status_code)
            if reply.status_code == 200 and self.args.api == "ocr":
                read = reply.json()["pages"][0]
                tokens = int((read.get("usage") or {}).get("completion_tokens") or 0)
                status = outcome(read)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            status = type(exc).__name__
        del self.flying[key]
        self.records.append(method.Record(worker, round(start, 4), round(self.now(), 4), status,
                                          tokens))  # fmt: skip
        self.numbers.append(page.number)

    async def client(self, worker: int, delay: float) -> None:
        await asyncio.sleep(delay)
        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        timeout = httpx.Timeout(self.args.timeout, connect=10.0)
        async with httpx.AsyncClient(limits=one, timeout=timeout, trust_env=False) as http:
            while not self.stop.is_set():
                await self.one(http, worker, self.pages[self.order.randrange(len(self.pages))])

    async def control(self) -> None:
        """Look at the records every `--tick` seconds: start the first window, end each (the next
        starts where it ended), stop after the last or at the cap."""
        args, start = self.args, None
        while len(self.windows) < len(self.names) and not self.capped:
            await asyncio.sleep(args.tick)
            now = self.now()
            if start is None:
                start = method.window_start(self.records, args.concurrency, args.ramp)
            end = None
            if start is not None:
                end = method.window_end(self.records, start, now, window=args.window,
                                        latencies=args.latencies)  # fmt: skip
            if end is not None or now >= args.max_seconds:
                self.capped = end is None
                self.windows.append((start if start is not None else 0.0, end or now))
                start = end
        self.stop.set()

    async def run(self) -> None:
        starts = method.ramp(self.args.concurrency, self.args.ramp)
        clients = [asyncio.create_task(self.client(i, at)) for i, at in enumerate(starts)]
        control = asyncio.create_task(self.control())
        await self.stop.wait()
        ended = round(self.now(), 4)
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, control, return_exceptions=True)
        for worker, start, number in self.flying.values():
            self.records.append(method.Record(worker, round(start, 4), ended, method.CANCELLED))
            self.numbers.append(number)


def write_records(path: Path, load: Load) -> None:
    with path.open("w", newline="") as out:
        rows = csv.writer(out)
        rows.writerow(["worker", "start", "end", "status", "tokens", "page"])
        for r, number in sorted(zip(load.records, load.numbers, strict=True),
                                key=lambda pair: pair[0].start):  # fmt: skip
            rows.writerow([r.worker, f"{r.start:.4f}", f"{r.end:.4f}", r.status, r.tokens, number])


def read_records(path: Path) -> list[method.Record]:
    """A window's requests back from its CSV."""
    with path.open() as source:
        return [method.Record(int(row["worker"]), float(row["start"]), float(row["end"]),
                              row["status"], int(row["tokens"]))
                for row in csv.DictReader(source)]  # fmt: skip


def figures(args: argparse.Namespace, records: list[method.Record], span: list[float],
            capped: bool = False) -> dict[str, Any]:  # fmt: skip
    """The window's figures by the method's rules; not steady when the cap ended it."""
    rules = {"window_s": args.window, "latencies": args.latencies, "bin_s": args.bin}
    found = method.window(records, span[0], span[1], **rules)
    found["steady"] = found["steady"] and not capped
    return found


async def measure(args: argparse.Namespace, corpus_pages: list[Page]) -> list[dict[str, Any]]:
    """Run the load; each window's report (also written to OUT/NAME.json, the load's CSV beside
    each as NAME.requests.csv)."""
    args.out.mkdir(parents=True, exist_ok=True)
    load = Load(args, corpus_pages)
    cpu = time.process_time()
    await load.run()
    cpu = time.process_time() - cpu
    reports, settings = [], {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                             if k != "key"}  # fmt: skip
    for n, (name, span) in enumerate(zip(load.names, load.windows, strict=False)):
        write_records(args.out / f"{name}.requests.csv", load)
        capped = load.capped and n == len(load.windows) - 1
        report = {"tool": "bench.gpu.load", "name": name, "settings": settings | {"name": name},
                  "window_rule": "capped by --max-seconds" if capped else "met",
                  "requests": len(load.records),  # the client's own CPU over the whole load
                  "client_cpu_s": round(cpu, 2), "client_wall_s": round(load.now(), 2),
                  } | figures(args, load.records, list(span), capped)  # fmt: skip
        (args.out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        reports.append(report)
    return reports


def line(report: dict[str, Any]) -> str:
    """One line for the log."""
    return (f"{report['name']}: {report['answered']} answered in {report['seconds']:.0f} s "
            f"({report['mean_latencies']:.1f} latencies, bins cv {report['bins_cv']:.3f}, "
            f"steady {report['steady']}, flat {report['flat']}): "
            f"{report['pages_per_s_by_count']:.2f} pages/s by count, "
            f"{report['pages_per_s_by_latency']:.2f} by latency; {report['statuses']}")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(prog="python3 -m bench.gpu.load")
    options.add_argument("url", nargs="?", help="the gateway's (or layout service's) base URL")
    options.add_argument("--api", choices=("ocr", "layout"), default="ocr")
    options.add_argument("--layout", choices=("on", "off"), default="off", help="--api ocr's")
    options.add_argument("--name", default="window", help="NAME[,NAME2...]: windows in a row")
    options.add_argument("--out", type=Path, default=Path("load-out"))
    options.add_argument("--concurrency", type=int, default=64)
    options.add_argument("--ramp", type=float, default=10.0, help="s to start the clients over")
    options.add_argument("--window", type=float, default=method.WINDOW_S)
    options.add_argument("--latencies", type=float, default=method.LATENCIES)
    options.add_argument("--bin", type=float, default=method.BIN_S, help="s per flatness bin")
    options.add_argument("--max-seconds", type=float, default=330.0, help="the load's cap")
    options.add_argument("--tick", type=float, default=1.0, help="s between looks")
    options.add_argument("--pages", type=int, default=200, help="corpus pages, cycled")
    options.add_argument("--median", type=int, default=corpus.Lengths.median)
    options.add_argument("--sigma", type=float, default=corpus.Lengths.sigma)
    options.add_argument("--key", default="")
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--timeout", type=float, default=600.0)
    options.add_argument("--reread", type=Path, help="recompute a window's figures from its CSV")
    return options


def main(argv: list[str] | None = None) -> int:
    """The load's windows; exit 1 when one was not steady, not flat or had errors (or the cap
    came before the last)."""
    args = parser().parse_args(argv)
    if args.reread:
        report = json.loads(args.reread.with_suffix("").with_suffix(".json").read_text())
        rules = argparse.Namespace(**report["settings"])  # the window's own rules
        print(json.dumps(figures(rules, read_records(args.reread), report["span_s"]), indent=1))
        return 0
    lengths = corpus.Lengths(args.median, args.sigma)
    reports = asyncio.run(measure(args, pages(args.pages, lengths)))
    print("\n".join(map(line, reports)), flush=True)
    good = [r["steady"] and r["flat"] and set(r["statuses"]) <= {"200"} for r in reports]
    return 0 if len(good) == len(args.name.split(",")) and all(good) else 1


if __name__ == "__main__":
    sys.exit(main())
