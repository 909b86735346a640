"""Remote images: refused by default; with OCRVL_MEDIA_FETCH=on, fetched here, never by vLLM.

A chat message (or an OCR `file`) naming an `http(s)://` image makes whoever fetches it a
server-side request forgery tool: cloud metadata (169.254.169.254), internal services. vLLM would
fetch from inside the cluster, so the gateway either refuses (default) or fetches itself:
the name is resolved once and the connection pinned to that address (no DNS rebinding between
check and connect); every address in IANA's special-purpose registries is refused (loopback,
private, link-local, CGNAT, documentation, IPv4-mapped…: app/addresses.py's one table); at most
3 redirects, each checked again; size and time caps; the bytes must sniff as an image (or a PDF,
for OCR). The image then travels inline as a data URL.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from app.addresses import Address, refusal
from app.chat import ChatRequest, content_parts
from app.documents.errors import DocumentError
from app.documents.sniff import sniff
from app.errors import InvalidRequest, clip
from app.settings import Settings

MAX_REDIRECTS = 3
REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Parts of a chat message whose URL the engine would fetch.
URL_PARTS = ("image_url", "video_url", "audio_url")
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, through the system resolver (without blocking)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Whether `host` is on the allow-list (`name` exactly, or `*.name` for its subdomains)."""
    if not allowed:
        return True
    host = host.lower().rstrip(".")
    for entry in (name.lower().rstrip(".") for name in allowed):
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False


