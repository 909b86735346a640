"""A pass's report from what bench/gpu/pass.sh left in its results folder, against its floor.

    python3 -m bench.gpu.pass_report report RESULTS --out DIR --stem NAME [--pair stock,plugin]
        [--default default]
    python3 -m bench.gpu.pass_report rate RESULTS --layouts stock,plugin [--fraction 0.8]

`report` reads every steady window (`NN-LAYOUT-cC.json`, `NN-LAYOUT-rRATE.json`, NN the order
they ran in), the floor's lines (`floor/floor-MODE.json`), the greedy-token comparison, the
encoder check and the py-spy tails, and writes NAME.md and NAME.json: every window with both
pages/s, p50/p99, vLLM's own count and GPU busy, as a fraction of each floor line; then the
targets of issue 37 (plugin one engine >= 1.3x stock one engine by C / mean latency at the same
C, each layout's windows averaged: A B B A; the default >= 90 % of the fused floor, p99 at its
knee), issue 36's (the layout service's forward ms per page <= 10 % of a page's GPU time) and
where the time went (py-spy, per loaded EngineCore, a stack counted once per sample). `rate`
prints the open loop's common rate: `fraction` of the slowest of those layouts' closed-loop
pages/s by Little's law, so every layout is offered the same arrivals.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

RUN = re.compile(r"^(\d+)-(.+)-(c\d+|r[\d.]+)\.json$")
ENCODER = re.compile(r"_process_image_input|embed_multimodal|get_multimodal_embeddings|"
                     r"encode_image|vision_model|Siglip|packed", re.IGNORECASE)  # fmt: skip
MODES = ("unfused", "fused", "none")  # bench/gpu/floor_model.py's ROTARY, without torch
TICKS = 1000  # bench/gpu/watch.sh: 5 s of py-spy at 200 Hz per file
TARGETS = {
    "plugin_over_stock": 1.3,
    "default_over_fused_floor": 0.9,
    "layout_of_page_gpu_time": 0.1,
}  # the last one at most


def runs(results: Path) -> list[dict[str, Any]]:
    """Every steady window in the order it ran, with its layout and load."""
    found = []
    for path in sorted(results.glob("*.json")):
        match = RUN.match(path.name)
        if match:
            report = json.loads(path.read_text())
            found.append(report | {"order": int(match[1]), "layout": match[2], "load": match[3]})
    return sorted(found, key=lambda run: run["order"])


def floors(results: Path) -> dict[str, dict[str, Any]]:
    """The floor's lines by rotary mode: unfused (the first line), fused, none."""
    found = {path.stem.removeprefix("floor-"): json.loads(path.read_text())
             for path in (results / "floor").glob("floor-*.json")}  # fmt: skip
    return {mode: found[mode] for mode in sorted(found, key=lambda m: (*MODES, m).index(m))}


def best(run: dict[str, Any]) -> float:
    """A closed window's pages/s by C / mean latency (Little's law), else by Little's law."""
    f = run["figures"]
    return float(f.get("pages_per_s_c_over_latency") or f["pages_per_s_little"])


def common_rate(results: Path, layouts: list[str], fraction: float) -> float:
    """`fraction` of the slowest closed-loop pages/s (Little) among `layouts`."""
    closed = [best(r) for r in runs(results) if r["layout"] in layouts and r["loop"] == "closed"]
    if not closed:
        raise SystemExit(f"no closed-loop window of {layouts} in {results}")
    return round(fraction * min(closed), 2)


MAIN = "run_busy_loop"  # the EngineCore's own thread (vllm/v1/engine/core.py); not its helpers
SCHEDULE = re.compile(r"Scheduler\.schedule|update_from_output")


