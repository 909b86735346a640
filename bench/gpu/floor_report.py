"""bench.gpu.floor's report: its own table, and layouts' pages/s as a fraction of the floor.

Apart from floor.py so that merging layouts (bench.gpu.layouts merge) needs no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def table(report: dict[str, Any]) -> str:
    """The report as a few lines of markdown."""
    page, enc, dec = report["page"], report["encoder"], report["decode"]
    rows = [f"| vision encoder, {row['pages']} page(s) per call | {row['ms_per_page']:.2f} |"
            for row in enc["per_batch"]]  # fmt: skip
    return "\n".join([
        f"Floor of one page ({page['visual_tokens']:,} visual tokens, {page['patches']:,} "
        f"patches, {page['prompt_tokens']:,} prompt tokens, {page['output_tokens']} output "
        f"tokens) on {report['machine'].get('gpu', report['machine']['device'])}, "
        f"{report['dtype']}, {report['attention']}, CUDA graphs {report['cuda_graphs']}, "
        f"rotary {report.get('rotary', 'unfused')} ({report.get('rotary_kernel', 'eager')}):",
        "", "| stage | ms per page |", "|---|--:|", *rows,
        f"| LM prefill | {report['prefill_ms_per_page']:.2f} |",
        f"| one decode step of {dec['batch']} sequences at context {dec['context']:,}: "
        f"{dec['step_ms']:.2f} ms, x {page['output_tokens']} / {dec['batch']} "
        f"| {dec['ms_per_page']:.2f} |",
        f"| **floor** (encoder at its best batch, {enc['tflop_per_page']:.2f} TFLOP at "
        f"{enc['tflop_per_s']:.0f} TFLOP/s) | **{report['floor_ms_per_page']:.2f}** "
        f"= {report['floor_pages_per_s']:.1f} pages/s |",
        *kernel_lines(report.get("kernels_ms", [])),
    ])  # fmt: skip


def kernel_lines(stages: list[dict[str, Any]]) -> list[str]:
    """Each stage's ms under every SDPA kernel timed (a GPU run), the best taken above."""
    if not stages:
        return []
    names = list(stages[0])
    lines = ["", "| stage (encoder batches, prefill, decode) | " + " | ".join(names) + " |",
             "|---|" + "--:|" * len(names)]  # fmt: skip
    for number, times in enumerate(stages):
        cells = (f"{ms:.2f}" if isinstance(ms, float) else "refused" for ms in times.values())
        lines.append(f"| {number + 1} | " + " | ".join(cells) + " |")
    return lines


def attach(merged: dict[str, Any], path: Path) -> None:
    """Into a merged layouts report (bench.gpu.layouts merge): the floor measured beside the
    layouts (`path`, floor.json of the same call) and each layout's pages/s as a fraction of it."""
    if not path.exists():
        return
    found = json.loads(path.read_text())
    keys = ("date", "page", "machine", "cuda_graphs", "attention", "dtype", "encoder",
            "prefill_ms_per_page", "decode", "floor_ms_per_page", "floor_pages_per_s",
            "kernels_ms")  # fmt: skip
    merged["floor"] = {key: found[key] for key in keys if key in found}
    per_s = found["floor_pages_per_s"]
    for row in merged["layouts"]:
        hey = row.get("hey") or {}
        row["peak_x_floor"] = row["peak_pages_per_s"] / per_s
        row["hey_x_floor"] = hey["pages_per_s"] / per_s if hey else None


def against_table(merged: dict[str, Any]) -> str:
    """Each layout against the floor and the first layout: pages/s, the knee's p50/p99, GPU busy."""
    from app.bench.report import table as markdown  # noqa: PLC0415

    rows = merged["layouts"]
    first = rows[0]
    body = []
    for r in rows:
        hey, gpu = r.get("hey") or {}, r.get("gpu") or {}
        hey_gpu = hey.get("gpu") or {}
        best = hey.get("pages_per_s") or r["peak_pages_per_s"]
        base = (first.get("hey") or {}).get("pages_per_s") or first["peak_pages_per_s"]
        knee = [r.get("p50_at_knee_s"), r.get("p99_at_knee_s")]
        body.append([
            r["layout"], str(r["engines"]), f"{r['peak_pages_per_s']:.2f}",
            f"{r['peak_x_floor']:.0%}", f"{hey['pages_per_s']:.2f}" if hey else "",
            f"{r['hey_x_floor']:.0%}" if hey else "", f"{best / base:.2f}" if base else "",
            str(r["knee_concurrency"]), "/".join(f"{v:.2f}" if v else "" for v in knee),
            f"{gpu.get('utilization_avg_pct', 0):.0f}",
            f"{hey_gpu.get('utilization_avg_pct', 0):.0f}" if hey_gpu else "",
        ])  # fmt: skip
    header = ["layout", "engines", "sweep peak pages/s", "x floor", "hey pages/s", "hey x floor",
              "x first (hey, else sweep)", "knee c", "p50/p99 at knee s",
              "GPU busy % (sweep)", "GPU busy % (hey)"]  # fmt: skip
    floor = merged["floor"]
    return (
        f"Against the floor measured in the same call ({floor['floor_ms_per_page']:.1f} ms per "
        f"page = {floor['floor_pages_per_s']:.1f} pages/s, bench.gpu.floor):\n\n"
        + markdown(header, body)
        + "\n\n"
        + table(floor)
    )
