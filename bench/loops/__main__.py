"""The loop guard's benchmark: a document's pages/s and page p99 when 1 block in 20 loops, guard
on (OCRVL_LOOPS=cut) and off, side by side in one run.

    python -m bench.loops [--windows 4] [--pages 10] [--blocks 20] [--every 20]
                          [--token-ms 2] [--out bench/results]

Two real `ocrvl serve` gateways, one with the guard and one without, in front of one stand-in VLM
(tests/support/standin_vlm.py: a word a token at `--token-ms` a token, whole answers paced alike;
its fake fault loops one `OCR:` block in `--every`, chosen by the crop's pixels, to its 4,096
token limit) and one stand-in layout service (`--blocks` text boxes a page). Windows alternate
A B A B (guard on, off, on, off, ...); each sends the same document (`--pages` pages, each page's
text drawn apart so every crop differs) to /v1/ocr with `stream=true` and times each page's
NDJSON line from the request's start. Writes bench/results/loops-guard-<date>.{json,md} (every
page's time in the JSON) and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
from PIL import Image, ImageDraw

from app.bench.report import keep
from bench.overhead.processes import VENV_BIN, spawn, stop, wait_ready
from bench.overhead.report import machine
from tests.support.layout_standin import LayoutStandin, box
from tests.support.servers import free_port, serving
from tests.support.standin_vlm import StandinVLM, loops_here

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-bench-loops"
ARMS = {"on": "cut", "off": "off"}  # the arm's name and its OCRVL_LOOPS
WIDTH, HEIGHT = 800, 1100


def document(pages: int, seed: int = 7) -> bytes:
    """A PDF of `pages` pages of text lines, each page's words its own (at 144 dpi, the
    gateway's default: rendered back at WIDTH x HEIGHT, where `boxes` are)."""
    rng = random.Random(seed)  # noqa: S311 (page text, not a secret)
    images = []
    for number in range(pages):
        image = Image.new("RGB", (WIDTH, HEIGHT), "white")
        draw = ImageDraw.Draw(image)
        for line in range(40):
            words = " ".join(f"{rng.randrange(10**6):x}" for _ in range(8))
            draw.text((60, 40 + line * 26), f"{number}.{line} {words}", fill="black")
        images.append(image)
    out = io.BytesIO()
    images[0].save(out, format="PDF", save_all=True, append_images=images[1:], resolution=144)
    return out.getvalue()


def boxes(blocks: int) -> list[dict[str, Any]]:
    """`blocks` text boxes down the page."""
    step = (HEIGHT - 80) // blocks
    return [box("text", 50, 30 + i * step, 760, 30 + i * step + step - 6) for i in range(blocks)]


