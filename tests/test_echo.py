"""Nothing a client sends is echoed whole: names, URLs and values that an answer or a log line
quotes back are cut to 200 characters, their length stated (app/errors.py, docs/clients.md)."""

from __future__ import annotations

import json
import logging

import httpx
import orjson
import pytest

from app.errors import MESSAGE_LIMIT, QUOTE_LIMIT, clip, quoted
from app.logs import JSONFormatter
from tests.support.fake_backend import FakeVLLM

pytestmark = pytest.mark.anyio
BIG = 2_000_000  # characters: a 2 MB name or value
KB = 1024
MESSAGES = [{"role": "user", "content": "OCR:"}]


def message_of(response: httpx.Response) -> str:
    """The OpenAI error message of a short answer (the test fails on a long one)."""
    assert len(response.content) < KB, f"{len(response.content)} bytes answered"
    message: str = response.json()["error"]["message"]
    return message


def test_short_text_is_kept_and_long_text_is_cut_with_its_length() -> None:
    """clip/quoted keep what fits; past QUOTE_LIMIT they keep that much and say how long it was,
    escapes included in the count (a NUL byte is four characters of repr)."""
    assert clip("tiny") == "tiny"
    assert quoted("tiny") == "'tiny'"
    assert clip("x" * 5000) == "x" * QUOTE_LIMIT + "... (5000 characters)"
    assert quoted("x" * 5000) == "'" + "x" * (QUOTE_LIMIT - 1) + "... (5000 characters)"
    assert len(quoted("\x00" * BIG)) == QUOTE_LIMIT + len(f"... ({BIG} characters)")
    assert quoted(["a"] * BIG).endswith(f"... ({len(repr(['a'] * BIG))} characters)")


async def test_a_2_mb_model_name_gets_a_short_404_and_a_short_access_line(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """The 404 model_not_found for a 2,000,000-character `model` is under 1 KB, and so is its
    access line; both keep the name's start and state its length."""
    logging.getLogger("ocrvl").propagate = True
    body = {"model": "m" * BIG, "messages": MESSAGES}
    with caplog.at_level(logging.INFO, logger="ocrvl.access"):
        response = await gateway_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    message = message_of(response)
    assert message.startswith("the model 'mmmm")
    assert f"({BIG} characters) does not exist" in message
    line = JSONFormatter().format(caplog.records[-1])
    assert len(line.encode()) < KB
    assert json.loads(line)["model"] == "m" * QUOTE_LIMIT + f"... ({BIG} characters)"
    assert not fake.bodies  # nothing went to the backend


@pytest.mark.parametrize("field", ["task", "dpi", "max_tokens", "stream", "pages"])
async def test_ocr_options_are_quoted_back_cut(
    gateway_client: httpx.AsyncClient, field: str
) -> None:
    """A 2 MB value of each /v1/ocr option that the 400 quotes is cut, its length stated."""
    body = {"file": "AAAA", field: "9-x" * (BIG // 3)}
    response = await gateway_client.post("/v1/ocr", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == field
    assert f"({BIG // 3 * 3} characters)" in message_of(response)


async def test_a_2_mb_url_is_quoted_back_cut(gateway_client: httpx.AsyncClient) -> None:
    """A chat image URL and an /v1/ocr file URL of 2 MB: refused in under 1 KB."""
    url = "http://127.0.0.1/" + "u" * BIG
    part = {"type": "image_url", "image_url": {"url": url}}
    chat = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": [part]}]}
    for response in (
        await gateway_client.post("/v1/chat/completions", json=chat),
        await gateway_client.post("/v1/ocr", json={"file": url}),
    ):
        assert response.status_code == 400
        assert f"({len(url)} characters)" in message_of(response)


async def test_a_backend_message_that_repeats_the_input_is_cut(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A vLLM 400 whose message repeats 50,000 characters of the request (injected by the fake;
    the gateway reads 64 KiB of an error body) reaches the client as its first MESSAGE_LIMIT
    characters and its length."""
    echoed = "Input should be a valid dictionary, input: " + "i" * 50_000
    fake.mode, fake.status = "status", 400
    fake.error_body = orjson.dumps({"error": {"message": echoed, "type": "BadRequestError"}})
    response = await gateway_client.post(
        "/v1/chat/completions", json={"model": "PaddleOCR-VL", "messages": MESSAGES}
    )
    assert response.status_code == 400
    assert len(response.content) < 2 * KB
    message = response.json()["error"]["message"]
    assert message == echoed[:MESSAGE_LIMIT] + f"... ({len(echoed)} characters)"
