"""The eleventh pass's report (issue 36): the document path and the layout service.

    python3 -m bench.gpu.doc_report RESULTS --out DIR --stem STEM

From the pass's results folder (bench/gpu/pass.sh): the document path's two floors
(`floor-doc/blocks/floor.json`: the corpus's blocks, `floor-doc/page/floor.json`: its page read
whole), every window in the order it ran (`NN-NAME-cC.json`) and:

- the layout path against its own floor: pages/s by Little's law (C ÷ the window's mean
  latency) of `doc-on` (the stand-in's fixed boxes) ÷ the blocks' floor pages/s (target ≥ 0.85);
  `doc-real` (the real service's random-weight boxes) the same, its blocks per page beside it
  (when they are not the corpus's seven, the blocks' floor is not its floor and it says so);
  `doc-off` ÷ the whole page's floor; layout on ÷ off (A B, or A B B A averaged);
- the layout stage's share of a page's GPU time, per layout-service window: its forward ms per
  page (its /metrics: wall time of a pass over its pages) ÷ (that + the blocks' floor ms per
  page) (target ≤ 0.10), and the same with the GPU's busy time per page instead (nvidia-smi's
  utilisation over the window x its length ÷ the pages: an upper bound of the service's GPU time
  when it is alone on the GPU, what the share means when the forward is host-bound);
- the same share with the layout model's own GPU kernel time (`layout-kernels.json`, bench.gpu.
  layout_kernels: torch.profiler's CUDA kernel time per pass at batch sizes 1, 2, 4, 8): per
  batch size, kernel ms per page ÷ (that + the blocks' floor ms per page); and per layout-service
  window at the batch sizes it formed (its /metrics histogram): Σ over buckets passes x kernel ms
  per pass at the bucket's upper bound (the measured batch size >= it; an upper bound, kernel
  time grows with the batch; past the largest measured, its ms per page x the bound) ÷ the
  window's pages, then ÷ (that + the blocks' floor);
- the blocks' floor also with its prefill scaled from the whole page's by prompt tokens (`bench.
  gpu.floor` times each block's prefill alone, one small sequence per call: launch-bound, where
  vLLM's chunked prefill batches them), a second reading of the layout path's ratio;
- the gateway's admission over the document windows (its /metrics: requests in flight per
  backend, the queue's depth, a request's mean wait in it);
- GPU memory per window: torch's allocator in the layout service (its /metrics gauges, the most
  seen), each GPU process's memory (nvidia-smi: first, last, most), the card's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu.pass_report import best, runs

TARGETS = {"layout_path_over_floor": 0.85, "layout_of_page_gpu_time": 0.10}
CORPUS_BLOCKS = 7  # bench/gpu/docpages.py's BLOCKS, all sent


def floor_of(results: Path, kind: str) -> dict[str, Any] | None:
    path = results / "floor-doc" / kind / "floor.json"
    return json.loads(path.read_text()) if path.exists() else None


def scaled_prefill(blocks: dict[str, Any], page: dict[str, Any]) -> dict[str, Any]:
    """The blocks' floor with its prefill at the whole page's cost per prompt token."""
    per_token = page["prefill_ms_per_page"] / page["page"]["prompt_tokens"]
    prefill = per_token * blocks["page"]["prompt_tokens"]
    floor = blocks["encoder"]["ms_per_page"] + prefill + blocks["decode"]["ms_per_page"]
    return {"prefill_ms_per_page": prefill, "floor_ms_per_page": floor,
            "floor_pages_per_s": 1000 / floor}  # fmt: skip


def gauges(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        try:
            values[key] = float(value)
        except ValueError:
            continue
    return values


def admission(path: Path, start: float, end: float) -> dict[str, Any] | None:
    """The gateway's admission over [start, end] from a window's metrics file (its URL the
    first): mean requests in flight per backend, mean queue depth, a request's mean wait."""
    if not path.exists():
        return None
    inside = []
    for raw in path.read_text().splitlines():
        sample = json.loads(raw)
        text = next(iter(sample["texts"].values()))
        if text and start <= sample["t"] <= end:
            inside.append(gauges(text))
    if len(inside) < 2:
        return None
    flights = [[v for k, v in s.items() if k.startswith("ocrvl_backend_in_flight{")]
               for s in inside]  # fmt: skip
    first, last = inside[0], inside[-1]
    key = "ocrvl_queue_wait_seconds_"
    waits = [last.get(key + p, 0.0) - first.get(key + p, 0.0) for p in ("sum", "count")]
    return {
        "in_flight_per_backend_mean": sum(sum(f) / len(f) for f in flights if f) / len(inside),
        "queue_depth_mean": sum(s.get("ocrvl_queue_depth", 0.0) for s in inside) / len(inside),
        "queue_wait_s_mean": waits[0] / waits[1] if waits[1] else None,
        "queued_per_s": waits[1] / (end - start),
    }


