"""Document preprocessing end to end on real parts: the gateway in front of the real layout
service started with the tiny orientation and unwarping checkpoints (CPU), and a backend
answering by prompt (the VLM is not what is tested here: tests/real/test_layout_parsing.py
runs the real engine)."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from tests.paddlex.conftest import Answering, b64, gateway, page_png
from tests.support.layout_service import (
    LayoutService,
    preprocessing_flags,
    start_layout_service,
)
from tests.support.servers import serving


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LayoutService]:
    """The real layout service with the tiny preprocessing checkpoints."""
    started = start_layout_service(
        tmp_path_factory.mktemp("layout-pre") / "layout.log", *preprocessing_flags()
    )
    yield started
    started.stop()


def test_layout_parsing_runs_orientation_and_unwarping_in_the_real_service(
    service: LayoutService,
) -> None:
    """`useDocOrientationClassify` (and with it PaddleX's unwarping) through the real service:
    200, `doc_preprocessor_res` with the classifier's angle, the page measured as the service
    turned it, its blocks cut from that page, and `preprocessed_img` drawn."""

    async def read() -> dict[str, object]:
        with serving(Answering()) as fake:
            layout = SimpleNamespace(url=service.url)  # gateway() reads only its url
            async with gateway(fake, layout, request_timeout=300) as client:  # type: ignore[arg-type]
                body = {"file": b64(page_png()), "useDocOrientationClassify": True}
                response = await client.post("/layout-parsing", json=body)
        assert response.status_code == 200, response.text
        result: dict[str, object] = response.json()["result"]
        return result

    result = asyncio.run(read())
    [page] = result["layoutParsingResults"]  # type: ignore[index]
    pruned = page["prunedResult"]
    angle = pruned["doc_preprocessor_res"]["angle"]
    assert angle in (0, 90, 180, 270)
    assert pruned["doc_preprocessor_res"]["model_settings"] == {
        "use_doc_orientation_classify": True, "use_doc_unwarping": True,
    }  # fmt: skip
    turned = (800, 600) if angle in (90, 270) else (600, 800)
    assert (pruned["width"], pruned["height"]) == turned
    drawn = base64.b64decode(page["outputImages"]["layout_det_res"])
    with Image.open(io.BytesIO(drawn)) as image:
        assert image.size == turned
    assert "preprocessed_img" in page["outputImages"]


def test_a_deployment_without_the_models_says_so(layout_service: str, tmp_path: Path) -> None:
    """The session's layout service has no preprocessing checkpoints: `useDocUnwarping` is a
    422 saying it is not available on this deployment."""

    async def read() -> tuple[int, str]:
        with serving(Answering()) as fake:
            layout = SimpleNamespace(url=layout_service)
            async with gateway(fake, layout) as client:  # type: ignore[arg-type]
                body = {"file": b64(page_png()), "useDocUnwarping": True}
                response = await client.post("/layout-parsing", json=body)
        return response.status_code, response.json()["errorMsg"]

    status, message = asyncio.run(read())
    assert status == 422
    assert "not available on this deployment" in message
