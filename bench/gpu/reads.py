"""Whether the engines read a window's pages: vLLM's and the gateway's own counters around it.

The eighteenth H200 pass measured the gateway's results cache, not the engines (2,991 engine
completions for 168,523 pages; bench/results/README.md), and nothing in it said so. A window
whose engines finished (`vllm:request_success_total`, aborts apart) fewer requests than pages
answered 200 over the whole load (a page is at least one request: whole, or a block each), or
whose results cache answered any page (`ocrvl_cache_hits_total`), did not measure the engines.
"""

from __future__ import annotations

import csv
import urllib.request
from pathlib import Path
from typing import Any

COMPLETIONS, CACHE_HITS = "vllm:request_success", "ocrvl_cache_hits"  # counters (NAME_total)


def engines(backends: str) -> list[str]:
    """The engines' base URLs from an `OCRVL_BACKENDS` value (`URL[;capacity=N],...`)."""
    return [entry.split(";")[0].rstrip("/").removesuffix("/v1")
            for entry in backends.split(",") if entry.strip()]  # fmt: skip


def fetch(url: str, body: bytes | None = None) -> str:
    """`url` on loopback (a /metrics: the gateway's, an engine's, the layout service's), POST
    with a JSON `body` (vLLM's /start_profile and /stop_profile)."""
    request = urllib.request.Request(url, body, {"content-type": "application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=300) as reply:  # noqa: S310 (loopback)
        return str(reply.read().decode())


def snapshot(gateway: str, engine_urls: list[str], layout: str = "") -> dict[str, Any]:
    """The `/metrics` text now of the gateway, each engine and the layout service (if given)."""
    return {"gateway": fetch(gateway + "/metrics"), "layout": layout and fetch(layout + "/metrics"),
            "engines": {url: fetch(url + "/metrics") for url in engine_urls}}  # fmt: skip


def total(text: str, counter: str, **labels: str) -> float:
    """The sum of a counter's `_total` samples whose labels include `labels` (typed or not)."""
    # imported here: `bench.gpu.run` imports this module before `install` has put it on the host
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    return sum(sample.value for found in text_string_to_metric_families(text)
               for sample in found.samples if sample.name == counter + "_total"
               and labels.items() <= sample.labels.items())  # fmt: skip


def engines_moved(before: dict[str, Any], after: dict[str, Any], name: str, **labels: str) -> float:
    """How far the engines' counter `name` moved between two snapshots, all engines together."""
    return sum(total(text, name, **labels) - total(before["engines"].get(url, ""), name, **labels)
               for url, text in after["engines"].items())  # fmt: skip


def counts(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """What the engines finished and the results cache answered between two snapshots."""
    finished = engines_moved(before, after, COMPLETIONS)
    aborts = round(engines_moved(before, after, COMPLETIONS, finished_reason="abort"))
    hits = total(after["gateway"], CACHE_HITS) - total(before["gateway"], CACHE_HITS)
    return {"engine_completions": round(finished) - aborts, "engine_aborts": aborts,
            "cache_hits": round(hits)}  # fmt: skip


def check(before: dict[str, Any], after: dict[str, Any], requests_csv: Path) -> dict[str, Any]:
    """A window's reads: the counts, the pages its load answered 200 (bench.gpu.load's CSV),
    and the fault found (None: the engines read them)."""
    counted = counts(before, after)
    with requests_csv.open() as rows:
        pages = sum(row["status"] == "200" for row in csv.DictReader(rows))
    fault = None
    if counted["cache_hits"]:
        fault = f"the results cache answered {counted['cache_hits']} pages"
    elif counted["engine_completions"] < pages:
        fault = (f"the engines finished {counted['engine_completions']} requests for {pages} "
                 "pages answered 200")  # fmt: skip
    return counted | {"pages_answered": pages, "fault": fault}