def row(run: dict[str, Any], blocks: dict[str, Any] | None, page: dict[str, Any] | None,
        results: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """One window's line: its figures, and against the floor that is its own."""
    f, gpu = run["figures"], run.get("gpu") or {}
    busy = [g["busy_mean_pct"] for g in gpu.values()]
    card = [g["memory_max_mib"] for g in gpu.values()]
    per_s = best(run)
    name = run["layout"]
    floor = blocks if name in ("doc-on", "doc-real") else page if name == "doc-off" else None
    ocr = run.get("ocr") or {}
    answered = max(f["answered"], 1)
    gpu_ms = (sum(busy) / len(busy) / 100 * 1000 / f["pages_per_s_count"]
              if busy and f["pages_per_s_count"] else None)  # fmt: skip
    metrics = (results / f"{run['order']:02d}-{name}-{run['load']}.metrics.jsonl"
               if results else None)  # fmt: skip
    return {
        "order": run["order"], "name": name, "load": run["load"], "window_s": f["seconds"],
        "latencies_held": f["latencies_held"], "steady": f["steady"], "answered": f["answered"],
        "statuses": f["statuses"], "pages_per_s_count": f["pages_per_s_count"],
        "pages_per_s_little": per_s,
        "p50_s": (f["latency_s"] or {}).get("p50"), "p99_s": (f["latency_s"] or {}).get("p99"),
        "halves_pages_per_s": f.get("halves_pages_per_s"),
        "output_tokens_per_page": f["output_tokens_per_s"] * f["seconds"] / answered,
        "gpu_busy_pct": sum(busy) / len(busy) if busy else None,
        "card_memory_max_mib": max(card) if card else None,
        "x_own_floor": per_s / floor["floor_pages_per_s"] if floor else None,
        "blocks_per_page": (ocr.get("blocks_per_page") or {}).get("avg"),
        "prompt_tokens_per_page": (ocr.get("prompt_tokens_per_page") or {}).get("avg"),
        "answers_layout": ocr.get("layouts"), "page_errors": ocr.get("page_errors"),
        "vllm_finished_per_s": (run.get("engine") or {}).get("finished_per_s"),
        "layout_service": run.get("layout_service"),
        "gpu_busy_ms_per_page": gpu_ms,
        "gateway_admission": admission(metrics, *f["window_s"])
        if metrics and name.startswith("doc")
        else None,
        "gpu_processes": run.get("gpu_processes"),
    }  # fmt: skip


def mean_of(rows: list[dict[str, Any]], name: str) -> tuple[float | None, list[int]]:
    """A window name's pages/s (Little) averaged over its steady windows (all when none is)."""
    mine = [r for r in rows if r["name"] == name]
    steady = [r for r in mine if r["steady"]] or mine
    if not steady:
        return None, []
    return sum(r["pages_per_s_little"] for r in steady) / len(steady), [r["order"] for r in steady]


def targets(
    rows: list[dict[str, Any]],
    blocks: dict[str, Any] | None,
    page: dict[str, Any] | None = None,
    kernels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Issue 36's two targets, and layout on ÷ off, each with the windows it rests on."""
    out: dict[str, Any] = {}
    on, on_windows = mean_of(rows, "doc-on")
    off, off_windows = mean_of(rows, "doc-off")
    if blocks and on is not None:
        ratio = on / blocks["floor_pages_per_s"]
        out["layout_path_over_floor (stand-in boxes)"] = {
            "windows": on_windows, "pages_per_s": on, "floor_pages_per_s":
            blocks["floor_pages_per_s"], "ratio": ratio,
            "met": ratio >= TARGETS["layout_path_over_floor"]}  # fmt: skip
        if page:
            scaled = scaled_prefill(blocks, page)["floor_pages_per_s"]
            out["layout_path_over_floor (stand-in boxes)"] |= {
                "floor_prefill_scaled_pages_per_s": scaled,
                "ratio_prefill_scaled": on / scaled,
            }
    real = [r for r in rows if r["name"] == "doc-real"]
    if blocks and real:
        r = real[-1]
        ratio = r["pages_per_s_little"] / blocks["floor_pages_per_s"]
        same = r["blocks_per_page"] is not None and abs(r["blocks_per_page"] - CORPUS_BLOCKS) < 0.5
        out["layout_path_over_floor (real service)"] = {
            "window": r["order"], "pages_per_s": r["pages_per_s_little"],
            "blocks_per_page": r["blocks_per_page"], "ratio_to_corpus_floor": ratio,
            "comparable": same,
            "met": (ratio >= TARGETS["layout_path_over_floor"]) if same else None}  # fmt: skip
    if on is not None and off:
        out["layout_on_over_off"] = {"on_windows": on_windows, "off_windows": off_windows,
                                     "on_pages_per_s": on, "off_pages_per_s": off,
                                     "ratio": on / off}  # fmt: skip
    for r in rows:
        service = r["layout_service"] or {}
        ms = service.get("forward_ms_per_page")
        if ms is None or not blocks or not r["name"].startswith("layout"):
            continue
        share = ms / (ms + blocks["floor_ms_per_page"])
        gpu_ms = r["gpu_busy_ms_per_page"]
        by_gpu = gpu_ms / (gpu_ms + blocks["floor_ms_per_page"]) if gpu_ms is not None else None
        out[f"layout_of_page_gpu_time (window {r['order']}, {r['name']})"] = {
            "layout_ms_per_page": ms, "blocks_floor_ms_per_page": blocks["floor_ms_per_page"],
            "share": share, "mean_batch": service.get("mean_batch"),
            "met": share <= TARGETS["layout_of_page_gpu_time"],
            "gpu_busy_ms_per_page": gpu_ms, "share_by_gpu_busy": by_gpu,
            "met_by_gpu_busy": by_gpu <= TARGETS["layout_of_page_gpu_time"]
            if by_gpu is not None else None}  # fmt: skip
    if kernels and blocks:
        out["layout_of_page_gpu_time (kernel time)"] = kernel_share(kernels, rows, blocks)
    return out


def kernels_of(results: Path) -> dict[str, Any] | None:
    path = results / "layout-kernels.json"
    return json.loads(path.read_text()) if path.exists() else None


def window_kernel_ms(kernels: dict[str, Any], service: dict[str, Any]) -> tuple[float, bool] | None:
    """A layout-service window's kernel ms per page at the batch sizes it formed: each bucket's
    passes at the kernel ms per pass of the smallest measured batch >= its bound (past the
    largest measured: that one's ms per page x the bound, `extrapolated`); None without pages
    or with passes in an unbounded bucket."""
    measured = sorted((int(size), line) for size, line in kernels["batches"].items())
    histogram, pages = service.get("batches_by_size") or {}, service.get("pages")
    if not measured or not histogram or not pages:
        return None
    total, extrapolated = 0.0, False
    for bucket, passes in histogram.items():
        if not passes:
            continue
        bound = float(bucket.removeprefix("<=").strip())
        if bound == float("inf"):
            return None
        above = [line for size, line in measured if size >= bound]
        if above:
            total += passes * above[0]["kernel_ms_per_pass"]
        else:
            total += passes * measured[-1][1]["kernel_ms_per_page"] * bound
            extrapolated = True
    return total / pages, extrapolated


def kernel_share(
    kernels: dict[str, Any], rows: list[dict[str, Any]], blocks: dict[str, Any]
) -> dict[str, Any]:
    """The layout stage's share of a page's GPU time by the model's kernel time: per batch size
    measured, and per layout-service window at the batch sizes it formed."""
    floor, target = blocks["floor_ms_per_page"], TARGETS["layout_of_page_gpu_time"]
    # cuda-kernels (CUPTI), cuda-events (an upper bound, when the profiler failed); cpu-ops: no GPU
    gpu = all(t.startswith("cuda") for t in kernels.get("timer", "cuda-kernels").split(","))

    def share(ms: float) -> dict[str, Any]:
        value = ms / (ms + floor)
        return {"kernel_ms_per_page": ms, "share": value, "met": value <= target if gpu else None}

    out: dict[str, Any] = {
        "timer": kernels.get("timer"), "gpu": kernels.get("gpu"), "dtype": kernels.get("dtype"),
        "compile": kernels.get("compile"), "blocks_floor_ms_per_page": floor,
        "by_batch": {size: share(line["kernel_ms_per_page"])
                     for size, line in kernels["batches"].items()},
        "windows": {}}  # fmt: skip
    for r in rows:
        service = r["layout_service"] or {}
        found = window_kernel_ms(kernels, service) if r["name"].startswith("layout") else None
        if found:
            out["windows"][f"window {r['order']}, {r['name']}"] = share(found[0]) | {
                "mean_batch": service.get("mean_batch"),
                "batches_by_size": service.get("batches_by_size"),
                "extrapolated": found[1],
            }
    return out


def num(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    parts = [f"# {report['stem']}", "", "## The document path's floors (same host, this pass)", ""]
    parts += ["| floor | visual tokens | output tokens | encoder ms | prefill ms | decode ms "
              "| floor ms per page | pages/s |", "|---|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for kind, line in report["floors"].items():
        if line and "page" in line:
            parts.append(
                f"| {kind} ({line.get('rotary')}) | {line['page']['visual_tokens']:,} "
                f"| {line['page']['output_tokens']} | {num(line['encoder']['ms_per_page'])} "
                f"| {num(line['prefill_ms_per_page'])} | {num(line['decode']['ms_per_page'])} "
                f"| {num(line['floor_ms_per_page'])} | {num(line['floor_pages_per_s'], 1)} |"
            )
    scaled = report["floors"].get("blocks_prefill_scaled")
    if scaled:
        parts += ["", f"The blocks' floor with its prefill at the whole page's cost per prompt "
                  f"token ({num(scaled['prefill_ms_per_page'])} ms): "
                  f"{num(scaled['floor_ms_per_page'])} ms = "
                  f"{num(scaled['floor_pages_per_s'], 1)} pages/s."]  # fmt: skip
    parts += ["", "## Windows, in the order they ran", "",
              "| # | window | load | s | latencies | steady | answered | pages/s count "
              "| pages/s Little | p50 s | p99 s | x own floor | blocks/page | out tokens/page "
              "| GPU busy % | card MiB max | statuses |",
              "|---|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]  # fmt: skip
    for r in report["rows"]:
        floor = f"{r['x_own_floor']:.0%}" if r["x_own_floor"] is not None else ""
        parts.append(
            f"| {r['order']} | {r['name']} | {r['load']} | {num(r['window_s'], 0)} "
            f"| {num(r['latencies_held'], 1)} | {'yes' if r['steady'] else 'no'} "
            f"| {r['answered']} | {num(r['pages_per_s_count'])} | {num(r['pages_per_s_little'])} "
            f"| {num(r['p50_s'])} | {num(r['p99_s'])} | {floor} | {num(r['blocks_per_page'], 1)} "
            f"| {num(r['output_tokens_per_page'], 0)} | {num(r['gpu_busy_pct'], 0)} "
            f"| {num(r['card_memory_max_mib'], 0)} | {json.dumps(r['statuses'])} |"
        )
    parts += ["", "## Targets (issue 36)", ""]
    parts += [f"- **{name}**: {json.dumps(value)}" for name, value in report["targets"].items()]
    kernels = report.get("layout_kernels")
    if kernels:
        shares = (report["targets"].get("layout_of_page_gpu_time (kernel time)") or {}).get(
            "by_batch", {})  # fmt: skip
        parts += ["", "## The layout model's kernel time (bench.gpu.layout_kernels)", "",
                  f"{kernels['gpu'] or kernels['device']}, {kernels['dtype']}, compile "
                  f"{kernels['compile']}, input {kernels['input'][0]}x{kernels['input'][1]}, "
                  f"{kernels['repeat']} passes, timer {kernels.get('timer')} "
                  f"(warm-up {num(kernels['warm_up_s'], 1)} s)", "",
                  "| batch | wall ms/pass | event ms/pass | kernel ms/pass | kernel ms/page "
                  "| kernels/pass | share of page |", "|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
        for size, line in kernels["batches"].items():
            share = (shares.get(size) or {}).get("share")
            parts.append(
                f"| {size} | {num(line['wall_ms_per_pass'])} | {num(line['event_ms_per_pass'])} "
                f"| {num(line['kernel_ms_per_pass'])} | {num(line['kernel_ms_per_page'], 3)} "
                f"| {num(line['kernels_per_pass'], 0)} "
                f"| {f'{share:.1%}' if share is not None else ''} |"
            )
    layout = [r for r in report["rows"] if r["layout_service"]]
    if layout:
        parts += ["", "## The layout service's own account and its GPU memory", ""]
        for r in layout:
            parts.append(f"- window {r['order']} ({r['name']}): "
                         f"{json.dumps(r['layout_service'])}")  # fmt: skip
            if r["gpu_processes"]:
                apps = json.dumps(r["gpu_processes"])
                parts.append(f"  - GPU processes (nvidia-smi, MiB): {apps}")
    docs = [r for r in report["rows"] if r["name"].startswith("doc")]
    if docs:
        parts += ["", "## What the /v1/ocr answers said, and the gateway's admission", ""]
        parts += [f"- window {r['order']} ({r['name']}): layout {r['answers_layout']}, "
                  f"blocks/page {num(r['blocks_per_page'], 2)}, prompt tokens/page "
                  f"{num(r['prompt_tokens_per_page'], 0)}, page errors {r['page_errors']}; "
                  f"admission {json.dumps(r['gateway_admission'])}"
                  for r in docs]  # fmt: skip
    apps = [r for r in report["rows"] if r["gpu_processes"] and not r["layout_service"]]
    if apps:
        parts += ["", "## GPU processes in the other windows (nvidia-smi, MiB)", ""]
        parts += [f"- window {r['order']} ({r['name']}): {json.dumps(r['gpu_processes'])}"
                  for r in apps]  # fmt: skip
    return "\n".join(parts) + "\n"


def report(results: Path, out: Path, stem: str) -> int:
    blocks, page = floor_of(results, "blocks"), floor_of(results, "page")
    rows = [row(run, blocks, page, results) for run in runs(results)]
    floors = {"blocks": blocks, "page": page}
    if blocks and page:
        floors["blocks_prefill_scaled"] = scaled_prefill(blocks, page)
    kernels = kernels_of(results)
    made = {"stem": stem, "results": str(results), "floors": floors, "rows": rows,
            "targets": targets(rows, blocks, page, kernels), "target_values": TARGETS,
            "layout_kernels": kernels}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(made, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(made))
    print(markdown(made))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.doc_report")
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stem", required=True)
    args = parser.parse_args(argv)
    return report(args.results, args.out, args.stem)


if __name__ == "__main__":
    sys.exit(main())
