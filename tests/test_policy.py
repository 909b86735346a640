"""The request policy as a behaviour matrix: field x value -> passed, capped or 400 (app/policy.py),
and what `n` weighs in the per-key limits and the scheduler."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app import chat, grammars, policy
from app.auth import KeyLimits
from app.errors import InvalidRequest, RateLimited
from app.main import create_app
from app.metrics import Metrics
from app.quotas import Limits, Quotas
from app.settings import Settings
from tests.conftest import CLIENT_KEY, settings_for
from tests.support.documents import pdf
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.pages import paddleocr_body
from tests.support.redis_server import RedisServer
from tests.support.servers import lifespan_client

MODEL_LEN = 4096
MESSAGES = [{"role": "user", "content": "OCR:"}]
OFF = settings_for("http://127.0.0.1:9")
ON = settings_for("http://127.0.0.1:9", structured_outputs="on")
SCHEMA = {"type": "object", "properties": {"total": {"type": "number"}}}
PADDLEOCR = paddleocr_body("PaddleOCR-VL-1.6-0.9B")  # what its pipeline client sends


def nested(depth: int) -> dict[str, Any]:
    """A JSON schema of `depth` nested objects: 2 * depth + 1 JSON levels (16 is the cap)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def judge(fields: dict[str, Any], settings: Settings = OFF) -> policy.Checked:
    """The policy's verdict on a minimal chat request with `fields`."""
    return policy.check({"model": SERVED, "messages": MESSAGES, **fields}, settings, MODEL_LEN)


