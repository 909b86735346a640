"""Dynamic batching in the real layout service, read from its /metrics: concurrent single-page
requests share forward passes, each gets its own page back, and a queue that cannot take a
request refuses it at once (503 with Retry-After)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from tests.support.layout_pages import layout_page, png
from tests.support.layout_service import start_layout_service
from tests.support.pages import data_url
from tests.support.prometheus import metric

pytestmark = pytest.mark.engine

REQUESTS = 16
# A batch waits up to a second for more pages after its first: the sixteen requests below reach
# the queue within that time on any machine, so they cannot need sixteen passes. Half the
# settings come as flags, half as OCRVL_LAYOUT_* variables (the queue's size shows they count).
FLAGS = ("--max-batch", "8", "--max-wait-ms", "1000")
ENV = {
    "OCRVL_LAYOUT_MAX_QUEUE": "20",
    "OCRVL_LAYOUT_MAX_IMAGES": "24",
    "OCRVL_LAYOUT_MAX_REQUEST_BYTES": "400000",
}


@pytest.fixture(scope="module")
def batching_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A layout service of its own: max batch 8, max wait 1 s, a queue of 20 pages, bodies up
    to 400 kB."""
    log = tmp_path_factory.mktemp("layout-batching") / "layout.log"
    service = start_layout_service(log, *FLAGS, **ENV)
    yield service.url
    service.stop()


def scrape(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=30).text


async def one_page_each(url: str, pages: list[str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return list(
            await asyncio.gather(
                *(client.post(f"{url}/v1/layout", json={"images": [page]}) for page in pages)
            )
        )


def test_concurrent_single_page_requests_share_forward_passes(batching_service: str) -> None:
    """Sixteen concurrent one-page requests: fewer forward passes than requests, a batch of more
    than one page, sixteen pages counted, and each answer is its own page's (by its size)."""
    sizes = [(600 + 40 * i, 900 + 25 * i) for i in range(REQUESTS)]
    pages = [data_url(png(layout_page(i, w, h)), "image/png") for i, (w, h) in enumerate(sizes)]
    before = scrape(batching_service)
    responses = asyncio.run(one_page_each(batching_service, pages))
    after = scrape(batching_service)
    assert [r.status_code for r in responses] == [200] * REQUESTS
    for response, (width, height) in zip(responses, sizes, strict=True):
        (result,) = response.json()["results"]
        assert (result["width"], result["height"]) == (width, height)

    def grew(name: str) -> float:
        return metric(after, name) - metric(before, name)

    passes = grew("ocrvl_layout_forward_passes_total")
    assert grew("ocrvl_layout_pages_total") == REQUESTS
    assert grew("ocrvl_layout_batch_size_sum") == REQUESTS
    assert grew("ocrvl_layout_batch_size_count") == passes
    assert 1 <= passes < REQUESTS, f"{passes:.0f} forward passes for {REQUESTS} pages"
    singles = metric(after, "ocrvl_layout_batch_size_bucket", le="1.0") - metric(
        before, "ocrvl_layout_batch_size_bucket", le="1.0"
    )
    assert singles < passes, "every pass ran a single page"
    assert grew("ocrvl_layout_queue_wait_seconds_count") == REQUESTS


def test_a_request_the_queue_cannot_take_is_refused_at_once(batching_service: str) -> None:
    """More pages than --max-queue in one request: 503 `server_overloaded` with Retry-After,
    counted as overloaded, and the next request is served."""
    page = data_url(png(layout_page(1, 400, 500)), "image/png")
    before = scrape(batching_service)
    response = httpx.post(f"{batching_service}/v1/layout", json={"images": [page] * 21}, timeout=60)
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "server_overloaded")
    after = scrape(batching_service)
    assert (
        metric(after, "ocrvl_layout_requests_total", outcome="overloaded")
        - metric(before, "ocrvl_layout_requests_total", outcome="overloaded")
        == 1
    )
    assert metric(after, "ocrvl_layout_pages_total") == metric(before, "ocrvl_layout_pages_total")
    served = httpx.post(f"{batching_service}/v1/layout", json={"images": [page]}, timeout=60)
    assert served.status_code == 200


def test_a_body_over_the_limit_is_a_413(batching_service: str) -> None:
    """OCRVL_LAYOUT_MAX_REQUEST_BYTES: a larger body is refused with 413 `request_too_large`."""
    noise = Image.frombytes("RGB", (600, 600), random.Random(5).randbytes(600 * 600 * 3))
    page = data_url(png(noise), "image/png")
    assert len(page) > 400_000
    response = httpx.post(f"{batching_service}/v1/layout", json={"images": [page]}, timeout=60)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{batching_service}/ready").status_code == 200


def test_max_queue_counts_every_page_a_request_holds_until_it_is_answered() -> None:
    """--max-queue counts the pages of every request admitted, from before decoding to the end
    of its pass (not only those waiting for a batch): 15 of 20 held, 6 more are refused at once
    and 5 fit; once the 15 are answered, 20 fit; ocrvl_layout_held_pages says how many."""
    from ocrvl_layout.batcher import Batcher  # noqa: PLC0415
    from ocrvl_layout.errors import Overloaded  # noqa: PLC0415
    from ocrvl_layout.metrics import Metrics  # noqa: PLC0415

    metrics = Metrics()
    batcher = Batcher(None, metrics, max_batch=8, max_wait=0.01, max_queue=20)  # type: ignore[arg-type]

    def held() -> float | None:
        """What /metrics says (ocrvl_layout_held_pages), checked against the batcher's count."""
        shown = metrics.registry.get_sample_value("ocrvl_layout_held_pages")
        assert shown == batcher.held
        return shown

    with batcher.admitted(15):
        with pytest.raises(Overloaded) as refused, batcher.admitted(6):
            pytest.fail("admitted past --max-queue")
        assert "holds 15 pages and 6 more would pass its limit of 20" in refused.value.message
        with batcher.admitted(5):
            assert held() == 20
    assert held() == 0
    with batcher.admitted(20):
        assert held() == 20
