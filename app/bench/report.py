"""The sweep's files: sweep.json (everything), sweep.md (the tables) and the machine's facts."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson

COLUMNS = (
    "target", "c", "requests", "ok", "429", "503", "failed", "pages/s", "C/avg pages/s",
    "tokens/s",
    "avg s", "p50 s", "p90 s", "p99 s", "max s", "TTFT p50 s", "TTFT p99 s",
    "running max", "waiting max", "KV max %", "stopped (OOM)",
)  # fmt: skip


def machine() -> dict[str, Any]:
    """Where the load generator ran: CPU, cores, memory, OS, Python and any NVIDIA GPUs."""
    facts: dict[str, Any] = {
        "hostname": platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "loadavg": os.getloadavg(),
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "--query-gpu=name,memory.total,driver_version,uuid"
        result = subprocess.run(  # noqa: S603 (a fixed query of the nvidia-smi on PATH)
            [smi, query, "--format=csv,noheader"], capture_output=True, text=True, check=False
        )
        facts["gpus"] = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _f(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def row(label: str, level: dict[str, Any], stopped: str = "") -> list[str]:
    """One markdown row of a target at a level (the same rounding the tests hold it to)."""
    latency = level["latency_s"] or {}
    ttft = level["ttft_s"] or {}
    engine = level["engine"] or {}
    kv = engine.get("kv_usage_max")
    return [
        label,
        str(level["concurrency"]),
        str(level["requests"]),
        str(level["ok"]),
        str(level["rate_limited"]),
        str(level["unavailable"]),
        str(level["failed"]),
        _f(level["pages_per_s"], 2),
        _f(level["closed_loop_pages_per_s"], 2),
        _f(level["output_tokens_per_s"], 1),
        *(_f(latency.get(k), 3) for k in ("avg", "p50", "p90", "p99", "max")),
        _f(ttft.get("p50"), 3),
        _f(ttft.get("p99"), 3),
        _f(engine.get("running_max"), 0),
        _f(engine.get("waiting_max"), 0),
        _f(None if kv is None else kv * 100, 1),
        stopped,
    ]


def table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> str:
    """A markdown table, text columns left-aligned and numbers right-aligned."""
    align = ["---" if h in ("target", "stopped (OOM)") else "--:" for h in header]
    lines = [f"| {' | '.join(header)} |", f"|{'|'.join(align)}|"]
    return "\n".join([*lines, *(f"| {' | '.join(cells)} |" for cells in rows)])


def stopped_note(report: dict[str, Any], label: str, concurrency: int) -> str:
    """The OOM column: why the sweep stopped at this target's level, if it did."""
    stop = report.get("stopped")
    if stop and stop["target"] == label and stop["concurrency"] == concurrency:
        return f"**stopped**: {stop['reason']}"
    return ""


def results_table(report: dict[str, Any]) -> str:
    """Every target at every level, in the order they ran."""
    rows = [
        row(label, level, stopped_note(report, label, level["concurrency"]))
        for entry in report["levels"]
        for label, level in entry["targets"].items()
    ]
    return table(COLUMNS, rows)


def ratios_table(report: dict[str, Any]) -> str:
    """Each compared target against the first, level by level."""
    labels = [t["label"] for t in report["targets"]]
    first, others = labels[0], labels[1:]
    header = ["c"]
    for other in others:
        header += [f"{other}/{first} pages/s", f"{other}/{first} p99"]
    rows = []
    for entry in report["levels"]:
        if not entry.get("ratios"):
            continue  # a level only some targets ran (merged layout reports)
        cells = [str(entry["concurrency"])]
        for other in others:
            ratio = entry["ratios"].get(other, {})
            cells += [_f(ratio.get("pages_per_s"), 3), _f(ratio.get("p99"), 3)]
        rows.append(cells)
    return table(header, rows)


PHASE_COLUMNS = (
    "target", "c", "client s", "gateway s", "gateway queue s", "gateway to vLLM and back s",
    "vLLM s", "render and hand-off s", "engine queue s", "prefill s", "decode s",
)  # fmt: skip
PHASES_NOTE = (
    "Where a page's time goes: mean seconds per page over the window, from the change of each "
    "histogram's sum over its count (`ocrvl_request_duration_seconds`, "
    "`ocrvl_queue_wait_seconds`, vLLM's `e2e_request_latency`, `request_queue_time`, "
    "`request_prefill_time`, `request_decode_time`). vLLM's time starts when its API server "
    "begins rendering the request (chat template, image decode, the image processor); "
    "*render and hand-off* is that time less the engine's queue, prefill and decode; *gateway "
    "to vLLM and back* is the gateway's time less its queue and vLLM's (both HTTP legs, the API "
    "server's parsing before it renders, the gateway's own work). Each mean is over the "
    "requests its histogram counted in the window, so the columns are close, not exact, parts "
    "of one another."
)