# field, value: passed unchanged, one page
PASSED = [
    ("temperature", 0), ("top_p", 0.9), ("top_k", 5), ("min_p", 0.1), ("seed", 12345),
    ("seed", -(2**63)), ("repetition_penalty", 1.05), ("skip_special_tokens", False),
    ("frequency_penalty", 0.5), ("presence_penalty", 0.5), ("logprobs", True),
    ("stream", True), ("stream_options", {"include_usage": True}), ("user", "u-1"),
    ("ignore_eos", True), ("stop_token_ids", [2]), ("logit_bias", {"5": -100}),
    ("response_format", {"type": "text"}), ("tool_choice", "none"), ("tools", []),
    ("use_beam_search", True), ("request_id", "client-id"), ("metadata", {"a": "b"}),
    ("mm_processor_kwargs", {"min_pixels": 112896, "max_pixels": 10**9}),  # clamped later
    ("priority", None),  # null is the same as leaving it out
]  # fmt: skip
# field, value, settings: within a cap
WITHIN = [
    ("n", 1, OFF), ("n", 3, settings_for("http://127.0.0.1:9", max_n=3)),
    ("max_tokens", MODEL_LEN, OFF), ("max_completion_tokens", 1, OFF), ("min_tokens", 0, OFF),
    ("top_logprobs", 20, OFF), ("prompt_logprobs", 0, OFF), ("logprob_token_ids", [1] * 20, OFF),
    ("stop", ["a"] * 4, OFF), ("stop", "x" * 64, OFF), ("bad_words", ["b"] * 4, OFF),
    ("structured_outputs", {"json": SCHEMA}, ON), ("structured_outputs", {"regex": "\\d+"}, ON),
    ("structured_outputs", {"choice": ["a", "b"]}, ON),
    ("response_format", {"type": "json_object"}, ON),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": SCHEMA}}, ON),
    ("tool_choice", "required", ON), ("structured_outputs", {"json": nested(7)}, ON),
]  # fmt: skip
# field, value, settings, param, code, the setting (or reason) the message names
REFUSED = [
    ("n", 2, OFF, "n", "integer_above_max_value", "OCRVL_MAX_N"),
    ("n", 1000, OFF, "n", "integer_above_max_value", "OCRVL_MAX_N"),
    ("n", "1000", OFF, "n", "invalid_type", "integer"),
    ("n", 3.0, OFF, "n", "invalid_type", "integer"),
    ("n", True, OFF, "n", "invalid_type", "integer"),
    ("n", 0, OFF, "n", "integer_below_min_value", "at least 1"),
    ("max_tokens", MODEL_LEN + 1, OFF, "max_tokens", "integer_above_max_value", "max_model_len"),
    ("max_completion_tokens", 10**6, OFF, "max_completion_tokens", "integer_above_max_value",
     "max_model_len"),
    ("min_tokens", MODEL_LEN + 1, OFF, "min_tokens", "integer_above_max_value", "max_model_len"),
    ("max_tokens", "4096", OFF, "max_tokens", "invalid_type", "integer"),
    ("top_logprobs", 21, OFF, "top_logprobs", "integer_above_max_value", "OCRVL_MAX_LOGPROBS"),
    ("top_logprobs", -1, OFF, "top_logprobs", "integer_above_max_value", "OCRVL_MAX_LOGPROBS"),
    ("prompt_logprobs", -1, OFF, "prompt_logprobs", "integer_above_max_value",
     "OCRVL_MAX_LOGPROBS"),
    ("logprob_token_ids", [1] * 21, OFF, "logprob_token_ids", "array_above_max_length",
     "OCRVL_MAX_LOGPROBS"),
    ("stop", ["a"] * 5, OFF, "stop", "array_above_max_length", "OCRVL_MAX_STOP_STRINGS"),
    ("stop", "x" * 65, OFF, "stop", "string_above_max_length", "OCRVL_MAX_STOP_LENGTH"),
    ("stop", ["ok", "x" * 65], OFF, "stop[1]", "string_above_max_length", "OCRVL_MAX_STOP_LENGTH"),
    ("bad_words", ["b"] * 5, OFF, "bad_words", "array_above_max_length", "OCRVL_MAX_STOP_STRINGS"),
    ("mm_processor_kwargs", {"do_resize": False}, OFF, "mm_processor_kwargs.do_resize",
     "unsupported_parameter", "OCRVL_MAX_PIXELS"),
    ("mm_processor_kwargs", {"size": {"longest_edge": 10**5}}, OFF, "mm_processor_kwargs.size",
     "unsupported_parameter", "OCRVL_MAX_PIXELS"),
    *[(name, value, OFF, name, "operator_only_parameter", "OCRVL_PASS_FIELDS") for name, value in [
        ("priority", -100), ("priority", 0), ("kv_transfer_params", {"do_remote_decode": True}),
        ("ec_transfer_params", {}), ("vllm_xargs", {"x": 1}), ("chat_template", "{{ 1 }}"),
        ("chat_template_kwargs", {"a": 1}), ("media_io_kwargs", {"image": {}}),
        ("cache_salt", "tenant-b"), ("guided_decoding_backend", "xgrammar"),
    ]],
    *[(name, value, OFF, name, "structured_outputs_disabled", "OCRVL_STRUCTURED_OUTPUTS")
      for name, value in [
        ("structured_outputs", {"regex": "(a|aa)*"}), ("guided_regex", "\\d+"),
        ("guided_json", SCHEMA), ("guided_choice", ["a"]), ("guided_grammar", "root ::= 'a'"),
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
        ("response_format", {"type": "structural_tag", "format": {}}),
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]),
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "f"}}),
    ]],
    ("structured_outputs", {"regex": "a" * 16385}, ON, "structured_outputs.regex",
     "structured_output_too_large", "OCRVL_STRUCTURED_MAX_BYTES"),
    ("structured_outputs", {"json": nested(8)}, ON, "structured_outputs.json",
     "structured_output_too_deep", "OCRVL_STRUCTURED_MAX_DEPTH"),
    ("structured_outputs", {"regex": "(" * 17 + ")" * 17}, ON, "structured_outputs.regex",
     "structured_output_too_deep", "OCRVL_STRUCTURED_MAX_DEPTH"),
    ("guided_grammar", "x" * 20000, ON, "structured_outputs.grammar",
     "structured_output_too_large", "OCRVL_STRUCTURED_MAX_BYTES"),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": nested(8)}}, ON,
     "response_format", "structured_output_too_deep", "OCRVL_STRUCTURED_MAX_DEPTH"),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": nested(8)}}], ON,
     "tools[0].function.parameters", "structured_output_too_deep", "OCRVL_STRUCTURED_MAX_DEPTH"),
    ("pad", "x", OFF, "pad", "unknown_parameter", "OCRVL_PASS_FIELDS"),
    ("future_engine_knob", {"a": 1}, OFF, "future_engine_knob", "unknown_parameter",
     "OCRVL_PASS_FIELDS"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), PASSED)
def test_passed_fields_go_unchanged_as_one_page(field: str, value: object) -> None:
    """OpenAI's fields and vLLM's sampling extras pass: one page, the payload untouched."""
    payload = {"model": SERVED, "messages": MESSAGES, field: value}
    before = copy.deepcopy(payload)
    assert policy.check(payload, OFF, MODEL_LEN) == policy.Checked(pages=1, edited=False)
    assert payload == before


@pytest.mark.parametrize(("field", "value", "settings"), WITHIN)
def test_capped_fields_within_their_cap_pass(field: str, value: object, settings: Settings) -> None:
    """A capped field at or under its setting passes; `n` weighs its value in pages."""
    checked = judge({field: value}, settings)
    assert checked.pages == (value if field == "n" else 1)


