"""The request policy: what a client may make vLLM do, field by field (docs/clients.md's table).

Every field of a chat request is one of:

    passed      OpenAI's chat fields and the vLLM sampling extras clients send, unchanged
    capped      passed within a limit an operator sets; past it, 400 naming the setting
    structured  a grammar for the engine to compile (grammars.py): 400 unless
                OCRVL_STRUCTURED_OUTPUTS=on, then capped in size and nesting
    operator    only the gateway sets it (priority, engine-internal fields, templates): 400
    unknown     anything else, so a newer vLLM's new field is refused until it is judged: 400

OCRVL_PASS_FIELDS lets an operator pass a refused field unchanged. Chat, /v1/ocr, jobs and
batches all go through `apply` (or `check`); only the gateway's own code calls `with_priority`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from app import grammars
from app.chat import ChatRequest
from app.errors import InvalidRequest, clip, quoted
from app.settings import Settings

PASSED = frozenset(
    {
        # OpenAI's chat fields (checked by app/chat.py where the gateway reads them)
        "model", "messages", "stream", "stream_options", "temperature", "top_p",
        "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "seed", "user",
        "parallel_tool_calls", "reasoning_effort",
        # OpenAI's fields vLLM accepts and ignores
        "store", "metadata", "service_tier", "modalities", "prediction", "audio", "verbosity",
        "prompt_cache_key", "safety_identifier", "web_search_options",
        # vLLM's sampling and output extras
        "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "truncation_side",
        "allowed_token_ids", "echo", "add_generation_prompt", "continue_final_message",
        "add_special_tokens", "documents", "include_reasoning", "thinking_token_budget",
        "return_tokens_as_token_ids", "return_token_ids", "return_token_offsets",
        "return_prompt_text", "routed_experts_prompt_start", "mm_payload", "return_mm_kwargs",
        "repetition_detection", "stream_interval", "watermarking", "session_id",
        "use_beam_search",  # its beam width is `n`, which is capped
        "request_id",  # vLLM names the request by the gateway's x-request-id header instead
    }
)  # fmt: skip

# Why each of these is the operator's (the gateway's) to set, never a client's.
OPERATOR = {
    "priority": "vLLM's scheduling priority: with --scheduling-policy priority a client's "
    "would jump every queue; the gateway sets it for its background lane",
    "kv_transfer_params": "engine-internal: the KV-transfer connector of disaggregated serving",
    "ec_transfer_params": "engine-internal: the encoder-cache transfer of disaggregated serving",
    "vllm_xargs": "engine-internal: arguments of custom logits processors and extensions",
    "chat_template": "the prompt template is the model's: a client's Jinja would run in the "
    "engine (vLLM's template-injection advisories)",
    "chat_template_kwargs": "arguments of the model's prompt template, which is the operator's",
    "media_io_kwargs": "media loading is the gateway's (OCRVL_MEDIA_FETCH); vLLM never fetches",
    "cache_salt": "it picks the engine's prefix-cache partition; only the gateway may partition "
    "tenants, or a client could name another tenant's salt and share its cache",
    "guided_decoding_backend": "the grammar backend is the engine's --structured-outputs-config",
}

# mm_processor_kwargs: the pixel bounds (clamped to OCRVL_MAX_PIXELS by app/chat.py) and no
# other processor argument: `size`, `do_resize` and the like would resize around that clamp.
PIXEL_KWARGS = frozenset({"min_pixels", "max_pixels"})


class Checked(NamedTuple):
    """What the policy decided about one request (a tuple: it is made for every request)."""

    pages: int  # sequences it makes the engine decode at once (`n`): its weight in every limit
    edited: bool  # the payload was changed in place (legacy guided_* fields translated)


def apply(chat: ChatRequest, settings: Settings, model: dict[str, Any] | None) -> ChatRequest:
    """`chat` checked (400 naming the field and its setting), weighted and, if need be, edited.

    `model` is vLLM's /v1/models entry of the served model (its `max_model_len`), if known.
    """
    checked = check(chat.payload, settings, model_length(model))
    chat.pages = checked.pages
    chat.edited = chat.edited or checked.edited
    return chat


def with_priority(chat: ChatRequest, priority: int) -> ChatRequest:
    """`chat` with vLLM's scheduling `priority` set (lower runs earlier): the gateway only.

    For the background lane of jobs and batches, on engines started with
    `--scheduling-policy priority` (others answer 400 to any priority but 0). A client's own
    `priority` never gets this far: `check` refuses it.
    """
    if type(priority) is not int:
        raise TypeError(f"priority must be an int, not {type(priority).__name__}")
    chat.payload["priority"] = priority
    chat.edited = True
    return chat


def model_length(model: dict[str, Any] | None) -> int | None:
    """The served model's context length from its /v1/models entry, if it says."""
    length = model.get("max_model_len") if model is not None else None
    return length if type(length) is int and length > 0 else None


