"""Usage metering's cost: gateway CPU per request with metering off, on, and on with a budget.

    python -m bench.metering [--requests 400] [--concurrency 1,16] [--repeat 1]
                             [--modes json,stream,stream-usage] [--tag T] [--out DIR]

bench.overhead's setup, four gateways at once: one stand-in backend (FakeVLLM under uvicorn,
answering at once, its streams ending with vLLM's usage event when asked for it) and four real
`ocrvl serve` in front of it, the same in all but `OCRVL_USAGE=off`, metering on (the default),
metering on for a key with a page budget (its pages are reserved in the store, SQLite in a temp
data dir, before each request), and a second `off` as a control (its ratio to `off` is the
noise floor). Batches rotate over the four so drift on a noisy machine hits all alike. Every
request carries bench.overhead's ~300 KB JPEG page; `stream` asks no usage itself, so the
gateway asks vLLM for it and takes the usage event out; `stream-usage` asks for it. Each
gateway's CPU time (all threads, /proc schedstat) per request, the median over its batches, is
the figure; the target is "on" at most 5 % over "off". `--repeat N` starts fresh gateways N times
(in rotated order) and takes each cell's medians over them. The metering calls are also timed
alone (bench/metering/path.py). Writes bench/results/metering-<date>[-tag].md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

from app.auth import KeyFile, KeyLimits
from app.bench.commands import levels
from bench.hey_body import build
from bench.metering.path import code_path
from bench.metering.report import VARIANTS, combined, summarized, table, verdict
from bench.overhead import MODEL, ROOT, ROUTE
from bench.overhead.load import Target, run_batch
from bench.overhead.processes import VENV_BIN, process_seconds, spawn, stop, wait_ready
from bench.overhead.report import machine
from tests.support.servers import free_port

USAGE_EVENT = (
    b'data: {"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[],"usage":{"prompt_tokens":1200,"total_tokens":1212,"completion_tokens":12}}\n\n'
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.metering", description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="requests per gateway and cell")
    parser.add_argument("--concurrency", type=levels, default=[1, 16], help="levels (1,16)")
    parser.add_argument(
        "--modes", type=lambda t: t.split(","), default=["json", "stream", "stream-usage"]
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="fresh gateways this many times; medians (1)"
    )
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def serve_backend(port: int) -> None:
    """The stand-in vLLM, whose streams end with the usage event when the request asks."""
    import uvicorn  # noqa: PLC0415
    from starlette.types import Message, Receive, Scope, Send  # noqa: PLC0415

    from tests.support.fake_backend import FakeVLLM  # noqa: PLC0415

    class Discard(list[object]):
        def append(self, item: object) -> None:
            pass

    fake = FakeVLLM(served=MODEL, bodies=Discard(), headers=Discard())

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        asked = False

        async def reading() -> Message:
            nonlocal asked
            message = await receive()
            asked = asked or b'"include_usage":true' in message.get("body", b"")
            return message

        async def sending(message: Message) -> None:
            body = message.get("body", b"")
            if asked and body == b"data: [DONE]\n\n":
                message = {**message, "body": USAGE_EVENT + body}
            await send(message)

        await fake(scope, reading, sending)

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)  # fmt: skip


@contextlib.contextmanager
def running(
    workdir: Path, turn: int = 0
) -> Iterator[tuple[dict[str, str], dict[str, int], dict[str, str]]]:
    """The stand-in and the four gateways (started in an order rotated by `turn`): their URLs,
    PIDs, and each one's client key."""
    import os  # noqa: PLC0415

    clean = {k: v for k, v in os.environ.items() if not k.startswith("OCRVL_")}
    port = free_port()
    urls = {"backend": f"http://127.0.0.1:{port}"}
    pids, keys = {}, {}
    with contextlib.ExitStack() as stack:
        backend = spawn([sys.executable, "-m", "bench.metering", "--serve-backend", str(port)],
                        workdir / "backend.log", clean)  # fmt: skip
        stack.callback(stop, backend)
        wait_ready(f"{urls['backend']}/health", backend, workdir / "backend.log")
        for variant in VARIANTS[turn % len(VARIANTS) :] + VARIANTS[: turn % len(VARIANTS)]:
            folder = workdir / variant
            folder.mkdir()
            budget = KeyLimits(pages_per_day=10**9) if variant == "budget" else KeyLimits()
            metering = "off" if variant in ("off", "control") else "on"
            keys[variant] = KeyFile(folder / "keys.json").create("bench", budget)
            own = free_port()
            env = {
                **clean, "OCRVL_BACKENDS": urls["backend"], "OCRVL_API_KEYS": "sk-unused-env",
                "OCRVL_API_KEYS_FILE": str(folder / "keys.json"), "OCRVL_DATA_DIR": str(folder),
                "OCRVL_USAGE": metering, "OCRVL_LOG_LEVEL": "info",
            }  # fmt: skip
            command = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(own)]
            process = spawn(command, folder / "gateway.log", env)
            stack.callback(stop, process)
            urls[variant] = f"http://127.0.0.1:{own}"
            wait_ready(f"{urls[variant]}/ready", process, folder / "gateway.log")
            pids[variant] = process.pid
        yield urls, pids, keys


