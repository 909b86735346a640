"""The `ocrvl` command line: serve the gateway, manage keys, plan and check vLLM profiles."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from app import __version__


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.settings import Settings

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for error in exc.errors():
            print(f"ocrvl serve: {error['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_config=None,  # create_app sends uvicorn's own lines through the JSON formatter
        access_log=False,  # the gateway writes its own JSON line per request
        timeout_keep_alive=75,  # outlive nginx's upstream keep-alive so nginx closes first
    )
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    from app.auth import KeyFile, KeyFileError

    try:
        key = KeyFile(args.file).create(args.name)
    except KeyFileError as exc:
        print(f"ocrvl keys create: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(
        f"Stored the SHA-256 of key {args.name!r} in {args.file}; this is the only time the key "
        "is shown.",
        file=sys.stderr,
    )
    return 0


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
        default=os.environ.get("OCRVL_API_KEYS_FILE", "api_keys.json"),
        help="the keys file (default OCRVL_API_KEYS_FILE or ./api_keys.json)",
    )
    create.set_defaults(func=_keys_create)

    from app.profiles.commands import register as register_profile

    register_profile(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `ocrvl` console script."""
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
