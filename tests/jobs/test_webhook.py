"""Job callbacks: the address rules (proven without connecting), signing, delivery and retry."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from app.errors import InvalidRequest
from app.jobs.webhook import Webhooks, sign, signing_key
from tests.conftest import settings_for
from tests.support.servers import empty_lifespan, read_body, serving

pytestmark = pytest.mark.anyio
SECRET = "whsec_" + base64.b64encode(b"a test signing key of 32 bytes!!").decode()


def hooks(resolved: list[str] | None = None, **overrides: Any) -> Webhooks:
    """Webhooks whose resolver answers `resolved` for every name (nothing is looked up)."""

    async def resolver(host: str, port: int) -> list[str]:
        return list(resolved or [])

    settings = settings_for("http://127.0.0.1:1", webhook_secret=SECRET, **overrides)
    return Webhooks(settings, resolver=resolver, delays=(0.2, 0.2))


@pytest.mark.parametrize(
    ("url", "resolved", "why"),
    [
        ("http://127.0.0.1:9000/hook", [], "loopback"),
        ("http://[::1]/hook", [], "loopback"),
        ("http://169.254.169.254/latest/meta-data", [], "link-local"),
        ("http://10.0.0.5/hook", [], "private"),
        ("http://[::ffff:10.0.0.5]/hook", [], "IPv4-mapped"),
        ("http://hooks.example.com/x", ["93.184.216.34", "192.168.1.10"], "private"),
        ("http://metadata.google.internal/x", ["169.254.169.254"], "link-local"),
        ("ftp://hooks.example.com/x", [], "http(s) URL"),
        ("http://user:pw@hooks.example.com/x", ["93.184.216.34"], "user name"),
        ("http://nowhere.example/x", [], "does not resolve"),
    ],
)
async def test_a_callback_to_a_non_public_address_is_refused(
    url: str, resolved: list[str], why: str
) -> None:
    """400 `invalid_callback_url` naming why (the resolver is a stub: nothing connects)."""
    webhooks = hooks(resolved)
    with pytest.raises(InvalidRequest) as refused:
        await webhooks.check(url)
    assert refused.value.param == "callback_url"
    assert refused.value.code == "invalid_callback_url"
    assert why in refused.value.message
    await webhooks.aclose()


async def test_a_public_callback_passes_and_an_allow_listed_host_skips_the_rules() -> None:
    """A host resolving only to public addresses passes; 127.0.0.1 passes once allow-listed;
    with no secret configured any callback is refused."""
    public = hooks(["93.184.216.34"])
    await public.check("https://hooks.example.com/ocr")
    listed = hooks(webhook_allowed_hosts="127.0.0.1,receiver.internal")
    await listed.check("http://127.0.0.1:9000/hook")
    unsigned = Webhooks(settings_for("http://127.0.0.1:1"))
    with pytest.raises(InvalidRequest) as refused:
        await unsigned.check("https://hooks.example.com/ocr")
    assert refused.value.code == "callbacks_disabled"
    for webhooks in (public, listed, unsigned):
        await webhooks.aclose()


def test_the_signature_is_standard_webhooks_v1() -> None:
    """v1,base64(HMAC-SHA256(base64-decoded secret, "id.timestamp.body"))."""
    key = signing_key(SECRET)
    assert key == b"a test signing key of 32 bytes!!"
    expected = hmac.new(key, b"msg_1.1700000000.{}", hashlib.sha256).digest()
    assert sign(key, "msg_1", 1_700_000_000, b"{}") == "v1," + base64.b64encode(expected).decode()


class Receiver:
    """A callback receiver: answers 500 to the first `failures` POSTs, then 200; keeps them."""

    def __init__(self, failures: int) -> None:
        self.url = ""
        self.failures = failures
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.done = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send)
            return
        body = await read_body(receive)
        self.received.append(({k.decode(): v.decode() for k, v in scope["headers"]}, body))
        status = 500 if len(self.received) <= self.failures else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        if status == 200:
            self.done.set()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A Receiver that fails once, on a loopback port."""
    with serving(Receiver(failures=1)) as served:
        yield served


async def test_a_callback_is_signed_and_retried_after_a_500(
    receiver: Receiver, tmp_path: Path
) -> None:
    """The first POST gets a 500, the retry a 200; both carry the same id and a signature
    that verifies over the body they carried."""
    webhooks = hooks(webhook_allowed_hosts="127.0.0.1")
    job = {"id": "job_x", "object": "ocr.job", "status": "succeeded"}
    assert await webhooks.deliver(f"{receiver.url}/hook", "job_x", job)
    await webhooks.aclose()
    assert len(receiver.received) == 2
    key = signing_key(SECRET)
    for headers, body in receiver.received:
        assert headers["webhook-id"] == "job_x"
        timestamp = int(headers["webhook-timestamp"])
        assert headers["webhook-signature"] == sign(key, "job_x", timestamp, body)
        assert orjson.loads(body) == {"type": "ocr.job.succeeded", "data": job}


async def test_a_callback_that_never_takes_gives_up() -> None:
    """A receiver that always fails: three tries (the delays given), then False."""
    with serving(Receiver(failures=10)) as always_failing:
        webhooks = hooks(webhook_allowed_hosts="127.0.0.1")
        delivered = await webhooks.deliver(f"{always_failing.url}/h", "job_y", {"status": "x"})
        await webhooks.aclose()
        assert not delivered
        assert len(always_failing.received) == 3