def _phases_row(label: str, level: dict[str, Any]) -> list[str] | None:
    means = (level.get("phases") or {}).get("mean_s")
    if not means:
        return None
    get = means.get
    engine = [get(k) for k in ("engine_queue", "prefill", "decode")]
    render = None
    if get("vllm") is not None and None not in engine:
        render = get("vllm") - sum(v for v in engine if v is not None)
    outside = None
    if None not in (get("gateway"), get("vllm")):
        outside = get("gateway") - (get("gateway_queue") or 0.0) - get("vllm")
    return [
        label, str(level["concurrency"]), _f((level["latency_s"] or {}).get("avg"), 3),
        _f(get("gateway"), 3), _f(get("gateway_queue"), 3), _f(outside, 3), _f(get("vllm"), 3),
        _f(render, 3), *(_f(v, 3) for v in engine),
    ]  # fmt: skip


def phases_table(report: dict[str, Any]) -> str:
    """Per target and level, where a page's time went; empty when nothing was sampled."""
    rows = [
        cells
        for entry in report["levels"]
        for label, level in entry["targets"].items()
        if (cells := _phases_row(label, level))
    ]
    return table(PHASE_COLUMNS, rows) if rows else ""


def markdown(report: dict[str, Any]) -> str:
    """sweep.md: what ran, where, the table, the ratios and the plot."""
    settings, m = report["settings"], report["machine"]
    targets = "\n".join(
        f"- **{t['label']}**: {t['url']} (model `{t['model']}`"
        + (f", server {t['server_version']}" if t.get("server_version") else "")
        + f"; engine metrics: {t['metrics'] or 'none'})"
        for t in report["targets"]
    )
    gpus = "; ".join(m.get("gpus", [])) or "none"
    load = report["load_generator"]
    parts = [
        f"# Concurrency sweep, {report['date']}\n",
        f"`{report['command']}`\n",
        *([report["notes"] + "\n"] if report.get("notes") else []),
        targets + "\n",
        f"- Pages: {settings['pages']}; task `{settings['task']}`, max_tokens "
        f"{settings['max_tokens']}, ignore_eos {settings['ignore_eos']}, stream "
        f"{settings['stream']}; per level: warm-up {settings['warmup']} requests, then "
        + (
            f"{settings['requests']} requests"
            if settings["requests"]
            else f"{settings['duration']} s"
        )
        + f"; early stop above {settings['max_error_rate']:.0%} errors.",
        f"- Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, {m['os']}, Python "
        f"{m['python']}; GPUs: {gpus}.",
        f"- Load generator: {load['cpu_percent_per_100_rps']:.1f} % of one core per 100 "
        f"requests/s ({load['cpu_seconds']:.2f} CPU s for {load['requests']} requests)"
        + (
            f"; its event loop ran up to {lag * 1000:.0f} ms late (p99 of the worst level)"
            if (lag := load.get("loop_lag_p99_max_s")) is not None
            else ""
        )
        + ".\n",
        results_table(report) + "\n",
    ]
    phases = phases_table(report)
    if phases:
        parts += [PHASES_NOTE + "\n", phases + "\n"]
    if len(report["targets"]) > 1:
        how = "interleaved level by level" if report.get("interleaved", True) else "runs in turn"
        parts += [f"Ratios to the first target ({how}):\n", ratios_table(report) + "\n"]
    if report.get("plot"):
        parts.append(f"![pages/s and p99 against concurrency]({report['plot']})\n")
    return "\n".join(parts)


def write(report: dict[str, Any], out: Path, name: str) -> tuple[Path, Path]:
    """Write `out/name.json` and `out/name.md`; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    as_json, as_md = out / f"{name}.json", out / f"{name}.md"
    as_json.write_text(json.dumps(report, indent=1) + "\n")
    as_md.write_text(markdown(report))
    return as_json, as_md


def keep(stem: Path, raw: dict[str, Any], text: str) -> None:
    """A benchmark's result files: `stem`.json (the raw result, indented) and `stem`.md (`text`),
    their folder made if need be."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_bytes(orjson.dumps(raw, option=orjson.OPT_INDENT_2))
    stem.with_suffix(".md").write_text(text)
