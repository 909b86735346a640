"""nginx's own errors on the upload locations (/v1/ocr, /v1/ocr/jobs, /v1/files), which set a
413 of their own: every other error is still JSON in OpenAI's shape, with Retry-After."""

from __future__ import annotations

import httpx
import pytest

from tests.deploy.conftest import StartNginx
from tests.deploy.nginx import free_port

UPLOADS = ("/v1/ocr", "/v1/ocr/jobs", "/v1/files")


def _error(response: httpx.Response) -> dict[str, object]:
    assert response.headers["content-type"] == "application/json", response.text
    error: dict[str, object] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize("path", UPLOADS)
def test_a_dead_gateway_behind_an_upload_location_gets_openai_502_with_retry_after(
    start_nginx: StartNginx, path: str
) -> None:
    """Nothing listens upstream (a gateway killed, restarting): the upload's 502 is nginx's
    JSON with Retry-After, as on every other path, so clients retry it (bench.soak met the
    HTML page)."""
    with start_nginx(f"127.0.0.1:{free_port()}") as front:
        response = httpx.post(f"{front.url}{path}", files={"file": ("d.pdf", b"%PDF-1.4")})
    assert response.status_code == 502
    assert (_error(response)["code"], response.headers["retry-after"]) == ("bad_gateway", "1")


@pytest.mark.parametrize("path", UPLOADS)
def test_a_burst_on_an_upload_location_gets_openai_429_with_retry_after(
    start_nginx: StartNginx, path: str
) -> None:
    """Over the per-key limit, an upload gets nginx's 429 in JSON with Retry-After, not HTML."""
    limits = {"NGINX_RATE_PER_KEY": "1r/s", "NGINX_BURST_PER_KEY": "1"}
    headers = {"authorization": "Bearer sk-burst"}
    with start_nginx(f"127.0.0.1:{free_port()}", **limits) as front:
        answers = [httpx.post(f"{front.url}{path}", headers=headers) for _ in range(4)]
    limited = [a for a in answers if a.status_code == 429]
    assert limited
    for answer in limited:
        assert _error(answer)["code"] == "rate_limit_exceeded"
        assert answer.headers["retry-after"] == "1"
