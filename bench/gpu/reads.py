"""Whether the engines read a window's pages: vLLM's and the gateway's own counters around it.

The 2026-12-05 H200 pass measured the gateway's results cache, not the engines: 2,991 engine
completions in the whole run for 168,523 pages answered (bench/results/README.md, eighteenth
pass), and nothing in the pass said so until its logs were read. So `bench.gpu.run` reads the
gateway's `/metrics` and every engine's before and after each window (NN-VARIANT.metrics-before
.json and -after.json) and stops the pass at the first window whose pages the engines did not
read: fewer completions (`vllm:request_success_total`, aborts left out) than pages answered 200
over the whole load (each page is at least one engine request: one whole, one a block by
blocks), or any page the results cache answered (`ocrvl_cache_hits_total`). The report puts the
counts beside each window.
"""

from __future__ import annotations

import csv
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

COMPLETIONS = "vllm:request_success"  # counters: their samples are NAME_total
CACHE_HITS = "ocrvl_cache_hits"


def engines(backends: str) -> list[str]:
    """The engines' base URLs from an `OCRVL_BACKENDS` value (`URL[;capacity=N],...`)."""
    return [entry.split(";")[0].rstrip("/").removesuffix("/v1")
            for entry in backends.split(",") if entry.strip()]  # fmt: skip


def snapshot(gateway: str, engine_urls: list[str]) -> dict[str, Any]:
    """The gateway's and each engine's `/metrics` text now (loopback; neither needs a key)."""
    return {"gateway": fetch(gateway + "/metrics"),
            "engines": {url: fetch(url + "/metrics") for url in engine_urls}}  # fmt: skip


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as reply:  # noqa: S310 (loopback)
        return str(reply.read().decode())


def total(text: str, family: str, **labels: str) -> float:
    """The sum of a counter's `_total` samples whose labels include `labels` (typed or not)."""
    return sum(sample.value for found in text_string_to_metric_families(text)
               for sample in found.samples if sample.name == family + "_total"
               and labels.items() <= sample.labels.items())  # fmt: skip


def counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """What the engines finished and the results cache answered between two snapshots."""

    def moved(family: str, **labels: str) -> int:
        return round(sum(total(after["engines"][url], family, **labels)
                         - total(before["engines"].get(url, ""), family, **labels)
                         for url in after["engines"]))  # fmt: skip

    aborts = moved(COMPLETIONS, finished_reason="abort")
    hits = total(after["gateway"], CACHE_HITS) - total(before["gateway"], CACHE_HITS)
    return {"engine_completions": moved(COMPLETIONS) - aborts, "engine_aborts": aborts,
            "cache_hits": round(hits)}  # fmt: skip


def pages_answered(requests_csv: Path) -> int:
    """Pages answered 200 over the whole load (ramp and tail too), from bench.gpu.load's CSV."""
    with requests_csv.open() as rows:
        return sum(row["status"] == "200" for row in csv.DictReader(rows))


def fault(counted: dict[str, int], pages: int) -> str | None:
    """Why the engines did not read the window's pages, or None when they did."""
    if counted["cache_hits"]:
        return f"the results cache answered {counted['cache_hits']} pages"
    if counted["engine_completions"] < pages:
        return (f"the engines finished {counted['engine_completions']} requests for "
                f"{pages} pages answered 200")  # fmt: skip
    return None
