"""The results cache's worth on a job whose pages repeat: pages/s with the cache off and on.

    python -m bench.cache [--pages 200] [--repeat 0.5] [--delay-ms 500] [--concurrency 8]
                          [--rounds 2] [--out bench/results] [--tag -NAME]

One PDF of `--pages` pages: the first (1 - repeat) x N distinct text pages, then the rest
repeating earlier ones in a seeded shuffled order. Per round, three runs side by side, each on a
fresh `ocrvl serve` (a real gateway, its job store and cache in a temporary data dir) in front
of bench.overhead's stand-in backend, which answers every page after `--delay-ms` (a fixed
per-page engine cost: the GPU is not what is measured here, and the machine is shared):

    off     OCRVL_CACHE=off: every page reaches the backend
    cold    the cache on and empty: the repeats are answered from it once their first reading
            is kept (a repeat that starts while its original is still in flight is read again)
    warm    the same job submitted again to the gateway of `cold`: every page is a hit

Wall time from submit until the job's long-poll says it ended (the route checks the store every
0.25 s: that is the resolution). Writes bench/results/cache-DATE[TAG].{json,md} (raw runs in the
JSON) and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import io
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from app.bench.report import keep
from bench.cache.stack import stack
from bench.overhead import CLIENT_KEY, ROOT
from bench.overhead.report import machine
from tests.support.documents import pages as text_pages


def document(count: int, repeat: float, seed: int) -> tuple[bytes, int]:
    """The PDF and how many of its pages repeat earlier ones."""
    distinct = max(1, round(count * (1 - repeat)))
    images = text_pages(distinct)
    rng = random.Random(seed)  # noqa: S311 (a benchmark's page order, not a secret)
    order = list(range(distinct)) + [rng.randrange(distinct) for _ in range(count - distinct)]
    out = io.BytesIO()
    first, *rest = (images[i] for i in order)
    first.save(out, format="PDF", save_all=True, append_images=rest)
    return out.getvalue(), count - distinct


def timed_job(http: httpx.Client, data: bytes) -> tuple[float, dict[str, Any]]:
    """Seconds from submit to the job's end, and the ended job."""
    started = time.monotonic()
    submitted = http.post("/v1/ocr/jobs", files={"file": ("doc.pdf", data)})
    submitted.raise_for_status()
    job: dict[str, Any] = submitted.json()
    while job["status"] in ("queued", "running"):
        job = http.get(f"/v1/ocr/jobs/{job['id']}", params={"wait": "60"}).json()
    return time.monotonic() - started, job


def counter(http: httpx.Client, name: str) -> float:
    """A counter's value on the gateway's /metrics (0 when it is not there)."""
    found = re.search(rf"^{name} (\S+)$", http.get("/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def run(cache: str, data: bytes, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One gateway: the job once (`off` or `cold`), and with the cache on once more (`warm`)."""
    env = {
        "OCRVL_CACHE": cache, "OCRVL_JOB_PAGE_CONCURRENCY": str(args.concurrency),
        "OCRVL_JOB_MAX_PAGES": "100000", "OCRVL_PREPROCESS_WORKERS": str(args.workers),
    }  # fmt: skip
    rows = []
    with (
        tempfile.TemporaryDirectory() as workdir,
        stack(Path(workdir), args.delay_ms, **env) as (
            url,
            _,
        ),
    ):
        headers = {"authorization": f"Bearer {CLIENT_KEY}"}
        with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
            http.post("/v1/ocr", files={"file": ("w.pdf", text_pages_pdf())}).raise_for_status()
            names = ["off"] if cache == "off" else ["cold", "warm"]
            for name in names:
                hits = counter(http, "ocrvl_cache_hits_total")
                seconds, job = timed_job(http, data)
                rows.append({
                    "run": name, "status": job["status"], "pages": job["pages_done"],
                    "failed": job["pages_failed"], "seconds": round(seconds, 2),
                    "pages_per_s": round(job["pages_done"] / seconds, 2),
                    "hits": int(counter(http, "ocrvl_cache_hits_total") - hits),
                })  # fmt: skip
                print(f"{name:<5} {seconds:7.2f} s  {rows[-1]['pages_per_s']:6.2f} pages/s  "
                      f"hits {rows[-1]['hits']}", flush=True)  # fmt: skip
    return rows


def text_pages_pdf() -> bytes:
    """A one-page PDF the warm-up reads (page workers started, the connection open): a page
    of another size than the job's, so it is none of them."""
    out = io.BytesIO()
    text_pages(1, 300, 400)[0].save(out, format="PDF")
    return out.getvalue()


def report(result: dict[str, Any]) -> str:
    """The markdown table: each round's runs, then the medians."""
    args = result["args"]
    lines = [
        f"# bench.cache ({result['date']})",
        "",
        f"One job of {args['pages']} PDF pages, {result['repeats']} of them repeating earlier "
        f"pages; stand-in backend answering each page after {args['delay_ms']:g} ms; "
        f"{args['concurrency']} pages of the job in flight; {args['workers']} page workers; "
        f"a fresh `ocrvl serve` per run pair. Machine: {result['machine']['nproc']} cores, "
        f"load {result['machine']['loadavg_at_start'][0]:.1f} at start (shared).",
        "",
        "| round | run | status | seconds | pages/s | cache hits |",
        "|---|---|---|---|---|---|",
    ]
    for number, rows in enumerate(result["rounds"], 1):
        for row in rows:
            lines.append(
                f"| {number} | {row['run']} | {row['status']} | {row['seconds']:.2f} "
                f"| {row['pages_per_s']:.2f} | {row['hits']} |"
            )
    lines += ["", "| run | median pages/s |", "|---|---|"]
    for name, value in result["medians"].items():
        lines.append(f"| {name} | {value:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cache", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--repeat", type=float, default=0.5)
    parser.add_argument("--delay-ms", type=float, default=500.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--tag", default="", help="added to the results' file names")
    args = parser.parse_args()
    data, repeats = document(args.pages, args.repeat, args.seed)
    rounds = []
    for number in range(args.rounds):
        print(f"round {number + 1}", flush=True)
        rounds.append(run("off", data, args) + run("on", data, args))
    medians = {}
    for name in ("off", "cold", "warm"):
        values = sorted(row["pages_per_s"] for rows in rounds for row in rows if row["run"] == name)
        medians[name] = values[len(values) // 2]
    today = datetime.date.today().isoformat()
    result = {
        "date": today, "args": {**vars(args), "out": str(args.out)}, "repeats": repeats,
        "document_bytes": len(data), "machine": machine(), "rounds": rounds, "medians": medians,
    }  # fmt: skip
    stem = args.out / f"cache-{today}{args.tag}"
    markdown = report(result)
    keep(stem, result, markdown)
    print(markdown)
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
