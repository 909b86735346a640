"""A real `ocrvl serve` that finds the real vLLM engine through DNS (dnsmasq), beside a fake pod."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import CLIENT_KEY, VLLMServer, _stop, start_gateway
from tests.support.dnsmasq import DOMAIN, Dnsmasq
from tests.support.fake_backend import SERVED, FakeVLLM
from tests.support.pages import data_url, document_page
from tests.support.servers import ThreadedServer

pytestmark = pytest.mark.vllm

NAME = f"vllm-headless.ocrvl.svc.{DOMAIN}"


def ready_backends(url: str) -> list[str]:
    response = httpx.get(f"{url}/ready", timeout=5)
    return list(response.json().get("backends", [])) if response.status_code == 200 else []


def wait_for_ready(url: str, expected: list[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while ready_backends(url) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"/ready lists {ready_backends(url)}, expected {expected}")
        time.sleep(0.2)


def page(url: str, model: str) -> httpx.Response:
    image = data_url(document_page(0, width=620, height=877))
    body = {
        "model": model,
        "max_tokens": 8,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": "OCR:"},
                ],
            }
        ],
    }
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def test_real_engine_leaves_and_rejoins_with_its_record(
    vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """Both pods of one dns+ name serve; the engine's record going and coming takes it out, back."""
    port = int(vllm_server.url.rsplit(":", 1)[1])  # the engine listens on 127.0.0.1 only
    engine, fake = vllm_server.url, FakeVLLM()
    with Dnsmasq(tmp_path) as dns, ThreadedServer(fake, host="127.0.0.2", port=port) as pod:
        dns.publish({NAME: ["127.0.0.1", "127.0.0.2"]})
        gateway = start_gateway(
            vllm_server,
            tmp_path,
            (CLIENT_KEY,),
            OCRVL_BACKENDS=f"dns+http://{NAME}:{port}",
            OCRVL_DNS_SERVER=dns.address,
            OCRVL_HEALTH_INTERVAL="0.5",
        )
        try:
            wait_for_ready(gateway.url, [engine, pod.url])
            read = page(gateway.url, vllm_server.served_model_name)
            faked = page(gateway.url, SERVED)
            dns.publish({NAME: ["127.0.0.2"]})
            wait_for_ready(gateway.url, [pod.url])
            gone = page(gateway.url, vllm_server.served_model_name)
            dns.publish({NAME: ["127.0.0.1", "127.0.0.2"]})
            wait_for_ready(gateway.url, [engine, pod.url])
            back = page(gateway.url, vllm_server.served_model_name)
        finally:
            _stop(gateway.process)
    assert read.status_code == 200, read.text
    assert read.json()["model"] == vllm_server.served_model_name
    assert faked.json()["choices"][0]["message"]["content"] == "Hello page"
    assert gone.status_code == 404  # no member serves the engine's model any more
    assert back.status_code == 200, back.text
    log = gateway.log_path.read_text()
    assert f"backend {engine} left the pool" in log
    assert f"{NAME} resolves to 127.0.0.1, 127.0.0.2" in log