class MediaPolicy:
    """What the gateway does with remote media URLs, and the fetcher when it fetches them."""

    def __init__(
        self,
        settings: Settings,
        resolver: Resolver = system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.fetch_enabled = settings.media_fetch == "on"
        self.allowed = settings.allowed_media_domains
        self.max_bytes = settings.media_max_bytes
        self.timeout = settings.media_fetch_timeout
        self.allow_loopback = settings.media_allow_loopback
        self._resolve = resolver
        self._client = None  # only a fetching gateway needs one (and its TLS context)
        if self.fetch_enabled:
            self._client = httpx.AsyncClient(
                transport=transport, trust_env=False, follow_redirects=False, timeout=self.timeout
            )

    async def aclose(self) -> None:
        """Close the fetcher's connections."""
        if self._client is not None:
            await self._client.aclose()

    async def inline_chat(self, chat: ChatRequest) -> ChatRequest:
        """`chat` with every remote image fetched and inlined; 400 for URLs it must not send."""
        changed = False
        for place, part in content_parts(chat.payload):
            for kind in URL_PARTS:
                value = part.get(kind)
                url = value.get("url") if isinstance(value, dict) else value
                if not isinstance(url, str) or url.startswith("data:"):
                    continue
                param = f"{place}.{kind}"
                if kind != "image_url":
                    raise InvalidRequest(
                        f"{param} must be a data: URL; this server does not fetch media",
                        param=param,
                    )
                inlined = await self.inline(url, param)
                part[kind] = {**value, "url": inlined} if isinstance(value, dict) else inlined
                changed = True
        if not changed:
            return chat
        return chat.rewritten()

    async def inline(self, url: str, param: str) -> str:
        """The image at `url` as a data: URL (for chat: images only)."""
        data = await self.fetch(url, param)
        kind = _sniffed(data, url, param)
        if kind.is_pdf:
            raise InvalidRequest(
                f"{param}: {url} is a PDF, not an image; send PDFs to /v1/ocr", param=param
            )
        import base64  # noqa: PLC0415 (only on this rare path)

        return f"data:{kind.mime};base64,{base64.b64encode(data).decode('ascii')}"

    async def fetch(self, url: str, param: str) -> bytes:
        """The bytes at `url`, under the policy; 400 naming `param` when refused or failed."""
        scheme = urlsplit(url).scheme.lower()
        if scheme not in ("http", "https"):
            raise InvalidRequest(
                f"{param} must be a data: URL (data:image/png;base64,...); "
                f"got a {scheme or 'relative'}: URL",
                param=param,
            )
        if not self.fetch_enabled:
            raise InvalidRequest(
                f"{param}: this server does not fetch remote images (OCRVL_MEDIA_FETCH=off); send "
                "the image inline as a data: URL (data:image/png;base64,...) instead of "
                f"{_short(url)}",
                param=param,
                code="remote_media_refused",
            )
        try:
            async with asyncio.timeout(self.timeout):
                return await self._follow(url, param)
        except TimeoutError:
            raise InvalidRequest(
                f"{param}: fetching {_short(url)} took over {self.timeout:g} s "
                "(OCRVL_MEDIA_FETCH_TIMEOUT)",
                param=param,
                code="remote_media_failed",
            ) from None
        except httpx.HTTPError as exc:
            raise InvalidRequest(
                f"{param}: fetching {_short(url)} failed: {exc!r}",
                param=param,
                code="remote_media_failed",
            ) from None

    async def _follow(self, url: str, param: str) -> bytes:
        for _ in range(MAX_REDIRECTS + 1):
            response = await self._send(url, param)
            try:
                if response.status_code in REDIRECTS and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise _failed(param, url, f"it answered HTTP {response.status_code}")
                return await self._read(response, url, param)
            finally:
                await response.aclose()
        raise _failed(param, url, f"more than {MAX_REDIRECTS} redirects")

    async def _send(self, url: str, param: str) -> httpx.Response:
        """GET `url` from the one address its name was checked at (pinned: no second lookup)."""
        parts = urlsplit(url)
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            raise _refused(param, url, "only http(s) URLs with a host name are fetched")
        if not host_allowed(host, self.allowed):
            raise _refused(param, url, f"{host} is not in OCRVL_ALLOWED_MEDIA_DOMAINS")
        try:
            given_port = parts.port
        except ValueError:
            raise _refused(param, url, "its port is not a number") from None
        port = given_port or (443 if parts.scheme == "https" else 80)
        address = await self._checked_address(host, port, param, url)
        netloc = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
        target = parts._replace(netloc=netloc).geturl()
        shown_host = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets
        headers = {
            "host": shown_host if given_port is None else f"{shown_host}:{port}",
            "accept": "image/*",
        }
        extensions: dict[str, Any] = {"sni_hostname": host} if parts.scheme == "https" else {}
        client = self._client
        if client is None:  # fetch() refuses first when fetching is off
            raise _refused(param, url, "OCRVL_MEDIA_FETCH=off")
        request = client.build_request("GET", target, headers=headers, extensions=extensions)
        return await client.send(request, stream=True)

    async def _checked_address(self, host: str, port: int, param: str, url: str) -> Address:
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            candidates = [literal]
        else:
            try:
                answers = await self._resolve(host, port)
            except OSError as exc:
                raise _failed(param, url, f"{host} does not resolve ({exc})") from None
            candidates = [ipaddress.ip_address(a.split("%")[0]) for a in answers]
        if not candidates:
            raise _failed(param, url, f"{host} does not resolve")
        for address in candidates:  # every answer must be public: one private answer refuses
            reason = refusal(address, self.allow_loopback)
            if reason is not None:
                raise _refused(param, url, f"{host} resolves to {address}, {reason}")
        return candidates[0]

    async def _read(self, response: httpx.Response, url: str, param: str) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise _failed(param, url, f"it is over {self.max_bytes} bytes (OCRVL_MEDIA_MAX_BYTES)")
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise _failed(
                    param, url, f"it is over {self.max_bytes} bytes (OCRVL_MEDIA_MAX_BYTES)"
                )
            chunks.append(chunk)
        data = b"".join(chunks)
        _sniffed(data, url, param)
        return data


def _sniffed(data: bytes, url: str, param: str) -> Any:
    try:
        return sniff(data[:1024])
    except DocumentError:
        raise _failed(param, url, "its content is not an image or a PDF") from None


def _short(url: str) -> str:
    return clip(url)  # a data: URL may be megabytes


def _refused(param: str, url: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param}: refused to fetch {_short(url)}: {why}; send the image inline as a data: URL",
        param=param,
        code="remote_media_refused",
    )


def _failed(param: str, url: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param}: could not fetch {_short(url)}: {why}", param=param, code="remote_media_failed"
    )