def stack_counts(path: Path) -> dict[str, int]:
    """One py-spy raw file counted once per sample (a stack's count once, however many of its
    frames match): every sample, the main loop's, and of those the encoder's and the scheduler's."""
    counts = dict.fromkeys(("samples", "main", "encoder", "schedule"), 0)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        counts["samples"] += int(count)
        if MAIN in stack:
            counts["main"] += int(count)
            counts["encoder"] += int(count) * bool(ENCODER.search(stack))
            counts["schedule"] += int(count) * bool(SCHEDULE.search(stack))
    return counts


def spy(results: Path, run: dict[str, Any]) -> dict[str, Any] | None:
    """The loaded EngineCores' main-loop busy, encoder and scheduler shares of the time in the
    run's py-spy tail: per engine (an EngineCore whose file has no main-loop sample, an idle
    engine beside the measured one, is left out and counted), then their mean."""
    folder = results / f"spy-{run['order']:02d}-{run['layout']}-{run['load']}"
    threads = " ".join(path.read_text() for path in folder.glob("threads-*.txt"))

    def engine_core(path: Path) -> bool:  # watch.sh names a file spy-STAMP-PID.txt
        pid = path.stem.rsplit("-", 1)[-1]
        return re.search(rf"^\s*{pid}\s.*EngineCore", threads, re.MULTILINE) is not None

    cores = {path.stem.rsplit("-", 1)[-1]: stack_counts(path)
             for path in sorted(folder.glob("spy-*.txt")) if engine_core(path)}  # fmt: skip
    loaded = {pid: c for pid, c in cores.items() if c["main"]}
    if not loaded:
        return None
    engines = {pid: {"busy_of_time": c["main"] / TICKS, "encoder_of_time": c["encoder"] / TICKS,
                     "encoder_of_busy": c["encoder"] / c["main"],
                     "schedule_of_busy": c["schedule"] / c["main"]}
               for pid, c in loaded.items()}  # fmt: skip
    mean = {
        key: sum(e[key] for e in engines.values()) / len(engines)
        for key in ("busy_of_time", "encoder_of_time", "encoder_of_busy", "schedule_of_busy")
    }
    return {"files": len(loaded), "idle_files": len(cores) - len(loaded), **mean,
            "engines": engines}  # fmt: skip


