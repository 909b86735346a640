"""Flag sets of `vllm serve`: extracted from a vLLM's own parser, stored as JSON, checked offline.

A flag set maps every long option of `vllm serve` to what it accepts:

    {"max-num-seqs": {"dest": "max_num_seqs", "kind": "value", "type": "int"},
     "no-enable-prefix-caching": {"dest": "enable_prefix_caching", "kind": "switch"},
     "attention-backend": {..., "type": "str", "optional": true, "values": ["FLASH_ATTN", ...]}}

`extract` reads it off an argparse parser built by `make_arg_parser`; `scripts/vllm_flagset.py`
runs `python -m app.profiles.flagsets OUT` with an older vLLM's source on the path to produce
`data/flagsets/vllm-X.Y.Z.json`. `problems` checks a profile's flags against a flag set the way
`vllm serve --config` and PaddleX's `--backend_config` would turn them into arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import json
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

FLAGSET_DIR = Path(__file__).parent / "data" / "flagsets"

_TYPE_NAMES = {
    "str": "str",
    "int": "int",
    "float": "float",
    "loads": "json",
    "parse_dataclass": "json",
    "human_readable_int": "human_int",
    "human_readable_int_or_auto": "human_int_or_auto",
}
_KIND_NAMES = {
    "int": "integer",
    "float": "number",
    "json": "JSON value",
    "human_int": "integer (16384, 16k or 16K)",
    "human_int_or_auto": "integer (16384, 16k or 16K) or auto",
}
_HUMAN_INT = re.compile(r"^\s*(\d+|\d+(\.\d+)?[kmgt]|\d+[KMGT])\s*$")


def _type_chain(function: Callable[..., Any]) -> list[Callable[..., Any]]:
    """The argparse `type` callable and the callables it wraps (optional_type(int) -> int)."""
    chain = [function]
    while True:
        cells = getattr(chain[-1], "__closure__", None) or ()
        inner = [cell.cell_contents for cell in cells if callable(cell.cell_contents)]
        if not inner:
            return chain
        chain.append(inner[0])


def _enums(hint: object) -> Iterator[type[enum.Enum]]:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        yield hint
    for argument in typing.get_args(hint):
        yield from _enums(argument)


def _enum_values(engine_args: type) -> dict[str, list[str]]:
    """Names accepted by enum-typed EngineArgs fields (vLLM looks up Enum[value.upper()])."""
    module = sys.modules[engine_args.__module__]
    values: dict[str, list[str]] = {}
    for field in dataclasses.fields(engine_args):
        holder = type("Holder", (), {"__annotations__": {field.name: field.type}})
        try:
            hint = typing.get_type_hints(holder, globalns=vars(module))[field.name]
        except Exception:  # noqa: S112 - an annotation vLLM itself only evaluates lazily
            continue
        for found in _enums(hint):
            values[field.name] = list(found.__members__)
            break
    return values


def _describe(action: argparse.Action, enum_values: Mapping[str, list[str]]) -> dict[str, Any]:
    if action.nargs == 0:
        return {"dest": action.dest, "kind": "switch"}
    spec: dict[str, Any] = {"dest": action.dest, "kind": "value", "type": "str"}
    if callable(action.type):
        chain = _type_chain(action.type)
        innermost = chain[-1].__qualname__.rsplit(".", 1)[-1]
        spec["type"] = _TYPE_NAMES.get(innermost, "str")
        if any(link.__qualname__.endswith("_optional_type") for link in chain):
            spec["optional"] = True
    if action.choices is not None:
        spec["choices"] = [str(choice) for choice in action.choices]
    if action.nargs is not None:
        spec["nargs"] = str(action.nargs)
    if spec["type"] == "str" and action.dest in enum_values:
        spec["values"] = enum_values[action.dest]
    return spec


def extract(parser: argparse.ArgumentParser, engine_args: type | None = None) -> dict[str, Any]:
    """Every long option of a `vllm serve` parser, keyed by its name without dashes."""
    enum_values = _enum_values(engine_args) if engine_args is not None else {}
    flags: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option[2:]] = _describe(action, enum_values)
    return dict(sorted(flags.items()))


def serve_parser() -> argparse.ArgumentParser:
    """The imported vLLM's `vllm serve` option parser (its module moved in 0.2x)."""
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    for module_name in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            cli_args = importlib.import_module(module_name)
        except ImportError:
            continue
        parser: argparse.ArgumentParser = cli_args.make_arg_parser(
            argparse_utils.FlexibleArgumentParser(prog="vllm serve")
        )
        return parser
    raise ImportError("this vLLM has no make_arg_parser in its known places")


