"""bench.metering's figures: cells combined over repetitions, the verdict, the tables."""

from __future__ import annotations

import statistics
from typing import Any

VARIANTS = ("off", "on", "budget", "control")  # control: a second "off", the noise floor
TARGET = 1.05  # "on" may cost at most 5 % more gateway CPU per request than "off"


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the cells: medians over the batches of gateway CPU per request."""
    lines = [
        "| mode | c | requests | CPU µs/req off | on | budget | control | on/off | budget/off "
        "| control/off | p50 ms off | on |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cpu, p50 = row["median_batch_cpu_us"], row["p50_ms"]
        lines.append(
            f"| {row['mode']} | {row['concurrency']} | {row['requests']} "
            f"| {cpu['off']:.0f} | {cpu['on']:.0f} | {cpu['budget']:.0f} | {cpu['control']:.0f} "
            f"| {row['on_over_off']:.3f} | {row['budget_over_off']:.3f} "
            f"| {row['control_over_off']:.3f} | {p50['off']:.2f} | {p50['on']:.2f} |"
        )
    return "\n".join(lines)


def combined(repetitions: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each cell's medians over the repetitions (a single run: itself)."""
    rows = []
    for cells in zip(*repetitions, strict=True):
        row = dict(cells[0])
        row["requests"] = sum(cell["requests"] for cell in cells)
        for name in ("median_batch_cpu_us", "p50_ms"):
            row[name] = {v: statistics.median(c[name][v] for c in cells) for v in VARIANTS}
        for name in ("on_over_off", "budget_over_off", "control_over_off"):
            row[name] = statistics.median(cell[name] for cell in cells)
        rows.append(row)
    return rows


def verdict(rows: list[dict[str, Any]], path: dict[str, float]) -> dict[str, Any]:
    """The figures the target is judged on: the on/off ratios over the cells (their geometric
    mean, the worst), the control's spread (the noise floor), the code path's share."""
    ratios = [row["on_over_off"] for row in rows]
    pooled = statistics.geometric_mean(ratios)
    noise = max(abs(row["control_over_off"] - 1) for row in rows)
    shares = {}
    for row in rows:
        mode = "json" if row["mode"] == "json" else "stream"
        share = path[mode] / row["median_batch_cpu_us"]["off"]
        shares[f"{row['mode']} c={row['concurrency']}"] = share
    return {
        "pooled_on_over_off": pooled, "worst_on_over_off": max(ratios), "noise_floor": noise,
        "code_path_share": shares, "target": TARGET,
        "met": pooled <= TARGET and max(shares.values()) <= TARGET - 1,
    }  # fmt: skip


def summarized(report: dict[str, Any]) -> str:
    """The verdict in a few lines."""
    path, shares = report["code_path_us"], report["code_path_share"]
    return (
        f"on/off over the cells: geometric mean {report['pooled_on_over_off']:.3f}, worst "
        f"{report['worst_on_over_off']:.3f}; two identical gateways (control/off) differ by up "
        f"to {report['noise_floor']:.1%} in the same run.\n\nThe metering code alone: "
        f"{path['json']:.1f} µs per json request, {path['stream']:.1f} µs per stream, "
        f"{path['flush_per_batch']:.0f} µs per store flush (one a second): at most "
        f"{max(shares.values()):.1%} of the gateway's CPU per request.\n\n"
        f"Target (on <= {report['target']} x off): {'met' if report['met'] else 'NOT met'}."
    )