def row(run: dict[str, Any], lines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One window's line of the report."""
    f, engine, gpu = run["figures"], run.get("engine") or {}, run.get("gpu") or {}
    busy = [g["busy_mean_pct"] for g in gpu.values()]
    per_s = best(run)
    chat = not run["layout"].startswith("layout")  # the layout service's windows: no VLM floor
    return {
        "order": run["order"], "layout": run["layout"], "load": run["load"], "loop": run["loop"],
        "window_s": f["seconds"], "latencies_held": f["latencies_held"], "steady": f["steady"],
        "answered": f["answered"], "statuses": f["statuses"],
        "pages_per_s_count": f["pages_per_s_count"], "pages_per_s_little": f["pages_per_s_little"],
        "pages_per_s_c_over_latency": f["pages_per_s_c_over_latency"],
        "p50_s": (f["latency_s"] or {}).get("p50"), "p99_s": (f["latency_s"] or {}).get("p99"),
        "vllm_finished_per_s": engine.get("finished_per_s"),
        "gpu_busy_pct": sum(busy) / len(busy) if busy else None,
        "x_floor": {m: per_s / line["floor_pages_per_s"] for m, line in lines.items() if chat},
        "layout_service": run.get("layout_service"),
    }  # fmt: skip


def targets(rows: list[dict[str, Any]], lines: dict[str, Any], pair: list[str], default: str
            ) -> dict[str, Any]:  # fmt: skip
    """Issue 37's targets, each with the figures it was decided on."""
    closed = [r for r in rows if r["loop"] == "closed"]
    by = {name: [r for r in closed if r["layout"] == name] for name in [*pair, default]}
    out: dict[str, Any] = {}
    stock, plugin = by.get(pair[0]), by.get(pair[1])
    same = sorted({r["load"] for r in stock or []} & {r["load"] for r in plugin or []})
    if same:  # A B B A: each layout's windows at that C, averaged (drift cancels)
        load = same[-1]
        a = [r for r in stock or [] if r["load"] == load and r["steady"]] or [
            r for r in stock or [] if r["load"] == load
        ]
        b = [r for r in plugin or [] if r["load"] == load and r["steady"]] or [
            r for r in plugin or [] if r["load"] == load
        ]
        mean_a = sum(r["pages_per_s_c_over_latency"] for r in a) / len(a)
        mean_b = sum(r["pages_per_s_c_over_latency"] for r in b) / len(b)
        ratio = mean_b / mean_a
        out["plugin_over_stock"] = {"at": load, "ratio": ratio,
                                    "met": ratio >= TARGETS["plugin_over_stock"],
                                    "stock_windows": [r["order"] for r in a],
                                    "plugin_windows": [r["order"] for r in b],
                                    "stock_pages_per_s": mean_a, "plugin_pages_per_s": mean_b,
                                    "steady": all(r["steady"] for r in a + b)}  # fmt: skip
    if by.get(default) and "fused" in lines:
        rows_d = by[default]
        top = max(r["pages_per_s_c_over_latency"] for r in rows_d)
        knee = min((r for r in rows_d if r["pages_per_s_c_over_latency"] >= 0.9 * top),
                   key=lambda r: int(r["load"][1:]))  # fmt: skip
        share = top / lines["fused"]["floor_pages_per_s"]
        out["default_over_fused_floor"] = {
            "pages_per_s": top, "fused_floor_pages_per_s": lines["fused"]["floor_pages_per_s"],
            "ratio": share, "met": share >= TARGETS["default_over_fused_floor"],
            "knee": knee["load"], "p99_at_knee_s": knee["p99_s"], "p50_at_knee_s": knee["p50_s"],
        }  # fmt: skip
    out |= layout_share(rows, lines)
    return out


def layout_share(rows: list[dict[str, Any]], lines: dict[str, Any]) -> dict[str, Any]:
    """Issue 36: the layout service's forward ms per page (its own /metrics, the batches it
    formed under a window's load) as a share of a page's GPU time, that plus the fused floor's
    ms per page; the lowest-share window of each layout-service layout."""
    if "fused" not in lines:
        return {}
    floor_ms = lines["fused"]["floor_ms_per_page"]
    found: dict[str, Any] = {}
    for r in rows:
        ms = (r["layout_service"] or {}).get("forward_ms_per_page")
        if ms is None or not r["steady"]:
            continue
        share = ms / (ms + floor_ms)
        best_so_far = found.get(r["layout"])
        if best_so_far is None or share < best_so_far["ratio"]:
            found[r["layout"]] = {"window": r["order"], "layout_ms_per_page": ms,
                                  "fused_floor_ms_per_page": floor_ms, "ratio": share,
                                  "mean_batch": r["layout_service"].get("mean_batch"),
                                  "met": share <= TARGETS["layout_of_page_gpu_time"]}  # fmt: skip
    return {f"layout_of_page_gpu_time ({name})": t for name, t in found.items()}


def floor_lines(lines: dict[str, dict[str, Any]]) -> list[str]:
    """The floor's lines as a table: stages per page and pages/s, per rotary mode."""
    table = ["| rotary | kernel | encoder ms | prefill ms | decode ms | floor ms | pages/s |",
             "|---|---|--:|--:|--:|--:|--:|"]  # fmt: skip
    for mode, line in lines.items():
        table.append(
            f"| {mode} | {line.get('rotary_kernel', '')} | {line['encoder']['ms_per_page']:.2f} | "
            f"{line['prefill_ms_per_page']:.2f} | {line['decode']['ms_per_page']:.2f} | "
            f"{line['floor_ms_per_page']:.2f} | {line['floor_pages_per_s']:.1f} |"
        )
    check = (lines.get("fused") or {}).get("rotary_check")
    if check:
        table.append(f"\nThe fused kernel against the arithmetic: {json.dumps(check)}.")
    return table


def window_lines(rows: list[dict[str, Any]], modes: list[str]) -> list[str]:
    """Every window as a table row."""
    head = ["#", "layout", "load", "window s", "latencies", "steady", "answered",
            "pages/s count", "pages/s Little", "C / mean latency", "p50 s", "p99 s",
            "vLLM finished/s", "GPU busy %", *[f"x {m} floor" for m in modes],
            "statuses"]  # fmt: skip

    def num(value: float | None, digits: int = 2) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["order"]), r["layout"], r["load"], num(r["window_s"], 0),
                 num(r["latencies_held"], 1), "yes" if r["steady"] else "**no**",
                 str(r["answered"]), num(r["pages_per_s_count"]), num(r["pages_per_s_little"]),
                 num(r["pages_per_s_c_over_latency"]), num(r["p50_s"]), num(r["p99_s"]),
                 num(r["vllm_finished_per_s"]), num(r["gpu_busy_pct"], 0),
                 *[f"{r['x_floor'][m]:.0%}" if m in r["x_floor"] else "" for m in modes],
                 json.dumps(r["statuses"])]  # fmt: skip
        table.append("| " + " | ".join(cells) + " |")
    return table


