"""Gateway memory under bodies sent without Content-Length (chunked), over the route's limit.

    python -m bench.chunked [--requests 6] [--body-mb 80] [--route /v1/ocr] [--chunk-kb 16]
                            [--tag T] [--out DIR]

A real `ocrvl serve` (bench.overhead's processes, its stand-in backend never asked: every
request is refused). `--requests` clients at once each send a JSON body of `--body-mb` MB in
chunks of `--chunk-kb` KiB (curl's 16 by default) with `Transfer-Encoding: chunked`, reading
the socket as they send, and stop when the answer comes or the server closes. The gateway's
RSS is sampled every 10 ms. Prints and writes: idle RSS, peak RSS, RSS a few seconds after,
each request's status and how many bytes it had sent when its answer came. Targets: peak <=
idle + (the route's limit + 2 MiB) per request in flight (the body is counted as it arrives
and refused at the limit; uvicorn holds up to 1 MiB more per connection, app/bodies.py's
READ_AHEAD, copied as it grows), after <= idle + 50 MB (given back), every answer a 413 sent
before the body ended, the connection closed after it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import tempfile
import time
from pathlib import Path
from typing import Any

from app.bench.report import keep
from app.bodies import READ_AHEAD
from bench.memory.__main__ import MB, SETTLE, Sampler, rss
from bench.overhead import CLIENT_KEY, MODEL, ROOT
from bench.overhead.processes import running
from bench.overhead.report import machine

JSON_LIMIT = 50 * MB * 4 // 3 + 64 * 1024  # /v1/ocr's JSON cap at the default 50 MiB file
CHAT_LIMIT = 20 * MB  # OCRVL_MAX_BODY_BYTES


async def send(port: int, route: str, size: int, chunk: int) -> dict[str, Any]:
    """One chunked body of `size` bytes to `route`; (status, bytes sent when answered, closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {route} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    writer.write(head.encode())
    answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    sent, filler = 0, b'{"file": "' + b"A" * (chunk - 10)
    try:
        while sent < size and not answer.done():
            writer.write(b"%x\r\n%s\r\n" % (len(filler), filler))
            sent += len(filler)
            filler = b"A" * chunk
            await writer.drain()
    except ConnectionError:
        pass  # the server closed the connection after its answer
    try:
        head_bytes = await asyncio.wait_for(answer, 60)
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        writer.close()
        return {"status": 0, "sent": sent, "closed": True}
    status = int(head_bytes.split(b" ", 2)[1])
    try:  # the rest: the error body, then EOF (or a reset) once the server closed
        await asyncio.wait_for(reader.read(-1), 10)
        closed = True
    except ConnectionError:
        closed = True
    except TimeoutError:  # the server kept the connection, reading the body on
        closed = False
    writer.close()
    return {"status": status, "sent": sent, "closed": closed}


async def burst(
    port: int, route: str, requests: int, size: int, chunk: int
) -> list[dict[str, Any]]:
    """`requests` chunked bodies at once."""
    sends = (send(port, route, size, chunk) for _ in range(requests))
    return list(await asyncio.gather(*sends))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One fresh gateway: idle, the burst (peak), a few seconds later (after)."""
    size, chunk = int(args.body_mb * MB), args.chunk_kb * 1024
    with tempfile.TemporaryDirectory() as workdir, running(
        Path(workdir), served=MODEL, backend_delay_ms=0, pinned=False
    ) as servers:  # fmt: skip
        pid = servers.pids["gateway"]
        port = int(servers.gateway.rsplit(":", 1)[1])
        asyncio.run(burst(port, args.route, 1, MB, chunk))  # warm: imports, first connection
        time.sleep(1)
        idle = rss(pid)
        with Sampler(pid) as sampler:
            answers = asyncio.run(burst(port, args.route, args.requests, size, chunk))
            peak = sampler.peak
        time.sleep(SETTLE)
        after = rss(pid)
    limit = CHAT_LIMIT if "chat" in args.route else JSON_LIMIT
    return {
        "route": args.route,
        "requests": args.requests,
        "body_bytes": size,
        "chunk_bytes": chunk,
        "limit_bytes": limit,
        "idle_rss": idle,
        "peak_rss": peak,
        "after_rss": after,
        "peak_over_idle": peak - idle,
        "bound": args.requests * (limit + 2 * READ_AHEAD),
        "after_over_idle": after - idle,
        "answers": answers,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table and the targets."""
    statuses = sorted({a["status"] for a in result["answers"]})
    most = max(a["sent"] for a in result["answers"])
    closed = sum(a["closed"] for a in result["answers"])
    return "\n".join([
        f"# Chunked bodies over the limit ({result['date']} {result['tag']})".replace(" )", ")"),
        "",
        f"{result['requests']} clients at once, each a {result['body_bytes'] / MB:.0f} MB JSON "
        f"body without Content-Length to `{result['route']}` in chunks of "
        f"{result['chunk_bytes'] // 1024} KiB (limit "
        f"{result['limit_bytes'] / MB:.1f} MB); a fresh `ocrvl serve`. Machine: "
        f"{result['machine']['cpu']}, {result['machine']['nproc']} cores.",
        "",
        "| idle MB | peak MB | peak - idle MB | bound ((limit + 2 MiB) x requests) MB | after MB | "
        "after - idle MB | statuses | most sent before the answer MB | connections closed |",
        "|--:|--:|--:|--:|--:|--:|--|--:|--:|",
        f"| {result['idle_rss'] / MB:.0f} | {result['peak_rss'] / MB:.0f} | "
        f"{result['peak_over_idle'] / MB:.0f} | {result['bound'] / MB:.0f} | "
        f"{result['after_rss'] / MB:.0f} | {result['after_over_idle'] / MB:+.0f} | "
        f"{', '.join(map(str, statuses))} | {most / MB:.1f} | {closed}/{result['requests']} |",
        "",
        "Targets: peak - idle <= the bound; after - idle <= 50 MB; every answer a 413 before "
        "the body ended, its connection closed.",
    ]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run and write bench/results/chunked-DATE[-TAG].{md,json}."""
    parser = argparse.ArgumentParser(prog="python -m bench.chunked")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--body-mb", type=float, default=80)
    parser.add_argument("--route", default="/v1/ocr")
    parser.add_argument("--chunk-kb", type=int, default=16, help="bytes per chunk sent, KiB")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    result = {
        "date": datetime.date.today().isoformat(),
        "tag": args.tag,
        "machine": machine(),
        **measure(args),
    }
    stem = args.out / ("chunked-" + result["date"] + (f"-{args.tag}" if args.tag else ""))
    keep(stem, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