@pytest.mark.parametrize(("field", "value", "settings", "param", "code", "names"), REFUSED)
def test_refused_fields_get_a_400_naming_param_and_setting(
    field: str, value: object, settings: Settings, param: str, code: str, names: str
) -> None:
    """Past a cap, operator-only, a disabled grammar or unknown: 400 with `param`, the code,
    and the setting that governs it in the message."""
    with pytest.raises(InvalidRequest) as raised:
        judge({field: value}, settings)
    error = raised.value
    assert (error.status, error.param, error.code) == (400, param, code)
    assert names in error.message


def test_paddleocr_clients_body_passes_untouched() -> None:
    """PaddleOCR's pipeline client's request passes as one page, byte for byte."""
    raw = json.dumps(PADDLEOCR).encode()
    parsed = policy.apply(chat.parse(raw), OFF, {"id": SERVED, "max_model_len": MODEL_LEN})
    assert (parsed.pages, parsed.edited) == (1, False)
    assert parsed.for_backend("PaddleOCR-VL-1.6-0.9B", 1_003_520) is raw


def test_unknown_model_length_leaves_max_tokens_to_vllm() -> None:
    """Without the served model's max_model_len, any integer max_tokens passes on to vLLM."""
    checked = policy.check({"max_tokens": 10**9}, OFF, policy.model_length({"id": SERVED}))
    assert checked.pages == 1


def test_pass_fields_lets_an_operator_allow_a_refused_field() -> None:
    """OCRVL_PASS_FIELDS passes an operator-only or unknown field unchanged."""
    settings = settings_for("http://127.0.0.1:9", pass_fields="priority, future_knob")
    assert settings.pass_fields == ["priority", "future_knob"]
    assert judge({"priority": -5, "future_knob": 1}, settings).pages == 1


def test_a_huge_unknown_field_name_is_quoted_short() -> None:
    """A 100 kB field name gives a short message and `param`, its length stated."""
    with pytest.raises(InvalidRequest) as raised:
        judge({"k" * 100_000: 1})
    assert len(raised.value.message) < 1000
    assert raised.value.param is not None
    assert len(raised.value.param) < 300


def test_legacy_guided_fields_become_structured_outputs_when_on() -> None:
    """With structured outputs on, guided_* (which vLLM 0.32 ignores) are translated."""
    payload = {"model": SERVED, "messages": MESSAGES, "guided_regex": "\\d+"}
    checked = policy.check(payload, ON, MODEL_LEN)
    assert checked.edited
    assert payload == {
        "model": SERVED,
        "messages": MESSAGES,
        "structured_outputs": {"regex": "\\d+"},
    }
    sent = json.loads(policy.apply(chat.parse(json.dumps(payload).encode()), ON, None).raw)
    assert "guided_regex" not in sent


def test_legacy_and_new_structured_fields_together_are_refused() -> None:
    """guided_json beside structured_outputs: 400 naming the legacy field."""
    with pytest.raises(InvalidRequest) as raised:
        judge({"guided_json": SCHEMA, "structured_outputs": {"json": SCHEMA}}, ON)
    assert raised.value.param == "guided_json"


def test_with_priority_is_how_the_gateway_sets_priority() -> None:
    """The background lane's priority reaches the body sent, though no client may send one."""
    parsed = chat.parse(json.dumps({"model": SERVED, "messages": MESSAGES}).encode())
    sent = json.loads(policy.with_priority(parsed, 10).for_backend(SERVED, 1_003_520))
    assert sent["priority"] == 10
    with pytest.raises(TypeError):
        policy.with_priority(parsed, "10")  # type: ignore[arg-type]


def test_depth_counts_nesting_not_size() -> None:
    """json_depth counts containers; text_depth counts unescaped brackets."""
    assert grammars.json_depth("x") == 0
    assert grammars.json_depth({"a": [1, {"b": []}]}) == 4
    assert grammars.text_depth("a(b[c])\\(\\(\\(") == 2


SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=80)
)
# JSON two containers deep, spelt out (st.recursive's self-check misfires under some draws)
SHALLOW = SCALARS | st.lists(SCALARS, max_size=4) | st.dictionaries(st.text(max_size=8), SCALARS)
FIELD_VALUES = (
    SHALLOW
    | st.lists(SHALLOW, max_size=4)
    | st.dictionaries(st.text(max_size=8), SHALLOW, max_size=4)
)
FIELDS = st.sampled_from(
    sorted({*policy.PASSED, *policy.OPERATOR, *policy.RULES, *grammars.FIELDS, "unknown"})
)


@given(st.dictionaries(FIELDS, FIELD_VALUES, max_size=6), st.booleans())
def test_any_field_values_are_judged_without_crashing(fields: dict[str, Any], on: bool) -> None:
    """Any JSON in any field: a verdict, or a 400 with a message and a `param`; never a crash."""
    problem: InvalidRequest | None = None
    try:
        checked = policy.check(dict(fields), ON if on else OFF, MODEL_LEN)
    except InvalidRequest as error:
        problem = error
    if problem is None:
        assert 1 <= checked.pages <= OFF.max_n
    else:
        assert problem.status == 400
        assert problem.message
        assert problem.param


