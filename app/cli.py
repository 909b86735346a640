"""The `ocrvl` command line: serve the gateway, manage keys, plan and check vLLM profiles."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from app import KEYS_FILE, __version__
from app.usage.commands import add_budget_flags
from app.usage.commands import register as register_usage


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.settings import Settings
    from app.stopping import Stop, StoppingServer

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for error in exc.errors():
            print(f"ocrvl serve: {error['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return 2
    from app.allocator import reuse_freed_memory
    from app.bodies import read_ahead

    reuse_freed_memory()
    read_ahead()
    stop = Stop()  # SIGTERM, Ctrl-C: the job runner hands its jobs back before requests drain
    config = uvicorn.Config(
        create_app(settings, stop=stop),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_config=None,  # create_app sends uvicorn's own lines through the JSON formatter
        access_log=False,  # the gateway writes its own JSON line per request
        timeout_keep_alive=75,  # outlive nginx's upstream keep-alive so nginx closes first
        # the drain of a stop: then the requests still open are cancelled and the lifespan
        # closes, inside Kubernetes' 630 s grace (docs/operations.md, "Stopping and restarts")
        timeout_graceful_shutdown=math.ceil(settings.request_timeout),
    )
    server = StoppingServer(config, stop)
    server.run()
    if not server.started:
        return 3  # uvicorn's status for a start that failed (a port in use, the lifespan's)
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from app.auth import KeyFile, KeyFileError, KeyLimits

    existed = Path(args.file).is_file()
    try:
        limits = KeyLimits(args.rpm, args.concurrency, args.pages_per_day, args.pages_per_month)
        key = KeyFile(args.file).create(args.name, limits)
    except KeyFileError as exc:
        print(f"ocrvl keys create: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"Stored the SHA-256 of key {args.name!r} in {args.file}; this is the only time the key "
        f"is shown.\n{_how_read(Path(args.file), existed)}",
        file=sys.stderr,
    )
    return 0


def _how_read(path: Path, existed: bool) -> str:
    """How a gateway comes to read the keys file at `path` (`existed`: before this key)."""
    change = "a running gateway takes a change within 1 s."
    if os.environ.get("OCRVL_API_KEYS_FILE") and Path(os.environ["OCRVL_API_KEYS_FILE"]) == path:
        where = "a gateway started with this OCRVL_API_KEYS_FILE reads it"
    elif path == Path(KEYS_FILE):
        where = (
            "a gateway started in this folder (`make serve`, `ocrvl serve`) reads it without "
            "OCRVL_API_KEYS_FILE, and docker compose mounts ./secrets for its gateway"
        )
        if not existed:  # the gateway reads the default file only when it is there at start
            change = (
                "the file is new, so a gateway already running here reads it only once "
                "restarted (after that, it takes a change within 1 s)."
            )
    else:
        where = f"start the gateway with OCRVL_API_KEYS_FILE={path} to use it"
    return f"{where[0].upper()}{where[1:]}; {change}"


def _keys_set(args: argparse.Namespace) -> int:
    from app.auth import KeyFile, KeyFileError, KeyLimits

    given = {"rpm": args.rpm, "concurrency": args.concurrency}
    given |= {"pages_per_day": args.pages_per_day, "pages_per_month": args.pages_per_month}
    if all(value is None for value in given.values()):
        print(
            "ocrvl keys set: give --rpm, --concurrency, --pages-per-day or --pages-per-month",
            file=sys.stderr,
        )
        return 2
    numbers = {k: v for k, v in given.items() if isinstance(v, int)}
    try:
        KeyFile(args.file).set_limits(
            args.name, KeyLimits(**numbers), clear=[k for k, v in given.items() if v == "default"]
        )
    except KeyFileError as exc:
        print(f"ocrvl keys set: {exc}", file=sys.stderr)
        return 2
    print(f"Updated key {args.name!r} in {args.file}; a running gateway applies it within 1 s.")
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    from app.auth import KeyFile, KeyFileError

    if not Path(args.file).exists():
        print(
            f"ocrvl keys list: no keys file at {args.file}: `ocrvl keys create NAME` makes one "
            "(--file or OCRVL_API_KEYS_FILE names another)",
            file=sys.stderr,
        )
        return 1
    try:
        entries = KeyFile(args.file).read()
    except KeyFileError as exc:
        print(f"ocrvl keys list: {exc}", file=sys.stderr)
        return 2
    print(f"{'NAME':<32} {'RPM':>8} {'CONCURRENCY':>12} {'PAGES/DAY':>10} {'PAGES/MONTH':>12}")
    for entry in entries:  # never the hashes
        rpm, concurrency = (
            "default" if value is None else "unlimited" if value == 0 else str(value)
            for value in (entry.limits.rpm, entry.limits.concurrency)
        )
        day, month = (
            str(value) if value else "none"
            for value in (entry.limits.pages_per_day, entry.limits.pages_per_month)
        )
        print(f"{entry.name:<32} {rpm:>8} {concurrency:>12} {day:>10} {month:>12}")
    return 0


def _limit(value: str) -> int | str:
    """A limit argument: a count >= 0 (0: unlimited), or `default` (the settings' value)."""
    if value == "default":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or 'default'; got {value!r}")
    return int(value)


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (0: unlimited); got {value!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree; each command's function hangs on `func`."""

    parser = argparse.ArgumentParser(
        prog="ocrvl", description="PaddleOCR-VL serving gateway in front of vLLM."
    )
    parser.add_argument("--version", action="version", version=f"ocrvl {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    serve = commands.add_parser("serve", help="run the gateway (settings from OCRVL_* variables)")
    serve.add_argument("--host", help="address to bind (default OCRVL_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default OCRVL_PORT or 8000)")
    serve.set_defaults(func=_serve)

    keys = commands.add_parser("keys", help="manage the named API keys file")
    keys_commands = keys.add_subparsers(metavar="ACTION", required=True)
    create = keys_commands.add_parser("create", help="create a named key and print it once")
    create.add_argument("name", help="a name for the key, used in logs instead of the key")
    create.add_argument(
        "--file",
        default=os.environ.get("OCRVL_API_KEYS_FILE") or KEYS_FILE,
        help=f"the keys file (default OCRVL_API_KEYS_FILE or ./{KEYS_FILE}, which a gateway "
        "started here reads)",
    )
    create.add_argument("--rpm", type=_count, help="requests per minute (default OCRVL_KEY_RPM)")
    create.add_argument(
        "--concurrency", type=_count, help="requests in flight (default OCRVL_KEY_CONCURRENCY)"
    )
    add_budget_flags(create, _count, editing=False)
    create.set_defaults(func=_keys_create)
    edit = keys_commands.add_parser("set", help="change a key's limits (applied without restart)")
    edit.add_argument("name", help="the key's name")
    edit.add_argument("--file", default=create.get_default("file"), help="the keys file")
    edit.add_argument("--rpm", type=_limit, help="requests per minute, 0: unlimited, or default")
    edit.add_argument(
        "--concurrency", type=_limit, help="requests in flight, 0: unlimited, or default"
    )
    add_budget_flags(edit, _limit, editing=True)
    edit.set_defaults(func=_keys_set)
    listing = keys_commands.add_parser("list", help="the keys' names and limits (no hashes)")
    listing.add_argument("--file", default=create.get_default("file"), help="the keys file")
    listing.set_defaults(func=_keys_list)
    register_usage(keys_commands)  # `keys usage`: totals per key and day, from the store

    from app.profiles.commands import register as register_profile

    register_profile(commands)
    # argparse only: the sweep, Pillow and matplotlib load when `bench sweep` runs
    from app.bench.commands import register as register_bench

    register_bench(commands)
    from app.client import register as register_ocr  # argparse only; httpx loads on use

    register_ocr(commands)
    from app.jobs.commands import register as register_jobs  # argparse only

    register_jobs(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ocrvl` console script."""
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
