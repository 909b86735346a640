"""The installed vLLM's own `vllm serve` parser, used as `vllm serve MODEL --config FILE` uses it.

vLLM is imported through importlib: it is heavy (seconds), ships its own types (mypy would
follow all of it) and only `ocrvl profile check` needs it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from app.profiles import flagsets

_OPTION = re.compile(r"--([A-Za-z0-9][\w.-]*)")


class ParserRefusal(Exception):
    """vLLM's parser refused the arguments; `str()` is its own message."""


def _refuse(message: str) -> NoReturn:
    raise ParserRefusal(message)


def installed_version() -> str:
    """The installed vLLM's version without importing it (`0.32.0+cpu` -> `0.32.0`)."""
    try:
        return importlib.metadata.version("vllm").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "none"


def paddlex_arguments(config: Mapping[str, Any]) -> list[str]:
    """What PaddleX's genai_server passes for a `--backend_config` (configs/utils.py)."""
    arguments: list[str] = []
    for key, value in config.items():
        arguments.append("--" + str(key).replace("_", "-"))
        if not isinstance(value, bool):
            arguments.append(str(value))
    return arguments


def options_in(message: str) -> list[str]:
    """The `--option` names an argparse message mentions, without dashes."""
    return _OPTION.findall(message)


class ServeParser:
    """`vllm serve` exactly as the installed vLLM's CLI builds, parses and validates it."""

    def __init__(self) -> None:
        vllm = importlib.import_module("vllm")
        argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
        serve = importlib.import_module("vllm.entrypoints.cli.serve")
        self.version = str(vllm.__version__).split("+")[0]
        top = argparse_utils.FlexibleArgumentParser(prog="vllm")
        subcommands = top.add_subparsers(required=False, dest="subparser")
        self._command = serve.ServeSubcommand()
        self._serve = self._command.subparser_init(subcommands)
        top.error = _refuse
        self._serve.error = _refuse
        self._top = top
        engine_args = importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs
        self.flags: dict[str, Any] = flagsets.extract(self._serve, engine_args)

    def _parse(self, arguments: list[str]) -> argparse.Namespace:
        try:
            namespace: argparse.Namespace = self._top.parse_args(arguments)
            self._command.validate(namespace)
        except ParserRefusal:
            raise
        except (ValueError, TypeError, AssertionError, SystemExit) as exc:
            raise ParserRefusal(str(exc)) from exc
        return namespace

    def parse_config_file(self, path: Path, *extra: str) -> argparse.Namespace:
        """`vllm serve MODEL --config PATH [EXTRA...]`; raises ParserRefusal with vLLM's message."""
        return self._parse(["serve", "MODEL", "--config", str(path), *extra])

    def parse_paddlex(self, config: Mapping[str, Any]) -> argparse.Namespace:
        """The same flags as PaddleX's genai_server turns them into arguments."""
        return self._parse(["serve", "MODEL", *paddlex_arguments(config)])
