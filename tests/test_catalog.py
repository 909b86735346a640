"""Models: the served list with PaddleOCR-VL aliases, alias rewriting, 404 for the unknown."""

from __future__ import annotations

import httpx
import pytest

from app.catalog import ALIASES, resolve
from tests.support.fake_backend import SERVED, FakeVLLM

pytestmark = pytest.mark.anyio
MESSAGES = [{"role": "user", "content": "OCR:"}]


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
async def test_models_lists_served_first_then_every_alias(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM, path: str
) -> None:
    """The first entry is the backend's served model (PaddleOCR reads data[0]); aliases follow."""
    response = await gateway_client.get(path)
    assert response.status_code == 200
    ids = [entry["id"] for entry in response.json()["data"]]
    assert ids == [SERVED, *ALIASES]
    assert response.json()["data"][1]["root"] == SERVED


@pytest.mark.parametrize("alias", ALIASES)
async def test_aliases_are_rewritten_to_the_served_name(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM, alias: str
) -> None:
    """Each PaddleOCR-VL name reaches vLLM as its served name (PaddleOCR#17603)."""
    response = await gateway_client.post(
        "/v1/chat/completions", json={"model": alias, "messages": MESSAGES}
    )
    assert response.status_code == 200
    assert fake.bodies[-1]["model"] == SERVED


async def test_unknown_model_is_404_listing_known_names(
    gateway_client: httpx.AsyncClient, fake: FakeVLLM
) -> None:
    """A model nobody serves: 404 `model_not_found`, the message lists what exists."""
    response = await gateway_client.post(
        "/v1/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}
    )
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert "'gpt-4o'" in error["message"]
    for name in (SERVED, *ALIASES):
        assert name in error["message"]
    assert fake.bodies == []


@pytest.mark.parametrize(
    ("alias", "served"),
    [
        ("PaddleOCR-VL-1.6-0.9B", "PaddlePaddle/PaddleOCR-VL-1.6"),
        ("PaddleOCR-VL-1.6", "PaddlePaddle/PaddleOCR-VL-1.6"),
        ("PaddleOCR-VL-1.5-0.9B", "PaddleOCR-VL-1.5-0.9B"),
        ("PaddleOCR-VL-0.9B", "paddleocr-vl-0.9b"),
        ("PaddleOCR-VL", "paddleocr-vl-0.9b"),
    ],
)
def test_an_alias_goes_to_the_served_model_of_its_version(alias: str, served: str) -> None:
    """With 1.0, 1.5 and 1.6 served side by side, PaddleOCR's name for a pipeline version
    (`PaddleOCR-VL-1.6-0.9B` for its default `v1.6`) reaches that version's model."""
    models = {name: {"id": name} for name in (
        "PaddleOCR-VL-1.5-0.9B", "PaddlePaddle/PaddleOCR-VL-1.6", "paddleocr-vl-0.9b",
    )}  # fmt: skip
    assert resolve(alias, models) == served


def test_an_alias_of_a_version_not_served_goes_to_the_first_served_model() -> None:
    """Only 1.5 served: PaddleOCR 3.7's default `PaddleOCR-VL-1.6-0.9B` still reads (as before)."""
    models = {"mine": {"id": "mine"}, "PaddleOCR-VL-1.5-0.9B": {"id": "PaddleOCR-VL-1.5-0.9B"}}
    assert resolve("PaddleOCR-VL-1.6-0.9B", models) == "mine"
