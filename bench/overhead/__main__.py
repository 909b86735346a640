"""Gateway overhead: one stand-in backend called directly and through `ocrvl serve`, interleaved.

    python -m bench.overhead [--requests 200] [--concurrency 1,32] [--modes json,stream,sse]
                             [--chunks 2,258] [--sse-requests 200] [--chunk-interval-ms 0]
                             [--pin] [--rewrite] [--backend-delay-ms 0] [--tag T] [--out DIR]

Three processes. The backend is a stand-in for vLLM (tests.support.fake_backend.FakeVLLM under
uvicorn with uvloop and httptools) that answers at once: with near-zero service time, what the
two paths differ by is the gateway, not engine noise. The gateway is a real `ocrvl serve` with
production defaults (access log at info, its stderr to a file). This script is the load
generator, one keep-alive httpx client per target on its own event loop. Every request carries
a ~300 KB JPEG page in the body PaddleOCR's client sends. Direct and gateway batches alternate
(ABBA) so drift on a noisy machine hits both alike. Prints p50/p99 of each path, the added
latency, the gateway's own `ocrvl_gateway_overhead_seconds` mean and each process's CPU time
per request; writes bench/results/overhead-<date>[-tag].md and .json.

Modes: `json` (the page, answered whole), `stream` (the same page streamed: the stand-in's four
short chunks), `sse` (streamed with `ignore_eos`, so the stand-in sends exactly
`max_completion_tokens` one-token chunks, for each count in `--chunks`). The CPU per relayed
SSE chunk is the slope between the sse cells: (CPU per request at the most chunks - at the
fewest) / (difference in chunks). The stand-in sends its chunks back to back (the gateway hands
on what has arrived by the time it asks as one send); `--chunk-interval-ms` spaces them out, so
each is relayed alone and costs every process a wake-up (on a VM that alone is tens of µs: the
stand-in's own slope shows it).

Modules: `backend` (the stand-in), `processes` (starting, pinning, stopping, CPU time), `load`
(batches and measuring), `report` (summaries, tables, the result files).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import orjson
import uvloop

from app.bench.commands import levels
from bench.hey_body import build
from bench.overhead import MODEL, REWRITTEN, ROOT
from bench.overhead.load import measure_all, payloads
from bench.overhead.processes import running
from bench.overhead.report import (
    build_report,
    chunk_table,
    cpu_table,
    latency_table,
    machine,
    write,
)
from tests.support.pages import document_page


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=200, help="requests per path (min)")
    parser.add_argument(
        "--concurrency",
        type=levels,
        default=[1, 32],
        help="comma-separated concurrency levels (default 1,32)",
    )
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=["json", "stream", "sse"],
        help="json (non-streaming), stream, sse (default all three)",
    )
    parser.add_argument(
        "--chunks",
        type=levels,
        default=[2, 258],
        help="sse mode: tokens (chunks) per answer, one cell each (default 2,258)",
    )
    parser.add_argument(
        "--sse-requests", type=int, default=200, help="sse mode: requests per path (min)"
    )
    parser.add_argument(
        "--chunk-interval-ms",
        type=float,
        default=0.0,
        help="sse mode: the stand-in's pause between chunks (default 0: back to back)",
    )
    parser.add_argument("--pin", action="store_true", help="gateway on cpu 1, the rest on cpu 0")
    parser.add_argument(
        "--rewrite", action="store_true", help="serve another name: the gateway re-encodes bodies"
    )
    parser.add_argument(
        "--backend-delay-ms", type=float, default=0.0, help="stand-in service time (default 0)"
    )
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    # the backend subprocess: `processes.running` starts this module again with these
    parser.add_argument("--serve-backend", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--served", default=MODEL, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables, write the markdown and JSON reports."""
    args = parse_args(argv)
    if args.serve_backend:
        # imported here so the load generator never loads the stand-in's app
        from bench.overhead.backend import serve_backend  # noqa: PLC0415

        serve_backend(
            args.serve_backend,
            args.served,
            args.backend_delay_ms / 1000,
            args.chunk_interval_ms / 1000,
        )
        return 0
    served = REWRITTEN if args.rewrite else MODEL
    image = document_page(seed=0)
    page = build(MODEL, 4096, seed=0)
    body = orjson.dumps(page)
    kinds = payloads(page, args.modes, args.chunks)
    requests = {"json": args.requests, "stream": args.requests, "sse": args.sse_requests}
    facts = machine()
    gc.collect()
    gc.freeze()  # the body and the imports stay out of the load generator's collections
    with tempfile.TemporaryDirectory(prefix="ocrvl-bench-") as workdir:
        with running(
            Path(workdir),
            served=served,
            backend_delay_ms=args.backend_delay_ms,
            pinned=args.pin,
            chunk_interval_ms=args.chunk_interval_ms,
        ) as servers:
            print(f"backend {servers.backend}, gateway {servers.gateway}", file=sys.stderr)
            cells = uvloop.run(measure_all(servers, kinds, args.concurrency, requests))
        access_lines = servers.gateway_log.read_text().count('"msg":"request"')
    report = build_report(
        args,
        cells,
        facts,
        command=" ".join([".venv/bin/python -m bench.overhead", *(argv or sys.argv[1:])]),
        served=served,
        sizes={"image_bytes": len(image), "body_bytes": len(body)},
        access_lines=access_lines,
    )
    stem = write(report, args.out, args.tag)
    print(latency_table(report["rows"]))
    print(cpu_table(report["rows"]))
    if report["chunk_costs"]:
        print(chunk_table(report["chunk_costs"]))
    print(f"wrote {stem}.md and {stem}.json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
