"""Remote image URLs: the default refusal and the SSRF rules of the gateway's own fetcher.

Nothing here connects anywhere but 127.0.0.1: names that resolve to metadata or private
addresses are tested by injecting the resolver's answer, and a transport that fails the test if
it is ever used proves that a refused URL was never connected to.
"""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

import httpx
import orjson
import pytest

from app.chat import parse
from app.errors import InvalidRequest
from app.media import MediaPolicy, host_allowed
from app.settings import Settings
from tests.conftest import settings_for
from tests.support.media import PNG, ImageHost

pytestmark = pytest.mark.anyio


def never_connects() -> httpx.MockTransport:
    """A transport that fails the test when the fetcher tries to connect."""

    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"the fetcher connected to {request.url}")

    return httpx.MockTransport(handler)


def resolving_to(*answers: str, calls: list[str] | None = None) -> Any:
    """A resolver whose answer for every name is `answers` (records the names asked)."""

    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        return list(answers)

    return resolve


def policy(
    transport: httpx.AsyncBaseTransport | None = None, resolver: Any = None, **settings: Any
) -> MediaPolicy:
    """A MediaPolicy over settings_for(...) with `settings` overrides."""
    values = {"media_fetch": "on", **settings}
    extra = {"resolver": resolver} if resolver is not None else {}
    return MediaPolicy(settings_for("http://127.0.0.1:9", **values), transport=transport, **extra)


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("img.example.com", True), ("a.cdn.example.org", True), ("cdn.example.org", False),
     ("evil.com", False), ("img.example.com.evil.com", False), ("IMG.EXAMPLE.COM.", True)],
)  # fmt: skip
def test_the_domain_allow_list(host: str, allowed: bool) -> None:
    """Exact names, and `*.name` for subdomains only; case and a final dot do not matter."""
    assert host_allowed(host, ["img.example.com", "*.cdn.example.org"]) is allowed


@pytest.mark.parametrize(
    "answer", ["127.0.0.1", "169.254.169.254", "::ffff:127.0.0.1", "10.0.0.7"],
    ids=["loopback", "metadata", "mapped-loopback", "private"],
)  # fmt: skip
async def test_a_name_resolving_to_a_forbidden_address_is_refused_unconnected(answer: str) -> None:
    """images.example resolving to a forbidden address: 400, and no connection is made."""
    media = policy(never_connects(), resolving_to(answer))
    shown = ipaddress.ip_address(answer)  # ::ffff:127.0.0.1 prints as ::ffff:7f00:1
    with pytest.raises(InvalidRequest, match=f"resolves to {shown}") as caught:
        await media.fetch("http://images.example/page.png", "file")
    assert caught.value.code == "remote_media_refused"
    await media.aclose()


async def test_one_forbidden_answer_among_public_ones_refuses() -> None:
    """A name answering a public and a private address cannot pick the private one later."""
    media = policy(never_connects(), resolving_to("8.8.8.8", "10.0.0.1"))
    with pytest.raises(InvalidRequest, match=r"10\.0\.0\.1"):
        await media.fetch("https://images.example/page.png", "file")
    await media.aclose()


async def test_a_host_off_the_allow_list_is_refused_before_resolving() -> None:
    """With OCRVL_ALLOWED_MEDIA_DOMAINS set, other names are not even resolved."""
    calls: list[str] = []
    media = policy(never_connects(), resolving_to("8.8.8.8", calls=calls),
                   allowed_media_domains=["img.example.com"])  # fmt: skip
    with pytest.raises(InvalidRequest, match="OCRVL_ALLOWED_MEDIA_DOMAINS"):
        await media.fetch("https://other.example.com/a.png", "file")
    assert calls == []
    await media.aclose()


async def test_by_default_remote_images_are_refused_with_a_data_url_hint(
    image_host: ImageHost,
) -> None:
    """OCRVL_MEDIA_FETCH=off (default): a 400 that says to send a data URL; nothing fetched."""
    media = policy(media_fetch="off")
    with pytest.raises(InvalidRequest, match="data: URL") as caught:
        await media.fetch(f"{image_host.url}/img.png", "file")
    assert caught.value.code == "remote_media_refused"
    assert image_host.requests == []
    await media.aclose()


async def test_loopback_is_refused_even_when_fetching_is_on(image_host: ImageHost) -> None:
    """http://127.0.0.1:PORT/ (a local server serving a PNG) is refused; it sees no request."""
    media = policy()
    with pytest.raises(InvalidRequest, match="loopback"):
        await media.fetch(f"{image_host.url}/img.png", "file")
    assert image_host.requests == []
    await media.aclose()


async def test_the_connection_is_pinned_to_the_checked_address(image_host: ImageHost) -> None:
    """The name is resolved once; the request goes to that address with the name as Host."""
    calls: list[str] = []
    port = image_host.url.rsplit(":", 1)[1]
    media = policy(resolver=resolving_to("127.0.0.1", calls=calls), media_allow_loopback=True)
    data = await media.fetch(f"http://images.example:{port}/img.png", "file")
    assert data == PNG
    assert calls == ["images.example"]
    assert image_host.requests[0]["headers"]["host"] == f"images.example:{port}"
    await media.aclose()