def check(payload: dict[str, Any], settings: Settings, model_len: int | None) -> Checked:
    """Judge every field of `payload`; InvalidRequest (400) for the first one refused.

    `model_len` is the served model's context length, if known (`model_length`).
    """
    pages, grammar = 1, False
    for name, value in payload.items():
        if name in PASSED or value is None:
            continue  # null is the same as leaving a field out, for vLLM too
        rule = RULES.get(name)
        if rule is not None:
            pages = max(pages, rule(name, value, settings, model_len))
        elif name in grammars.FIELDS:
            grammar = True  # judged together below: one may depend on another
        elif name in settings.pass_fields:
            continue
        elif name in OPERATOR:
            raise InvalidRequest(
                f"`{name}` is set by the gateway, not by clients: {OPERATOR[name]}. An operator "
                "can pass it unchanged with OCRVL_PASS_FIELDS.",
                param=name,
                code="operator_only_parameter",
            )
        else:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: {clip(name)} (docs/clients.md lists "
                "every field the gateway passes; an operator can pass others with "
                "OCRVL_PASS_FIELDS)",
                param=clip(name),
                code="unknown_parameter",
            )
    return Checked(pages, grammars.check(payload, settings) if grammar else False)


# ------------------------------------------------------------------------------ capped fields


def bounded_integer(name: str, value: object, low: int, high: int | None, setting: str) -> int:
    """`value` if it is a JSON integer in [low, high]; else the 400 that says which bound (the
    one wording and code of a bad integer on every route: chat, /v1/ocr, jobs)."""
    if type(value) is not int:  # vLLM would read "1000" or 3.0 as a number: not past the cap
        raise InvalidRequest(
            f"`{name}` must be an integer; got {quoted(value)}", param=name, code="invalid_type"
        )
    if value < low:
        raise InvalidRequest(
            f"`{name}` is {value}; it must be at least {low}",
            param=name,
            code="integer_below_min_value",
        )
    if high is not None and value > high:
        raise InvalidRequest(
            f"`{name}` is {value}; this gateway allows at most {high} ({setting})",
            param=name,
            code="integer_above_max_value",
        )
    return value


def _n(name: str, value: object, settings: Settings, model_len: int | None) -> int:
    """`n` (also the beam width): each sequence is a page to the engine, so each counts."""
    return bounded_integer(name, value, 1, settings.max_n, "OCRVL_MAX_N")


def _tokens(name: str, value: object, settings: Settings, model_len: int | None) -> int:
    """max_tokens, max_completion_tokens, min_tokens: within the served model's length."""
    low = 0 if name == "min_tokens" else 1
    bounded_integer(name, value, low, model_len, "the served model's max_model_len")
    return 1


def _logprobs(name: str, value: object, settings: Settings, model_len: int | None) -> int:
    """top_logprobs and prompt_logprobs (-1, the whole vocabulary, is over any cap)."""
    if value == -1 and type(value) is int:
        value = settings.max_logprobs + 1  # refused below as over the cap
    bounded_integer(name, value, 0, settings.max_logprobs, "OCRVL_MAX_LOGPROBS")
    return 1


def _token_ids(name: str, value: object, settings: Settings, model_len: int | None) -> int:
    """logprob_token_ids: at most OCRVL_MAX_LOGPROBS of them (vLLM checks the ids)."""
    if isinstance(value, list) and len(value) > settings.max_logprobs:
        raise InvalidRequest(
            f"`{name}` lists {len(value)} tokens; this gateway allows at most "
            f"{settings.max_logprobs} (OCRVL_MAX_LOGPROBS)",
            param=name,
            code="array_above_max_length",
        )
    return 1


def _strings(name: str, value: object, settings: Settings, model_len: int | None) -> int:
    """stop and bad_words: how many strings, and how long each (vLLM checks their types)."""
    strings = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if len(strings) > settings.max_stop_strings:
        raise InvalidRequest(
            f"`{name}` lists {len(strings)} strings; this gateway allows at most "
            f"{settings.max_stop_strings} (OCRVL_MAX_STOP_STRINGS)",
            param=name,
            code="array_above_max_length",
        )
    for index, text in enumerate(strings):
        if isinstance(text, str) and len(text) > settings.max_stop_length:
            where = name if isinstance(value, str) else f"{name}[{index}]"
            raise InvalidRequest(
                f"`{where}` is {len(text)} characters; this gateway allows at most "
                f"{settings.max_stop_length} (OCRVL_MAX_STOP_LENGTH)",
                param=where,
                code="string_above_max_length",
            )
    return 1


def _pixel_kwargs(name: str, value: object, settings: Settings, model_len: int | None) -> int:
    """mm_processor_kwargs: only the pixel bounds, which app/chat.py clamps."""
    if isinstance(value, dict):
        for key in value:
            if key not in PIXEL_KWARGS:
                raise InvalidRequest(
                    f"`{name}` may hold only min_pixels and max_pixels (held to "
                    f"OCRVL_MAX_PIXELS); {clip(str(key))!r} would let the image processor "
                    "resize around that cap",
                    param=f"{name}.{clip(str(key))}",
                    code="unsupported_parameter",
                )
    return 1


RULES: dict[str, Callable[[str, object, Settings, int | None], int]] = {
    "n": _n,
    "max_tokens": _tokens,
    "max_completion_tokens": _tokens,
    "min_tokens": _tokens,
    "top_logprobs": _logprobs,
    "prompt_logprobs": _logprobs,
    "logprob_token_ids": _token_ids,
    "stop": _strings,
    "bad_words": _strings,
    "mm_processor_kwargs": _pixel_kwargs,
}
