"""sweep.png: pages/s (solid, left axis) and p99 latency (dashed, right axis) per target."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def require() -> None:
    """Fail before the sweep runs when matplotlib (the `bench` extra) is missing."""
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError as exc:
        raise RuntimeError(
            "the plot needs matplotlib: pip install 'paddleocr-vl-server[bench]' "
            "(or pass --no-plot)"
        ) from exc


def plot(report: dict[str, Any], path: Path) -> None:
    """One figure, concurrency on a log2 axis, one colour per target."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: PLC0415

    figure, pages_axis = plt.subplots(figsize=(8, 4.8), dpi=120)
    p99_axis = pages_axis.twinx()
    for index, target in enumerate(report["targets"]):
        label, colour = target["label"], f"C{index}"
        levels = [e["targets"][label] for e in report["levels"] if label in e["targets"]]
        xs = [level["concurrency"] for level in levels]
        pages = [level["pages_per_s"] for level in levels]
        p99 = [(level["latency_s"] or {}).get("p99", float("nan")) for level in levels]
        pages_axis.plot(xs, pages, "-o", color=colour, label=f"{label} pages/s")
        p99_axis.plot(xs, p99, "--s", color=colour, alpha=0.7, label=f"{label} p99")
    pages_axis.set_xscale("log", base=2)
    pages_axis.set_xticks(sorted({e["concurrency"] for e in report["levels"]}))
    pages_axis.xaxis.set_major_formatter(ScalarFormatter())
    pages_axis.xaxis.set_minor_formatter(NullFormatter())
    pages_axis.set_xlabel("concurrency (requests in flight)")
    pages_axis.set_ylabel("pages/s (solid)")
    p99_axis.set_ylabel("p99 latency, s (dashed)")
    pages_axis.set_ylim(bottom=0)
    p99_axis.set_ylim(bottom=0)
    pages_axis.grid(alpha=0.3)
    handles = [*pages_axis.get_legend_handles_labels()[0], *p99_axis.get_legend_handles_labels()[0]]
    pages_axis.legend(handles=handles, loc="upper left", fontsize="small")
    pages_axis.set_title(f"ocrvl bench sweep, {report['date'][:16]}")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