async def test_a_redirect_to_a_private_address_is_refused(image_host: ImageHost) -> None:
    """The allowed first hop redirects to 10.1.2.3: refused before connecting there."""
    media = policy(media_allow_loopback=True)
    with pytest.raises(InvalidRequest, match=r"10\.1\.2\.3, a private address"):
        await media.fetch(f"{image_host.url}/redirect?to=http://10.1.2.3/x.png", "file")
    assert [r["path"] for r in image_host.requests] == ["/redirect"]
    await media.aclose()


async def test_a_redirect_to_a_name_of_the_metadata_service_is_refused(
    image_host: ImageHost,
) -> None:
    """Each hop is resolved and checked again: a name answering 169.254.169.254 is refused."""
    answers = {"metadata.example": ["169.254.169.254"]}

    async def resolve(host: str, port: int) -> list[str]:
        return answers.get(host, ["127.0.0.1"])

    media = policy(resolver=resolve, media_allow_loopback=True)
    with pytest.raises(InvalidRequest, match=r"169\.254\.169\.254"):
        await media.fetch(f"{image_host.url}/redirect?to=http://metadata.example/latest", "file")
    await media.aclose()


async def test_at_most_three_redirects(image_host: ImageHost) -> None:
    """A fourth redirect is refused; three are followed."""
    media = policy(media_allow_loopback=True)
    with pytest.raises(InvalidRequest, match="more than 3 redirects"):
        await media.fetch(f"{image_host.url}/hop/0", "file")
    assert [r["path"] for r in image_host.requests] == ["/hop/0", "/hop/1", "/hop/2", "/hop/3"]
    await media.aclose()


@pytest.mark.parametrize(
    ("path", "match", "overrides"),
    [
        ("/big", "OCRVL_MEDIA_MAX_BYTES", {"media_max_bytes": 1_000_000}),
        ("/html", "not an image", {}),
        ("/slow", "OCRVL_MEDIA_FETCH_TIMEOUT", {"media_fetch_timeout": 0.5}),
        ("/missing", "HTTP 404", {}),
    ],
)
async def test_size_content_time_and_status_are_checked(
    image_host: ImageHost, path: str, match: str, overrides: dict[str, Any]
) -> None:
    """Over the size cap, not an image (whatever its Content-Type), too slow, or an error."""
    media = policy(media_allow_loopback=True, **overrides)
    with pytest.raises(InvalidRequest, match=match) as caught:
        await media.fetch(f"{image_host.url}{path}", "file")
    assert caught.value.code == "remote_media_failed"
    await media.aclose()


def chat_with(url: str, kind: str = "image_url") -> bytes:
    """A chat body whose one image part names `url`."""
    part = {"type": kind, kind: {"url": url}}
    message = {"role": "user", "content": [part, {"type": "text", "text": "OCR:"}]}
    return orjson.dumps({"model": "m", "messages": [message]})


async def test_a_fetched_chat_image_is_inlined_as_a_data_url(image_host: ImageHost) -> None:
    """With fetching on, the chat body that goes upstream carries the image inline."""
    media = policy(media_allow_loopback=True)
    chat = await media.inline_chat(parse(chat_with(f"{image_host.url}/img.png")))
    url = orjson.loads(chat.raw)["messages"][0]["content"][0]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    await media.aclose()


@pytest.mark.parametrize(
    ("url", "kind"),
    [("file:///etc/passwd", "image_url"), ("ftp://host/a.png", "image_url"),
     ("http://host/a.mp4", "video_url"), ("https://host/a.wav", "audio_url")],
)  # fmt: skip
async def test_other_schemes_and_media_are_always_refused(url: str, kind: str) -> None:
    """file:, ftp: and remote video/audio never reach the engine, whatever the policy."""
    media = policy(never_connects())
    with pytest.raises(InvalidRequest, match="data: URL") as caught:
        await media.inline_chat(parse(chat_with(url, kind)))
    assert caught.value.param == f"messages[0].content[0].{kind}"
    await media.aclose()


async def test_inline_images_pass_untouched() -> None:
    """A body with only data: URLs is relayed as it came (no re-encoding)."""
    media = policy(never_connects())
    raw = chat_with("data:image/png;base64," + base64.b64encode(PNG).decode())
    chat = parse(raw)
    assert (await media.inline_chat(chat)) is chat
    await media.aclose()


def test_allowed_domains_are_read_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    """OCRVL_ALLOWED_MEDIA_DOMAINS="a.example, *.b.example" is two entries."""
    monkeypatch.setenv("OCRVL_BACKENDS", "http://127.0.0.1:9")
    monkeypatch.setenv("OCRVL_AUTH", "off")
    monkeypatch.setenv("OCRVL_ALLOWED_MEDIA_DOMAINS", "a.example, *.b.example")
    assert Settings().allowed_media_domains == ["a.example", "*.b.example"]


async def test_a_malformed_port_is_refused() -> None:
    """http://host:abc/ is a 400, not a crash."""
    media = policy(never_connects(), resolving_to("8.8.8.8"))
    with pytest.raises(InvalidRequest, match="port"):
        await media.fetch("http://images.example:abc/a.png", "file")
    await media.aclose()