def extract_installed() -> dict[str, Any]:
    """The flag set of the vLLM that `import vllm` finds, with its version."""
    vllm = importlib.import_module("vllm")
    engine_args = importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs
    version = str(vllm.__version__).split("+")[0]
    return {"vllm_version": version, "flags": extract(serve_parser(), engine_args)}


def load(version: str) -> dict[str, Any]:
    """The stored flag set of a vLLM version (`data/flagsets/vllm-X.Y.Z.json`)."""
    path = FLAGSET_DIR / f"vllm-{version}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no flag set for vLLM {version} at {path}; generate it with "
            f"`python scripts/vllm_flagset.py {version}`"
        )
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _converts(kind: str, text: str) -> bool:
    """Whether vLLM's argparse `type` for this kind accepts the text."""
    if kind in ("human_int", "human_int_or_auto"):
        return bool(_HUMAN_INT.match(text)) or (kind.endswith("auto") and text in ("auto", "-1"))
    convert: dict[str, Callable[[str], object]] = {"int": int, "float": float, "json": json.loads}
    try:
        convert.get(kind, str)(text)
    except ValueError:
        return False
    return True


def _value_problem(key: str, spec: Mapping[str, Any], text: str) -> str | None:
    kind = spec.get("type", "str")
    if spec.get("optional") and text in ("", "None"):
        return None
    if not _converts(kind, text):
        return f"`{key}: {text}` is not a valid {_KIND_NAMES.get(kind, kind)} for --{key}"
    choices = spec.get("choices")
    if choices is not None and text not in choices:
        return f"`{key}: {text}` is not one of {', '.join(choices)}"
    values = spec.get("values")
    if values is not None and text.upper() not in values:
        return f"`{key}: {text}` is not a backend this vLLM knows ({', '.join(values)})"
    return None


def problems(
    config: Mapping[str, Any], flags: Mapping[str, Any], version: str
) -> list[tuple[str, str]]:
    """(key, message) for every flag a vLLM with this flag set would refuse or misread."""
    found: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for key, value in config.items():
        spec = flags.get(key)
        if spec is None:
            found.append((key, f"`{key}` is not a `vllm serve` flag of vLLM {version}"))
            continue
        if (other := seen.setdefault(spec["dest"], key)) != key:
            found.append((key, f"`{key}` and `{other}` set the same option"))
        if spec["kind"] == "switch":
            if value is not True:
                found.append((key, f"`--{key}` is a switch: write `{key}: true` or leave it out"))
        elif isinstance(value, bool):
            found.append(
                (key, f"`--{key}` takes a value; `{key}: {str(value).lower()}` is not one")
            )
        else:
            problem = _value_problem(key, spec, str(value))
            if problem is not None:
                found.append((key, problem))
    return found


def main(argv: list[str] | None = None) -> int:
    """Write the importable vLLM's flag set to a JSON file (for scripts/vllm_flagset.py)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", default="", help="where the vLLM source came from")
    args = parser.parse_args(argv)
    data = extract_installed()
    document = {
        "vllm_version": data["vllm_version"],
        "command": "vllm serve",
        "generated_by": "scripts/vllm_flagset.py",
        "source": args.source,
        "flags": data["flags"],
    }
    args.out.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