async def measure(
    urls: dict[str, str], pids: dict[str, int], keys: dict[str, str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every (mode, concurrency) cell over the four gateways, batches rotated."""
    page = build(MODEL, 4096, seed=0)
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    bodies = {
        "json": orjson.dumps(page),
        "stream": orjson.dumps(page | {"stream": True}),
        "stream-usage": orjson.dumps(page | asked),  # the client asks: passed, only read
    }
    rows = []
    limits = httpx.Limits(max_connections=max(args.concurrency), keepalive_expiry=60)
    async with contextlib.AsyncExitStack() as stack:
        targets = {}
        for variant in VARIANTS:
            client = await stack.enter_async_context(
                httpx.AsyncClient(limits=limits, timeout=60, trust_env=False)
            )
            headers = {"content-type": "application/json",
                       "authorization": f"Bearer {keys[variant]}"}  # fmt: skip
            targets[variant] = Target(f"{urls[variant]}{ROUTE}", headers, client)
        for concurrency in args.concurrency:
            for mode in args.modes:
                cell = await _cell(
                    targets, pids, bodies[mode], mode=mode, concurrency=concurrency,
                    requests=args.requests,
                )  # fmt: skip
                rows.append(cell)
                print(f"  measured {mode} c={concurrency}", file=sys.stderr)
    return rows


async def _cell(
    targets: dict[str, Target],
    pids: dict[str, int],
    body: bytes,
    *,
    mode: str,
    concurrency: int,
    requests: int,
) -> dict[str, Any]:
    batch = max(4 * concurrency, 25)
    rounds = max(6, -(-requests // batch))
    for target in targets.values():
        await run_batch(target, body, batch, concurrency)  # warm-up
    cpu = dict.fromkeys(VARIANTS, 0.0)
    latencies: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_batch: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for turn in range(rounds):
        order = VARIANTS if turn % 2 == 0 else VARIANTS[::-1]
        shift = turn % len(VARIANTS)
        for variant in order[shift:] + order[:shift]:
            before = process_seconds(pids[variant])
            times, _ = await run_batch(targets[variant], body, batch, concurrency)
            used = process_seconds(pids[variant]) - before
            cpu[variant] += used
            per_batch[variant].append(used / batch)
            latencies[variant] += times
    count = batch * rounds
    micros = {v: cpu[v] / count * 1e6 for v in VARIANTS}
    medians = {v: statistics.median(per_batch[v]) * 1e6 for v in VARIANTS}
    return {
        "mode": mode, "concurrency": concurrency, "requests": count,
        "mean_cpu_us_per_request": micros, "median_batch_cpu_us": medians,
        "on_over_off": medians["on"] / medians["off"],
        "budget_over_off": medians["budget"] / medians["off"],
        "control_over_off": medians["control"] / medians["off"],
        "p50_ms": {v: statistics.median(latencies[v]) * 1000 for v in VARIANTS},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the cells, print the table, write the report."""
    args = parse_args(argv)
    if args.serve_backend:
        serve_backend(args.serve_backend)
        return 0
    facts = machine()
    gc.collect()
    gc.freeze()
    repetitions = []
    for turn in range(args.repeat):  # fresh processes each time: a process's own bias averages
        with (
            tempfile.TemporaryDirectory(prefix="ocrvl-metering-") as workdir,
            running(Path(workdir), turn) as (urls, pids, keys),
        ):
            repetitions.append(uvloop.run(measure(urls, pids, keys, args)))
    rows = combined(repetitions)
    page = orjson.dumps(build(MODEL, 4096, seed=0))
    path = code_path(page, USAGE_EVENT)
    report = verdict(rows, path)
    report |= {"command": " ".join(["python -m bench.metering", *(argv or sys.argv[1:])]),
               "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": facts,
               "rows": rows, "repetitions": repetitions, "code_path_us": path}  # fmt: skip
    stem = args.out / f"metering-{datetime.now(UTC):%Y-%m-%d}{'-' + args.tag if args.tag else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(rows)
    summary = summarized(report)
    stem.with_suffix(".md").write_text(
        f"# Usage metering: gateway CPU per request\n\n`{report['command']}` on "
        f"{facts['nproc']} CPUs ({facts['cpu']}), load average at start "
        f"{facts['loadavg_at_start'][0]:.1f}, {report['date']}.\n\n{text}\n\n{summary}\n"
    )
    print(text)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
