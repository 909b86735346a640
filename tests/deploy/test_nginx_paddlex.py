"""nginx in front of PaddleX's serving API (/layout-parsing, /restructure-pages): a whole
document under /v1/ocr's body cap, nginx's own errors in PaddleX's envelope, and the gateway's
answers (success and error) passed through as they are."""

from __future__ import annotations

import httpx
import pytest

from app.main import create_app
from tests.conftest import CLIENT_KEY, settings_for
from tests.deploy.conftest import StartNginx
from tests.deploy.nginx import free_port
from tests.paddlex.conftest import b64, page_png, services
from tests.support.servers import serving

ROUTES = ("/layout-parsing", "/restructure-pages")
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}


def paddlex_error(response: httpx.Response, status: int) -> str:
    """The message of nginx's error, once its status and PaddleX's envelope are checked."""
    assert response.status_code == status, response.text[:300]
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"logId", "errorCode", "errorMsg"}
    assert body["errorCode"] == status
    assert len(body["logId"]) == 32  # nginx's $request_id
    message: str = body["errorMsg"]
    return message


@pytest.mark.parametrize("path", ROUTES)
def test_a_dead_gateway_gets_paddlexs_502_with_retry_after(
    start_nginx: StartNginx, path: str
) -> None:
    """Nothing listens upstream: the 502 is in PaddleX's envelope, with Retry-After."""
    with start_nginx(f"127.0.0.1:{free_port()}") as front:
        response = httpx.post(f"{front.url}{path}", json={"file": "x"})
    assert "not reachable" in paddlex_error(response, 502)
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize("path", ROUTES)
def test_a_body_over_the_document_cap_gets_paddlexs_413(start_nginx: StartNginx, path: str) -> None:
    """Over NGINX_OCR_MAX_BODY_SIZE (here 1m) nginx refuses the body itself, naming the cap and
    the file limit; the general 20m cap does not apply below it."""
    with start_nginx(f"127.0.0.1:{free_port()}", NGINX_OCR_MAX_BODY_SIZE="1m") as front:
        response = httpx.post(f"{front.url}{path}", content=b"\0" * (2 * 1024 * 1024))
    message = paddlex_error(response, 413)
    assert "larger than 1m" in message
    assert "OCRVL_MAX_FILE_BYTES" in message


@pytest.mark.parametrize("path", ROUTES)
def test_a_burst_gets_paddlexs_429_with_retry_after(start_nginx: StartNginx, path: str) -> None:
    """Over the per-key limit, nginx's 429 is in PaddleX's envelope with Retry-After."""
    limits = {"NGINX_RATE_PER_KEY": "1r/s", "NGINX_BURST_PER_KEY": "1"}
    headers = {"authorization": "Bearer sk-burst"}
    with start_nginx(f"127.0.0.1:{free_port()}", **limits) as front:
        answers = [httpx.post(f"{front.url}{path}", headers=headers) for _ in range(4)]
    limited = [a for a in answers if a.status_code == 429]
    assert limited
    for answer in limited:
        assert "Rate limit" in paddlex_error(answer, 429)
        assert answer.headers["retry-after"] == "1"


def test_the_gateways_answers_pass_through(start_nginx: StartNginx) -> None:
    """Through nginx a page is read (200, PaddleX's answer) and the gateway's own refusal keeps
    its status and envelope: nginx does not replace an upstream's error."""
    with services() as (fake, layout):
        settings = settings_for(fake.url, layout_url=[layout.url], preprocess_workers=1)
        with serving(create_app(settings)) as app, start_nginx(app.url) as front:  # type: ignore[attr-defined]
            body = {"file": b64(page_png()), "visualize": False}
            read = httpx.post(f"{front.url}/layout-parsing", json=body, headers=AUTH, timeout=60)
            refused = httpx.post(
                f"{front.url}/layout-parsing", json={"file": "x", "fileType": 7}, headers=AUTH
            )
    assert read.status_code == 200, read.text[:300]
    assert read.json()["errorCode"] == 0
    assert refused.status_code == 422
    assert "`fileType`" in refused.json()["errorMsg"]
    assert len(refused.json()["logId"]) == 36  # the gateway's, a UUID