@contextlib.contextmanager
def gateways(vlm: str, layout: str, workdir: Path) -> Iterator[dict[str, str]]:
    """A real `ocrvl serve` per arm, at the same stand-ins; {arm: URL}."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    processes, urls = [], {}
    try:
        for arm, mode in ARMS.items():
            port = free_port()
            env = {
                **clean, "OCRVL_BACKENDS": vlm, "OCRVL_LAYOUT_URL": layout,
                "OCRVL_API_KEYS": KEY, "OCRVL_LOOPS": mode, "OCRVL_PREPROCESS_WORKERS": "1",
                "OCRVL_DATA_DIR": str(workdir / f"data-{arm}"), "OCRVL_REQUEST_TIMEOUT": "600",
            }  # fmt: skip
            command = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1"]
            log = workdir / f"gateway-{arm}.log"
            process = spawn([*command, "--port", str(port)], log, env)
            processes.append(process)
            urls[arm] = f"http://127.0.0.1:{port}"
            wait_ready(f"{urls[arm]}/ready", process, log)
        yield urls
    finally:
        for process in processes:
            stop(process)


def window(url: str, pdf: bytes) -> dict[str, Any]:
    """One document through /v1/ocr (NDJSON): each page's seconds from the start, and flags."""
    headers = {"authorization": f"Bearer {KEY}"}
    started = time.perf_counter()
    pages: list[float] = []
    stopped = 0
    with (
        httpx.Client(timeout=600, headers=headers) as client,
        client.stream(
            "POST",
            f"{url}/v1/ocr",
            files={"file": ("doc.pdf", pdf)},
            data={"stream": "true", "layout": "on"},
        ) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():
            item = orjson.loads(line)
            if item.get("object") == "ocr.document":  # block by block, never whole pages
                assert item["layout"] == "on", item  # noqa: S101
            if item.get("object") == "ocr.page":
                pages.append(time.perf_counter() - started)
                assert "error" not in item, item["error"]  # noqa: S101 (a bench's own check)
                stopped += sum("stopped" in b for b in item.get("blocks") or [])
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "page_seconds": pages, "stopped_blocks": stopped}


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every window of both arms, interleaved."""
    pdf = document(args.pages)
    vlm = StandinVLM(fake_loop_every=args.every, token_seconds=args.token_ms / 1000)
    layout = LayoutStandin(boxes=lambda w, h, n: boxes(args.blocks))
    windows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as workdir,
        serving(vlm),
        serving(layout),
        gateways(vlm.url, layout.url, Path(workdir)) as urls,
    ):
        window(urls["on"], document(1, seed=1))  # warm both (workers, connections)
        window(urls["off"], document(1, seed=1))
        vlm.streams_ended()  # the warm-up's streams recorded before they are cleared
        vlm.streamed.clear()
        vlm.received.clear()
        for n in range(args.windows):
            for arm in ("on", "off") if n % 2 == 0 else ("off", "on"):
                windows.append({"arm": arm, "window": n, **window(urls[arm], pdf)})
        looping = sum(loops_here(r, args.every) for r in vlm.received)
        # tokens each looping stream sent before it ended (the guard's stop: its window)
        sent = sorted(n for r, n, _ in vlm.streams_ended() if loops_here(r, args.every))
    return {
        "windows": windows, "looping_requests": looping, "requests": len(vlm.received),
        "looping_tokens_sent": sent, "machine": machine(),
    }  # fmt: skip


def summary(result: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    rows = {}
    for arm in ARMS:
        mine = [w for w in result["windows"] if w["arm"] == arm]
        pages = [s for w in mine for s in w["page_seconds"]]
        rates = [len(w["page_seconds"]) / w["seconds"] for w in mine]
        rows[arm] = {
            "pages_per_s": sum(len(w["page_seconds"]) for w in mine)
            / sum(w["seconds"] for w in mine),
            "pages_per_s_min": min(rates),
            "pages_per_s_max": max(rates),
            "page_p50_s": statistics.median(pages),
            "page_p99_s": p99(pages),
            "stopped_blocks": sum(w["stopped_blocks"] for w in mine),
        }
    return rows


def report(result: dict[str, Any], rows: dict[str, dict[str, float]], args: Any) -> str:
    lines = [
        f"# bench.loops ({datetime.date.today().isoformat()})",
        "",
        f"{args.windows} windows per arm, interleaved; each a {args.pages}-page PDF of "
        f"{args.blocks} text blocks a page to /v1/ocr (NDJSON); stand-in VLM at "
        f"{args.token_ms:g} ms a token, 1 `OCR:` block in {args.every} looping to 4,096 tokens "
        f"({result['looping_requests']} of {result['requests']} block requests looped).",
        "",
        f"Guard on, tokens a looping block streamed before its stop: {_spread(sent)}."
        if (sent := result["looping_tokens_sent"])
        else "No looping block was streamed.",
        "",
        "| guard | pages/s (all windows) | window min-max | page p50 s | page p99 s "
        "| blocks stopped |",
        "|---|---|---|---|---|---|",
    ]
    for arm, row in rows.items():
        lines.append(
            f"| {arm} | {row['pages_per_s']:.2f} | {row['pages_per_s_min']:.2f}-"
            f"{row['pages_per_s_max']:.2f} | {row['page_p50_s']:.2f} | {row['page_p99_s']:.2f} "
            f"| {row['stopped_blocks']:.0f} |"
        )
    facts = result["machine"]
    cores = f"{facts['nproc']} cores of {facts['cpu']}, load {facts['loadavg_at_start'][0]:.1f}"
    lines += ["", f"Machine: {cores} at the start (shared with six other sessions).", ""]
    return "\n".join(lines)


def _spread(values: list[int]) -> str:
    return f"min {values[0]}, median {statistics.median(values):g}, max {values[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loops", description=__doc__)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    result = run(args)
    rows = summary(result, args)
    text = report(result, rows, args)
    stem = args.out / f"loops-guard-{datetime.date.today().isoformat()}"
    raw = {"args": {k: str(v) for k, v in vars(args).items()}, **result, "summary": rows}
    keep(stem, raw, text)
    print(text)
    print(f"wrote {stem}.json and .md")


if __name__ == "__main__":
    main()
