"""`python -m ocrvl_layout --model DIR [...]`: the layout service (docs/layout.md).

Every flag can also come from its `OCRVL_LAYOUT_*` variable (`--max-batch` from
OCRVL_LAYOUT_MAX_BATCH); a flag given wins. Once the model is loaded and warm it prints
`ocrvl-layout ready on http://HOST:PORT (...)` on stdout, the line a supervisor can wait for
(`--port 0` takes any free port and says which there).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from typing import Any

from pydantic import ValidationError

from ocrvl_layout.settings import Settings

READY_LINE = "ocrvl-layout ready on"


def parse_args(argv: list[str] | None) -> dict[str, Any]:
    """The flags given on the command line (the rest come from the environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m ocrvl_layout", description=__doc__.split("\n")[0]
    )
    add = parser.add_argument
    add("--model", help="PP-DocLayoutV3 checkpoint folder (OCRVL_LAYOUT_MODEL)")
    add("--orientation-model", help="PP-LCNet doc_ori checkpoint (OCRVL_LAYOUT_ORIENTATION_MODEL)")
    add("--unwarping-model", help="UVDoc checkpoint (OCRVL_LAYOUT_UNWARPING_MODEL)")
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port (default 8300; 0: any free port)")
    add("--device", choices=["auto", "cpu", "cuda"], help="default auto: cuda when there is one")
    add("--max-batch", type=int, help="pages per forward pass, at most (default 8)")
    add("--max-wait-ms", type=float, help="how long a batch waits for more pages (default 10)")
    add("--compile", action="store_true", default=None, help="torch.compile the model")
    add(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay the forward pass from CUDA graphs (default on, on a GPU without --compile)",
    )
    add(
        "--max-queue",
        type=int,
        help="pages held at once (decoding, waiting, in a pass) before 503 (default 512)",
    )
    add("--max-images", type=int, help="images in one request (default 32)")
    add("--max-pixels", type=int, help="pixels of one image (default 50000000)")
    add("--max-request-bytes", type=int, help="a request body's size (default 256 MiB)")
    add("--workers", type=int, help="threads parsing bodies (default 4)")
    add(
        "--worker-processes",
        type=int,
        help="processes decoding, resizing and post-processing pages (default: the cores this "
        "process may use, at most 8; 0: threads)",
    )
    add("--log-level", choices=["debug", "info", "warning", "error"], help="default info")
    given = vars(parser.parse_args(argv))
    return {name: value for name, value in given.items() if value is not None}


def listening(host: str, port: int) -> tuple[socket.socket, str]:
    """A socket bound and listening before the model loads (/health and /ready answer
    meanwhile; `--port 0` learns its port for the ready line), and its URL."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    return sock, f"http://{shown}:{bound_port}"


def main(argv: list[str] | None = None) -> int:
    try:
        settings = Settings(**parse_args(argv))
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        print(
            f"ocrvl-layout: {problems} (--model DIR or OCRVL_LAYOUT_MODEL names the checkpoint)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sock, url = listening(settings.host, settings.port)
    failed: list[BaseException] = []

    def on_ready(line: str) -> None:
        print(f"{READY_LINE} {url} ({line})", flush=True)

    def on_fatal(error: BaseException) -> None:
        failed.append(error)
        server.should_exit = True

    import uvicorn  # noqa: PLC0415  (torch and transformers load only once the settings hold)

    from ocrvl_layout.api import create_app  # noqa: PLC0415

    app = create_app(settings, on_ready=on_ready, on_fatal=on_fatal)
    # keep-alive past the gateway's (OCRVL_KEEPALIVE_EXPIRY, 4 s): the client closes an idle
    # connection first, so no request is sent on one this server is closing
    config = uvicorn.Config(app, log_level=settings.log_level, access_log=False, lifespan="on",
                            timeout_keep_alive=75)  # fmt: skip
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
