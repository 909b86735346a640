"""Job callbacks: one signed POST when a job ends, retried with back-off.

Signed the Standard Webhooks way (standardwebhooks.com): headers `webhook-id`,
`webhook-timestamp` and `webhook-signature: v1,<base64 HMAC-SHA256(secret, "id.timestamp.body")>`,
the secret from OCRVL_WEBHOOK_SECRET (`whsec_` + base64, as the spec's libraries take it). The
URL passes the remote images' address rules (app/addresses.py: IANA's special-purpose address
registries written out, the same on every Python): loopback, private, link-local, metadata,
CGNAT, documentation and other special-purpose addresses are refused unless the host is in
OCRVL_WEBHOOK_ALLOWED_HOSTS; the name is resolved once per attempt and the connection pinned
to the address checked, so DNS cannot rebind between check and connect.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from app.addresses import Address, refusal
from app.errors import InvalidRequest
from app.media import Resolver, system_resolver
from app.settings import Settings

log = logging.getLogger("ocrvl.jobs")
DELAYS = (1.0, 5.0, 30.0, 120.0, 600.0)  # between attempts: six in all, ~13 min
TIMEOUT = 10.0
MAX_URL = 2048


def signing_key(secret: str) -> bytes:
    """The HMAC key: the base64 after `whsec_`, else the secret's own bytes."""
    if secret.startswith("whsec_"):
        return base64.b64decode(secret.removeprefix("whsec_"))
    return secret.encode()


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` value for one delivery."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def _parts(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) callback URL; 400 naming `callback_url` otherwise."""
    parts = urlsplit(url)
    if len(url) > MAX_URL or parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refused(url, f"it must be an http(s) URL with a host, at most {MAX_URL} chars")
    if parts.username or parts.password:
        raise _refused(url, "it must not carry a user name or password")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise _refused(url, "its port is not a number") from None
    return parts.hostname, port


class Webhooks:
    """Checks callback URLs and delivers the signed events."""

    def __init__(
        self,
        settings: Settings,
        resolver: Resolver = system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
        delays: tuple[float, ...] = DELAYS,
    ) -> None:
        secret = settings.webhook_secret
        self._key = signing_key(secret.get_secret_value()) if secret is not None else None
        self._allowed = {host.lower().rstrip(".") for host in settings.webhook_allowed_hosts}
        self._resolve = resolver
        self._delays = delays
        self._client = httpx.AsyncClient(
            transport=transport, trust_env=False, follow_redirects=False, timeout=TIMEOUT
        )

    async def aclose(self) -> None:
        """Close the connections."""
        await self._client.aclose()

    async def check(self, url: str) -> None:
        """400 (`callback_url`) unless callbacks are on and `url` passes the address rules."""
        if self._key is None:
            raise InvalidRequest(
                "`callback_url` needs OCRVL_WEBHOOK_SECRET on the server (callbacks are "
                "signed); poll GET /v1/ocr/jobs/{id} instead",
                param="callback_url",
                code="callbacks_disabled",
            )
        host, port = _parts(url)
        await self.address(url, host, port)

    async def address(self, url: str, host: str, port: int) -> Address:
        """The address to connect to; every answer of the name must pass the rules."""
        host = host.lower().rstrip(".")
        try:
            candidates: list[Address] = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                answers = await self._resolve(host, port)
            except OSError as exc:
                raise _refused(url, f"{host} does not resolve ({exc})") from None
            candidates = [ipaddress.ip_address(a.split("%")[0]) for a in answers]
        if not candidates:
            raise _refused(url, f"{host} does not resolve")
        if host not in self._allowed:
            for address in candidates:
                reason = refusal(address)
                if reason is not None:
                    raise _refused(url, f"{host} resolves to {address}, {reason}")
        return candidates[0]

    async def deliver(self, url: str, message_id: str, job: dict[str, Any]) -> bool:
        """POST the event until a 2xx, with back-off between attempts; False if none took."""
        body = orjson.dumps({"type": f"ocr.job.{job['status']}", "data": job})
        for attempt, delay in enumerate((*self._delays, None), start=1):
            outcome = await self._attempt(url, message_id, body)
            if outcome is None:
                log.info("job callback delivered", extra={"job_id": message_id, "try": attempt})
                return True
            log.warning(
                "job callback failed (%s)%s",
                outcome,
                f"; trying again in {delay:g} s" if delay is not None else "; giving up",
                extra={"job_id": message_id, "try": attempt},
            )
            if delay is None:
                return False
            await asyncio.sleep(delay)
        return False  # pragma: no cover (the loop returns)

    async def _attempt(self, url: str, message_id: str, body: bytes) -> str | None:
        """One POST; None on a 2xx, else what went wrong."""
        if self._key is None:
            return "OCRVL_WEBHOOK_SECRET is unset"
        parts = urlsplit(url)
        try:
            host, port = _parts(url)
            address = await self.address(url, host, port)
        except InvalidRequest as exc:
            return exc.message
        netloc = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
        timestamp = int(time.time())
        headers = {
            "host": parts.netloc.rpartition("@")[2],
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self._key, message_id, timestamp, body),
        }
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        target = parts._replace(netloc=netloc).geturl()
        try:
            response = await self._client.post(
                target, content=body, headers=headers, extensions=extensions
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if 200 <= response.status_code < 300 else f"HTTP {response.status_code}"


def _refused(url: str, why: str) -> InvalidRequest:
    shown = url if len(url) <= 100 else url[:97] + "..."
    return InvalidRequest(
        f"`callback_url` {shown} is refused: {why}",
        param="callback_url",
        code="invalid_callback_url",
    )
