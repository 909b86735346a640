"""A method-2 pass's report from its results folder: STEM.json (issue 50's summary) and STEM.md.

    python3 -m bench.gpu.report PLAN.json RES OUT

From what `bench.gpu.run` wrote to RES: each window's NN-VARIANT.json (and .cpu.json), the
layout service alone's alone-NN-SETTING.json (its first setting's median is the summary's
`layout_service_alone_pages_per_s`; its /metrics give `gpu_memory_mib`), floor-whole.json for
`default` (layout off) and floor-blocks.json for `layout`, vit-attention*.json. Without a
layout-alone window, the plan's `alone_pass` (an earlier STEM.json) gives those figures,
its raw tarball named in `layout_service_alone_from`. Not measured: `null` (strict JSON).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.gpu import method

FLOORS = {"off": "floor-whole.json", "on": "floor-blocks.json"}
ROOT = Path(__file__).resolve().parents[2]


def gather(plan: dict[str, Any], res: Path) -> dict[str, Any]:
    """The summary's parts and the per-variant figures the markdown states."""
    floors = {k: json.loads((res / name).read_text()) for k, name in FLOORS.items()
              if (res / name).exists()}  # fmt: skip
    nan = float("nan")
    variants, figures = [], {}
    for v in plan["variants"]:
        names = sorted(res.glob(f"[0-9][0-9]-{v['name']}.json"))  # not 03-fused-{name}.json
        windows = [json.loads(path.read_text()) for path in names]
        engine_reads = [w.get("engine_reads") for w in windows]  # the window stage's check
        floor_ms = floors.get(v["layout"], {}).get("ms_per_page", nan)
        variants.append({"name": v["name"], "stack": v["stack"], "concurrency": v["concurrency"],
                         "floor_ms_per_page": floor_ms, "windows": windows})  # fmt: skip
        if windows:
            figure = method.median(windows)
            figure["of_floor"] = method.of_floor(figure["pages_per_s_by_count"], floor_ms)
            # every answer 200, the engines' work: none an error, none the results cache's
            figure["all_200"] = all(set(w.get("statuses", {})) <= {"200"} for w in windows)
            # and the engines' own counters say they read them (None: a pass without them)
            figure["engines_read"] = (None if None in engine_reads else
                                      not any(r["fault"] for r in engine_reads))  # fmt: skip
            figure["cpu"] = [json.loads(f.read_text()) for f in (  # `window`'s NN-VARIANT.cpu.json
                path.with_suffix(".cpu.json") for path in names) if f.exists()]  # fmt: skip
            figures[v["name"]] = figure
        variants[-1]["engine_reads"] = engine_reads
    settings = plan["alone"]["services"]
    by_setting = {name: sorted(res.glob(f"alone-[0-9][0-9]-{name}.json")) for name in settings}
    alone = {name: method.median([json.loads(f.read_text()) for f in files])
             | {"flags": settings[name]} | memory(files)
             for name, files in by_setting.items() if files}  # fmt: skip
    earlier = None
    if not alone and plan.get("alone_pass"):
        earlier = json.loads((ROOT / plan["alone_pass"]).read_text())
        alone = earlier["layout_service_alone_by_setting"]
    alone_figure = next(iter(alone.values()), {}).get("pages_per_s_by_count")
    found = sorted(res.glob("vit-attention*.json"))  # -fused-rotary.json: the 23rd pass's name
    vit = json.loads(found[0].read_text()) if found else None
    machines = [f["machine"] for f in floors.values()] + ([vit["machine"]] if vit else [])
    if (res / "machine.json").exists():  # written by the `alone` stage
        machines.append(json.loads((res / "machine.json").read_text()))
    smi = (r.split(",")[0] for f in res.glob("*.gpu.csv") for r in f.read_text().split("\n")[1:2])
    gpu = next((m.get("gpu") or m["device"] for m in machines), "") or next(filter(None, smi), "?")
    whole = floors.get("off", {"ms_per_page": nan, "definition": "not measured"})
    summary = method.summary(gpu, whole, variants, alone_figure, f"{plan['stem']}-raw.tar.gz")
    for given, made in zip(variants, summary["variants"], strict=True):
        made["engine_reads"] = given["engine_reads"]  # beside the windows, one each
    summary["layout_service_alone_by_setting"] = alone
    if earlier:
        summary["layout_service_alone_from"] = earlier["raw"]
    if vit:
        summary["vit_attention"] = attention(vit)
        summary["vit_fused_rotary"] = vit.get("fused_rotary")  # which rotary the plugin ran
    return {"summary": summary, "figures": figures, "alone": alone}


