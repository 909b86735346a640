"""Structured outputs in the request policy: grammars a client asks the engine to compile.

Off by default (OCRVL_STRUCTURED_OUTPUTS=off): a bad `guided_regex` has crashed vLLM's server
(vllm#17313, vllm#19270), grammar compilation can take exponential time and hang the worker
(vllm#45172), and an OCR server rarely needs a grammar. On, each schema, regex, grammar or
choice list is held to OCRVL_STRUCTURED_MAX_BYTES and its nesting to
OCRVL_STRUCTURED_MAX_DEPTH, which bounds (not removes) that risk. vLLM 0.32 ignores the legacy
`guided_*` fields without constraining anything; with structured outputs on, the gateway
translates them into `structured_outputs` so they mean what the client meant.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from app.errors import InvalidRequest
from app.settings import Settings

LEGACY = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
    "guided_whitespace_pattern": "whitespace_pattern",
}
FIELDS = frozenset({"structured_outputs", "response_format", "tools", "tool_choice", *LEGACY})
# Parts of `structured_outputs` the engine compiles; the rest are flags.
COMPILED = ("json", "regex", "choice", "grammar", "structural_tag", "whitespace_pattern")
PLAIN_TOOL_CHOICES = ("none", "auto")  # no grammar: vLLM renders the tools into the prompt


def check(payload: dict[str, Any], settings: Settings) -> bool:
    """Refuse or cap the grammar fields of `payload`; whether it was edited (legacy fields)."""
    asked = _grammar_fields(payload)
    if not asked:
        return False
    if settings.structured_outputs != "on":
        name = asked[0]
        raise InvalidRequest(
            f"`{name}` asks the engine to compile a grammar, which this gateway does not allow "
            "(OCRVL_STRUCTURED_OUTPUTS=off: adversarial grammars have crashed and hung vLLM); "
            "an operator can switch it on with OCRVL_STRUCTURED_OUTPUTS=on",
            param=name,
            code="structured_outputs_disabled",
        )
    edited = _translate_legacy(payload)
    for field in sorted({"structured_outputs" if name in LEGACY else name for name in asked}):
        _cap_field(field, payload.get(field), settings)
    return edited


def _grammar_fields(payload: dict[str, Any]) -> list[str]:
    """The fields of `payload` that make the engine compile a grammar, in order."""
    asked = []
    for name in FIELDS.intersection(payload):
        value = payload[name]
        if value is None:
            continue
        if name == "response_format" and isinstance(value, dict) and value.get("type") == "text":
            continue
        if name == "tool_choice" and value in PLAIN_TOOL_CHOICES:
            continue
        if name == "tools" and value == []:
            continue
        asked.append(name)
    return sorted(asked)


def _translate_legacy(payload: dict[str, Any]) -> bool:
    """guided_* become one `structured_outputs` (vLLM 0.32 would ignore them silently)."""
    legacy = {name: payload[name] for name in LEGACY if payload.get(name) is not None}
    if not legacy:
        return False
    first = next(iter(legacy))
    if payload.get("structured_outputs") is not None:
        raise InvalidRequest(
            f"`{first}` and `structured_outputs` together: send `structured_outputs` alone "
            "(guided_* are vLLM's old names for its fields)",
            param=first,
        )
    for name in LEGACY:
        payload.pop(name, None)
    payload["structured_outputs"] = {LEGACY[name]: value for name, value in legacy.items()}
    return True


def _cap_field(name: str, value: object, settings: Settings) -> None:
    """Hold each compiled part of field `name` to the size and nesting caps."""
    if name == "structured_outputs" and isinstance(value, dict):
        for part in COMPILED:
            if value.get(part) is not None:
                _cap(f"{name}.{part}", value[part], settings)
    elif name == "response_format" and isinstance(value, dict):
        _cap(name, value.get("json_schema", value), settings)
    elif name == "tools" and isinstance(value, list):
        for index, tool in enumerate(value):
            function = tool.get("function") if isinstance(tool, dict) else None
            schema = function.get("parameters") if isinstance(function, dict) else tool
            _cap(f"tools[{index}].function.parameters", schema, settings)
    else:  # a named tool_choice
        _cap(name, value, settings)


def _cap(where: str, value: object, settings: Settings) -> None:
    size = len(value.encode()) if isinstance(value, str) else len(orjson.dumps(value))
    if size > settings.structured_max_bytes:
        raise InvalidRequest(
            f"`{where}` is {size} bytes; this gateway compiles grammars of at most "
            f"{settings.structured_max_bytes} bytes (OCRVL_STRUCTURED_MAX_BYTES)",
            param=where,
            code="structured_output_too_large",
        )
    depth = text_depth(value) if isinstance(value, str) else json_depth(value)
    if depth > settings.structured_max_depth:
        raise InvalidRequest(
            f"`{where}` nests {depth} levels deep; this gateway compiles grammars nested at "
            f"most {settings.structured_max_depth} levels (OCRVL_STRUCTURED_MAX_DEPTH)",
            param=where,
            code="structured_output_too_deep",
        )


def json_depth(value: object) -> int:
    """How deeply objects and arrays nest in `value` (a scalar is 0, `{}` is 1)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def text_depth(text: str) -> int:
    """How deeply brackets nest in a regex, grammar or JSON text (escaped ones do not count)."""
    deepest = depth = 0
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(depth - 1, 0)
    return deepest