# --------------------------------------------------------------------- n weighs n pages


def metrics() -> Metrics:
    """A fresh metrics registry (per-key 429s are counted there)."""
    return Metrics()


@pytest.mark.anyio
async def test_n_counts_as_n_slots_of_a_keys_concurrency() -> None:
    """Quotas.admit(pages=3) takes 3 of a key's slots: with 4, a second such request is 429."""
    quotas = Quotas(Limits(0, 4), lambda _: KeyLimits(), metrics())
    first = await quotas.admit("k", pages=3)
    with pytest.raises(RateLimited):
        await quotas.admit("k", pages=2)
    assert first is not None
    assert first.release is not None
    await first.release()
    again = await quotas.admit("k", pages=4)
    assert again is not None


@pytest.mark.anyio
async def test_n_takes_n_redis_leases_all_or_none(tmp_path: Path) -> None:
    """Shared through a real redis-server: pages=3 of 4 slots, then pages=2 is refused and
    leaves no lease behind (one is free for pages=1); the release frees all three."""
    server = RedisServer(tmp_path, "pw").start()
    try:
        quotas = Quotas(Limits(0, 4), lambda _: KeyLimits(), metrics(), redis_url=server.url)
        await quotas.start()
        try:
            first = await quotas.admit("k", pages=3)
            assert quotas.storage() == "redis"
            with pytest.raises(RateLimited):
                await quotas.admit("k", pages=2)
            single = await quotas.admit("k")
            assert first is not None
            assert first.release is not None
            assert single is not None
            assert single.release is not None
            await first.release()
            await single.release()
            assert await quotas.admit("k", pages=4) is not None
        finally:
            await quotas.close()
    finally:
        server.stop()


@pytest.mark.anyio
async def test_n_over_a_keys_concurrency_can_never_be_admitted() -> None:
    """n=3 against a concurrency of 2: 429 that tells the SDK not to retry."""
    quotas = Quotas(Limits(0, 2), lambda _: KeyLimits(), metrics())
    with pytest.raises(RateLimited) as raised:
        await quotas.widen("k", 3)
    assert raised.value.headers()["x-should-retry"] == "false"
    assert "n=3" in raised.value.message


@pytest.mark.anyio
async def test_n_counts_as_n_requests_per_minute() -> None:
    """Quotas.admit(pages=3) uses 3 of a key's requests per minute."""
    quotas = Quotas(Limits(5, 0), lambda _: KeyLimits(), metrics())
    grant = await quotas.admit("k", pages=3)
    assert grant is not None
    assert (b"x-ratelimit-remaining-requests", b"2") in grant.headers
    with pytest.raises(RateLimited):
        await quotas.admit("k", pages=3)


@pytest.mark.anyio
async def test_n_through_the_gateway_counts_against_the_keys_concurrency(fake: FakeVLLM) -> None:
    """With OCRVL_MAX_N=3 and a key concurrency of 3, n=3 is served and n=4 is 400; with a
    concurrency of 2, n=3 is 429 (never admissible) and nothing reaches the backend."""
    body = {"model": SERVED, "messages": MESSAGES, "n": 3}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    for concurrency, status in ((3, 200), (2, 429)):
        app = create_app(settings_for(fake.url, max_n=3, key_concurrency=concurrency))
        async with lifespan_client(app, headers=headers) as client:
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == status, response.text
            too_many = await client.post("/v1/chat/completions", json={**body, "n": 4})
            assert too_many.status_code == 400
            assert too_many.json()["error"]["param"] == "n"
            again = await client.post("/v1/chat/completions", json=body)  # all 3 came back
            assert again.status_code == status, again.text
    assert [sent["n"] for sent in fake.bodies] == [3, 3]


@pytest.mark.anyio
async def test_ocr_max_tokens_past_the_model_length_is_refused_before_any_page(
    fake: FakeVLLM,
) -> None:
    """/v1/ocr's `max_tokens` goes through the same policy: past max_model_len (the fake's
    4096), 400 naming it, and no page reaches the backend."""
    settings = settings_for(fake.url, preprocess_workers=1)
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    files = {"file": ("doc.pdf", pdf(2, 200, 280), "application/pdf")}
    async with lifespan_client(create_app(settings), headers=headers, timeout=60) as client:
        response = await client.post("/v1/ocr", files=files, data={"max_tokens": "5000"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "integer_above_max_value")
    assert "max_model_len" in error["message"]
    assert fake.bodies == []