def gauges(path: Path) -> dict[str, float]:
    """The layout service's `ocrvl_layout_gpu_memory_bytes` gauges in a /metrics text, MiB by
    kind (allocated, max_allocated, reserved, max_reserved); {} where the file is absent."""
    if not path.exists():
        return {}
    samples = (s for f in text_string_to_metric_families(path.read_text()) for s in f.samples)
    return {s.labels["kind"]: s.value / 2**20 for s in samples
            if s.name == "ocrvl_layout_gpu_memory_bytes"}  # fmt: skip


def memory(windows: list[Path]) -> dict[str, Any]:
    """A setting's GPU memory over its windows (the gauges the alone stage read before and after
    each): PyTorch's most reserved and allocated since the service started (its start
    included), and what it held allocated before its first window, at rest after the start."""
    after = [gauges(w.with_suffix(".metrics-after.txt")) for w in windows]
    before = gauges(windows[0].with_suffix(".metrics-before.txt"))
    if not all(after) or not before:
        return {}
    return {"gpu_memory_mib": {
        "max_reserved": max(g["max_reserved"] for g in after),
        "max_allocated": max(g["max_allocated"] for g in after),
        "allocated_at_rest": before["allocated"],
    }}  # fmt: skip


def attention(vit: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kind and batch of encoder_check's report: each line's ms (the stock, the plugin's
    modes, vLLM's other backends), their largest difference from the stock's embeddings, which
    are within bounds, and the fastest of those."""
    rows = []
    for batch in vit["batches"]:
        lines = {f"stock {vit.get('stock_attention', '')}".strip(): batch["stock_ms"]}
        bad, apart = set(), {}
        for kind, measured in (("plugin", batch["modes"]), ("vllm", batch.get("backends", {}))):
            for name, m in measured.items():
                lines[f"{kind} {name}"] = m["ms"]
                apart[f"{kind} {name}"] = m.get("max_abs")
                if not m["within"]:
                    bad.add(f"{kind} {name}")
        good = {name: ms for name, ms in lines.items() if name not in bad}
        rows.append({"kind": batch.get("kind", "mixed"), "images": batch["images"],
                     "patches": batch["patches"], "ms": lines, "max_abs": apart,
                     "out_of_bounds": sorted(bad),
                     "fastest": min(good, key=good.__getitem__)})  # fmt: skip
    return rows


def markdown(plan: dict[str, Any], parts: dict[str, Any]) -> str:
    """The pass in a page: each variant's windows, its figure and spread, against its floor."""
    summary = parts["summary"]
    floor = summary["floor"]
    lines = [
        f"# {plan['stem']}: method 2 on {summary['gpu']}",
        "",
        f"Floor (whole page): {floor['ms_per_page']:.2f} ms a page. "
        f"Definition: {floor['definition']}."
        if not math.isnan(floor["ms_per_page"])
        else "Floor: not measured in this pass.",
        "",
    ]
    for variant in summary["variants"]:
        figure = parts["figures"].get(variant["name"])
        if not variant["windows"]:
            lines += [f"## {variant['name']}: no window in this pass", ""]
            continue
        lines += [f"## {variant['name']} (c={variant['concurrency']}): {variant['stack']}", "",
                  f"Floor: {variant['floor_ms_per_page']:.2f} ms a page." if measured(variant)
                  else "Floor: not measured in this pass.", "",
                  "| window | seconds | mean latencies | pages/s by count | by latency | bins cv "
                  "| engine requests / pages 200, cache hits (whole load) |",
                  "|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
        for number, w in enumerate(variant["windows"]):
            flat = "" if w["bins_cv"] <= method.FLAT_CV else " (not flat)"
            lines.append(f"| {number} | {w['seconds']:.0f} | {w['mean_latencies']:.1f} | "
                         f"{w['pages_per_s_by_count']:.2f} | {w['pages_per_s_by_latency']:.2f} | "
                         f"{w['bins_cv']:.3f}{flat} | "
                         f"{engine_cell(variant['engine_reads'][number])} |")  # fmt: skip
        if figure:
            spread = figure["spread"]
            lines += ["", f"**{figure['pages_per_s_by_count']:.2f} pages/s** (median window by "
                      f"count; spread {spread['min']:.2f}-{spread['max']:.2f}, "
                      f"{100 * (spread['relative'] or 0):.1f} %): "
                      + (f"**{100 * figure['of_floor']:.1f} %** of its floor; "
                         if measured(variant) else "")
                      + f"every window flat: {figure['all_flat']}, steady: "
                      f"{figure['all_steady']}, every answer 200: {figure['all_200']}, "
                      f"the engines read every page: {figure['engines_read']}."]  # fmt: skip
        cpu = (figure or {}).get("cpu", [])
        lines += [""] if cpu else []
        for number, used in enumerate(cpu):
            made = used["generated_tokens"] or math.nan
            each = [f"{process(n)} {1000 * t / made:.2f}" for t, n in used["cpu_s"][:4]]
            lines.append(f"CPU ms a generated token, window {number}'s busiest processes: "
                         f"{'; '.join(each)}.  ")  # fmt: skip
        lines.append("")
    if summary.get("layout_service_alone_from"):
        lines.append(
            f"The layout service alone was measured in a pass of its own: "
            f"{summary['layout_service_alone_from']}.  "
        )
    for name, alone in parts["alone"].items():
        low, high = alone["spread"]["min"], alone["spread"]["max"]
        lines.append(f"Layout service alone, {name} ({' '.join(alone['flags']) or 'defaults'}): "
                     f"{alone['pages_per_s_by_count']:.2f} pages/s (median window by count; "
                     f"spread {low:.2f}-{high:.2f}).  ")  # fmt: skip
        if "gpu_memory_mib" in alone:
            mib = alone["gpu_memory_mib"]
            lines.append(f"GPU memory (PyTorch's, MiB, its start included): "
                         f"{mib['max_reserved']:,.0f} reserved at most, "
                         f"{mib['max_allocated']:,.0f} allocated at most, "
                         f"{mib['allocated_at_rest']:,.0f} allocated at rest after the "
                         "start.  ")  # fmt: skip
    lines += [] if parts["alone"] else ["Layout service alone: not measured."]
    rows = summary.get("vit_attention") or []
    if rows:
        names = list(rows[0]["ms"])
        fused = summary.get("vit_fused_rotary")
        rotary = {True: "the plugin's fused", False: "vLLM's fp32"}.get(fused)
        lines += ["", "## The vision tower's attention (ms per batch, bench.gpu.encoder_check)", "",
                  "(d) after a time: the largest absolute difference from the stock's embeddings, "
                  "where not 0" + (f"; the plugin's rotary: {rotary}" if rotary else "") + ".", "",
                  "| kind | images | patches | " + " | ".join(names) + " | fastest |",
                  "|---|--:|--:|" + "--:|" * len(names) + "---|"]  # fmt: skip
        for row in rows:
            apart = row.get("max_abs", {})
            cells = [f"{row['ms'][n]:.2f}" + (f" ({apart[n]:g})" if apart.get(n) else "")
                     + (" !" if n in row["out_of_bounds"] else "") for n in names]  # fmt: skip
            lines.append(f"| {row['kind']} | {row['images']} | {row['patches']} | "
                         + " | ".join(cells) + f" | {row['fastest']} |")  # fmt: skip
        if any(row["out_of_bounds"] for row in rows):
            lines += ["", "! out of bounds: its embeddings differ from the stock's by more than "
                      "bfloat16's own rounding."]  # fmt: skip
    return "\n".join(lines) + "\n"


def process(name: str) -> str:
    """`PID COMMAND LINE` (run.cpu_seconds) shortened: no pid, the program's folder left out."""
    words = name.split()[1:] or ["?"]
    return " ".join([Path(words[0]).name, *words[1:]])[:48]


def measured(variant: dict[str, Any]) -> bool:
    """Whether the pass measured `variant`'s floor (the encoder plans measure none)."""
    return not math.isnan(variant["floor_ms_per_page"])


def engine_cell(counted: dict[str, Any] | None) -> str:
    """A window's engine reads in the table: requests finished / pages 200, cache hits."""
    if counted is None:
        return "not read"
    fault = " (**not the engines'**)" if counted["fault"] else ""
    return (f"{counted['engine_completions']:,} / {counted['pages_answered']:,}, "
            f"{counted['cache_hits']:,}{fault}")  # fmt: skip


def write(plan: dict[str, Any], res: Path, out: Path) -> dict[str, Any]:
    """STEM.json and STEM.md into `out`; the summary."""
    parts = gather(plan, res)
    summary = finite(parts["summary"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{plan['stem']}.json").write_text(json.dumps(summary, indent=1, allow_nan=False)
                                              + "\n")  # fmt: skip
    (out / f"{plan['stem']}.md").write_text(markdown(plan, parts))
    print(markdown(plan, parts), flush=True)
    return dict(summary)


def finite(value: Any) -> Any:
    """`value` with every NaN (a figure not measured) as None, for strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


if __name__ == "__main__":
    write(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), Path(sys.argv[3]))