def markdown(report: dict[str, Any]) -> str:
    """The report for reading."""
    modes = list(report["floor"])
    parts = [f"# {report['stem']}", "", "## The floor (same host, measured in this pass)", "",
             *floor_lines(report["floor"]), "", "## Steady windows, in the order they ran", "",
             *window_lines(report["rows"], modes), "",
             "## Targets (issues 37 and 36)", ""]  # fmt: skip
    for name, target in report["targets"].items():
        limit = TARGETS[name.split(" ")[0]]
        parts.append(f"- **{name}** (target {limit}): {json.dumps(target)}")
    if not report["targets"]:
        parts.append("- not decided: the windows they need are missing")
    layout = [r for r in report["rows"] if r["layout_service"]]
    if layout:
        parts += ["", "## The layout service's own account of its windows", ""]
        parts += [f"- window {r['order']}: {json.dumps(r['layout_service'])}" for r in layout]
    parts += ["", "## Where the time went (py-spy tails past the windows)", ""]
    for order, found in report["spy"].items():
        parts.append(f"- window {order}: {json.dumps(found)}")
    for key in ("same_tokens", "encoder_check"):
        if report.get(key) is not None:
            parts += ["", f"## {key.replace('_', ' ')}", "", f"`{json.dumps(report[key])[:600]}`"]
    return "\n".join(parts) + "\n"


def summary_of(path: Path) -> dict[str, Any] | None:
    """A JSON file's top-level scalars (its rows left out), or None when it is missing."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not isinstance(v, list | dict)} | {"file": path.name}


def report(results: Path, out: Path, stem: str, pair: list[str], default: str) -> int:
    """Write STEM.md and STEM.json into `out`."""
    lines = floors(results)
    found = runs(results)
    rows = [row(run, lines) for run in found]
    whole = {
        "stem": stem,
        "floor": lines,
        "rows": rows,
        "targets": targets(rows, lines, pair, default),
        "spy": {run["order"]: s for run in found if (s := spy(results, run))},
        "same_tokens": summary_of(results / "same-tokens.json"),
        "encoder_check": summary_of(results / "encoder-check.json"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(whole, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(whole))
    print(markdown(whole))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.pass_report")
    parser.add_argument("action", choices=("report", "rate"))
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--stem", default="pass")
    parser.add_argument("--pair", default="stock,plugin")
    parser.add_argument("--default", default="default")
    parser.add_argument("--layouts", default="stock,plugin")
    parser.add_argument("--fraction", type=float, default=0.8)
    args = parser.parse_args(argv)
    if args.action == "rate":
        print(common_rate(args.results, args.layouts.split(","), args.fraction))
        return 0
    return report(args.results, args.out or args.results, args.stem, args.pair.split(","),
                  args.default)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
