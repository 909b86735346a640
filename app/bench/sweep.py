"""The sweep: every level against every target, interleaved, stopping where errors pass a bound.

At level i the targets run in order when i is even and in reverse when it is odd, so slow drift
of a shared machine falls on both sides of each ratio alike.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import httpx

from app import __version__
from app.bench import engine, report
from app.bench.corpus import Page, default_cache, draws, from_folder, resized, synthetic
from app.bench.load import MM_PROCESSOR_KWARGS, Plan, Shape, Target, auth, run_level
from app.bench.progress import Progress
from app.bench.stats import summarize


@dataclass
class Config:
    """Everything `ocrvl bench sweep` was asked to do."""

    urls: list[str]
    keys: list[str]
    labels: list[str]
    levels: list[int]
    model: str | None = None
    requests: int | None = None
    duration: float | None = None
    warmup: int | None = None  # None: as many as the level's concurrency
    pages: str = "synthetic"
    corpus: int = 1000
    resized: bool = False  # send the pages at the model's size (corpus.resized), as /v1/ocr does
    shape: Shape = field(default_factory=Shape)
    metrics_urls: list[str] = field(default_factory=list)
    metrics_interval: float = 0.5
    ramp: float | None = None  # None: the previous level's mean latency, scaled by C
    max_error_rate: float = 0.1
    timeout: float = 300.0
    out: Path = Path("sweep")
    name: str = "sweep"
    plot: bool = True
    command: str = ""
    notes: str = ""  # free text for the report (e.g. what else shared the machine)

    def warmup_at(self, concurrency: int) -> int:
        return concurrency if self.warmup is None else self.warmup

    def pages_needed(self) -> int:
        """Pages a level can use: warm-up, measured, and the C cancelled at its end."""
        if not self.requests:
            return self.corpus
        return max(self.warmup_at(c) + self.requests + c for c in self.levels)


def load_pages(config: Config) -> tuple[list[Page], str]:
    """The corpus and a description of it for the report."""
    if config.pages == "synthetic":
        pages = synthetic(config.pages_needed())
        described = f"{len(pages)} synthetic A4 pages (app/bench/corpus.py, seeds 0..)"
        cache: Path | None = default_cache()
    else:
        pages = from_folder(Path(config.pages))
        described = f"{len(pages)} images from {config.pages}"
        cache = None  # a folder's files may change under the same names
    if config.resized:
        bounds = MM_PROCESSOR_KWARGS
        pages = resized(pages, bounds["min_pixels"], bounds["max_pixels"], cache)
        described += (
            ", resized to the model's size before sending (app/documents/resize.py: "
            "PaddleOCR-VL's smart_resize within the request's min/max pixels, JPEG q95)"
        )
    return pages, described


async def _describe(
    client: httpx.AsyncClient, config: Config, url: str, key: str, label: str
) -> tuple[Target, dict[str, Any]]:
    """The target with its model (asked of /v1/models unless given) and server facts."""
    headers = auth(key)
    model = config.model
    if model is None:
        response = await client.get(f"{url}/v1/models", headers=headers)
        response.raise_for_status()
        model = response.json()["data"][0]["id"]
    version = None
    try:
        reply = await client.get(f"{url}/version")
        if reply.status_code == 200:
            version = reply.json().get("version")
    except (httpx.HTTPError, ValueError):
        pass
    # vLLM's /metrics when the target is vLLM; the gateway's own (no key needed) when it is the
    # gateway, for its side of where a page's time goes
    own = await engine.metrics_of(client, f"{url}/metrics")
    metrics = config.metrics_urls or ([f"{url}/metrics"] if own == "vllm" else [])
    gateway = f"{url}/metrics" if own == "gateway" else None
    facts = {"label": label, "url": url, "model": model, "server_version": version}
    return Target(label, url, key, model), facts | {
        "metrics": ", ".join(metrics) or None,
        "gateway_metrics": gateway,
    }


def _ramp(config: Config, done: list[dict[str, Any]], label: str, concurrency: int) -> float:
    """Seconds to spread the level's starts over: given, or about one request's latency at
    this level (the previous level's mean, scaled by C), at most 30 s."""
    if config.ramp is not None:
        return config.ramp
    previous = done[-1]["targets"].get(label) if done else None
    if not previous or not previous["latency_s"]:
        return 0.0
    scale = max(1.0, concurrency / previous["concurrency"])
    return float(min(30.0, previous["latency_s"]["avg"] * scale))


def _stop_reason(level: dict[str, Any]) -> str:
    top = max(level["errors"].items(), key=lambda item: item[1])
    first = level["first_error"] or {}
    message = str(first.get("message", "")).replace("\n", " ").replace("|", "/")[:120]
    return (
        f"{level['error_rate']:.0%} of {level['requests']} requests failed "
        f"(status {top[0]} x {top[1]}; first: {message})"
    )


def _ratios(entry: dict[str, Any], labels: list[str]) -> dict[str, dict[str, float | None]]:
    first = entry["targets"].get(labels[0])
    ratios: dict[str, dict[str, float | None]] = {}
    for label in labels[1:]:
        other = entry["targets"].get(label)
        if not first or not other:
            continue
        base_p99 = (first["latency_s"] or {}).get("p99")
        p99 = (other["latency_s"] or {}).get("p99")
        ratios[label] = {
            "pages_per_s": other["pages_per_s"] / first["pages_per_s"]
            if first["pages_per_s"]
            else None,
            "p99": p99 / base_p99 if p99 is not None and base_p99 else None,
        }
    return ratios


def _summary(level: dict[str, Any]) -> str:
    latency = level["latency_s"] or {}
    shed = f", 429 {level['rate_limited']}, 503 {level['unavailable']}, failed {level['failed']}"
    return (
        f"{level['ok']}/{level['requests']} ok{shed}, {level['pages_per_s']:.2f} pages/s, "
        f"{level['output_tokens_per_s']:.0f} tokens/s, p50 {latency.get('p50', 0):.3f} s, "
        f"p99 {latency.get('p99', 0):.3f} s ({level['ended_by']})"
    )


async def run(config: Config, pages: list[Page], corpus: str, err: TextIO) -> dict[str, Any]:
    """Run the sweep; the report (not yet written)."""
    timeout = httpx.Timeout(config.timeout, connect=10.0)
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    def connect() -> httpx.AsyncClient:  # one per worker: app/bench/load.py says why
        return httpx.AsyncClient(limits=one, timeout=timeout, trust_env=False)

    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as side:
        described = [
            await _describe(side, config, url, key, label)
            for url, key, label in zip(config.urls, config.keys, config.labels, strict=True)
        ]
        targets = [t for t, _ in described]
        result: dict[str, Any] = {
            "tool": f"ocrvl bench sweep {__version__}",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": config.command,
            "notes": config.notes,
            "settings": _settings(config, corpus),
            "machine": report.machine(),
            "targets": [facts for _, facts in described],
            "levels": [],
            "stopped": None,
        }
        metrics = {
            t.label: (f["metrics"].split(", ") if f["metrics"] else [])
            + ([f["gateway_metrics"]] if f["gateway_metrics"] else [])
            for t, f in described
        }
        for index, concurrency in enumerate(config.levels):
            entry: dict[str, Any] = {"concurrency": concurrency, "order": [], "targets": {}}
            for turn, target in enumerate(targets if index % 2 == 0 else targets[::-1]):
                plan = Plan(concurrency, config.warmup_at(concurrency), config.requests,
                            config.duration, _ramp(config, result["levels"], target.label,
                                                   concurrency))  # fmt: skip
                bar = Progress(err, f"{target.label} c={concurrency}", plan.requests, plan.duration)
                async with engine.watching(
                    side, metrics[target.label], config.metrics_interval
                ) as peaks:
                    level_run = await run_level(
                        connect, target, shape=config.shape, plan=plan, progress=bar.update,
                        pages=draws(pages, seed=index * 16 + turn),
                    )  # fmt: skip
                level = summarize(level_run, concurrency, peaks)
                bar.close(_summary(level))
                entry["order"].append(target.label)
                entry["targets"][target.label] = level
                if level["error_rate"] > config.max_error_rate and not result["stopped"]:
                    result["stopped"] = {
                        "target": target.label,
                        "concurrency": concurrency,
                        "reason": _stop_reason(level),
                    }
            entry["ratios"] = _ratios(entry, config.labels)
            for label, ratio in entry["ratios"].items():
                pages_ratio, p99_ratio = ratio["pages_per_s"], ratio["p99"]
                err.write(
                    f"c={concurrency} {label}/{config.labels[0]}: pages/s "
                    f"{pages_ratio or 0:.3f}x, p99 {p99_ratio or 0:.3f}x\n"
                )
            result["levels"].append(entry)
            if result["stopped"]:
                err.write(f"sweep stopped at c={concurrency}: {result['stopped']['reason']}\n")
                break
        result["load_generator"] = _load_totals(result["levels"])
        result["machine"]["loadavg_at_end"] = os.getloadavg()
        return result


def _settings(config: Config, corpus: str) -> dict[str, Any]:
    return {
        "concurrency": config.levels,
        "requests": config.requests,
        "duration": config.duration,
        "warmup": "concurrency" if config.warmup is None else config.warmup,
        "pages": corpus,
        "resized": config.resized,
        "task": config.shape.task,
        "max_tokens": config.shape.max_tokens,
        "ignore_eos": config.shape.ignore_eos,
        "stream": config.shape.stream,
        "max_error_rate": config.max_error_rate,
        "metrics_interval": config.metrics_interval,
        "ramp": "auto (previous level's mean latency x C ratio, at most 30 s)"
        if config.ramp is None
        else config.ramp,
        "timeout": config.timeout,
    }


def _load_totals(levels: list[dict[str, Any]]) -> dict[str, float | None]:
    runs = [level for entry in levels for level in entry["targets"].values()]
    cpu = sum(level["load_generator"]["cpu_seconds"] for level in runs)
    requests = sum(level["requests"] for level in runs)
    lags = [lag["p99"] for level in runs if (lag := level["load_generator"].get("loop_lag_s"))]
    return {
        "cpu_seconds": cpu,
        "requests": requests,
        "cpu_percent_per_100_rps": cpu / requests * 1e4 if requests else 0.0,
        "loop_lag_p99_max_s": max(lags, default=None),  # the worst level's p99
    }


def main(config: Config, err: TextIO = sys.stderr) -> dict[str, Any]:
    """Generate or load the pages, run the sweep, write the files; the report."""
    if config.plot:
        from app.bench.plot import plot, require  # noqa: PLC0415 (matplotlib: the bench extra)

        require()
    pages, corpus = load_pages(config)
    err.write(f"{corpus}\n")
    result = _runner()(run(config, pages, corpus, err))
    written = []
    if config.plot:
        png = config.out / f"{config.name}.png"
        config.out.mkdir(parents=True, exist_ok=True)
        plot(result, png)
        result["plot"] = png.name
        written.append(png)
    written = [*report.write(result, config.out, config.name), *written]
    err.write(f"wrote {', '.join(map(str, written))}\n")
    return result


def _runner() -> Callable[[Coroutine[Any, Any, dict[str, Any]]], dict[str, Any]]:
    """uvloop's run where installed (uvicorn[standard] brings it), asyncio's otherwise."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return asyncio.run
    return uvloop.run
