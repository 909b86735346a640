"""The drill's clients: each request is one Outcome with every attempt it took.

Chat goes through the real OpenAI SDK (`max_retries` on: the SDK retries 408/429/5xx and lost
connections itself, honouring Retry-After); an httpx event hook records each of its attempts.
Documents, jobs and the rest use httpx with the same rule by hand: a 429, 502 or 503 is tried
again after its Retry-After (else 1 s), at most `retries` times.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from openai import AsyncOpenAI

from bench.soak import CLIENT_KEY, SERVED
from bench.soak.inputs import BadInput, page_messages, pixels
from bench.soak.report import Attempt, Outcome

RETRIED = (429, 502, 503)
ATTEMPTS: contextvars.ContextVar[list[Attempt]] = contextvars.ContextVar("attempts")


@dataclass
class Clients:
    """The HTTP clients of one drill, and every Outcome so far."""

    url: str  # nginx
    origin: float  # time.monotonic() at the run's start: every time is seconds since it
    retries: int
    max_tokens: int
    outcomes: list[Outcome] = field(default_factory=list)
    http: httpx.AsyncClient = field(init=False)
    sdk: AsyncOpenAI = field(init=False)

    def __post_init__(self) -> None:
        headers = {"authorization": f"Bearer {CLIENT_KEY}"}
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=300, limits=limits
        )
        hooked = httpx.AsyncClient(
            timeout=300, limits=limits, event_hooks={"response": [self._seen]}
        )
        self.sdk = AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=CLIENT_KEY, max_retries=self.retries,
            http_client=hooked,  # type: ignore[arg-type]  # the SDK's own httpx, duck-typed
        )  # fmt: skip

    def now(self) -> float:
        """Seconds since the run's start."""
        return time.monotonic() - self.origin

    async def _seen(self, response: httpx.Response) -> None:
        attempts = ATTEMPTS.get(None)
        if attempts is not None:
            attempts.append(Attempt(self.now(), response.status_code, _retry_after(response)))

    async def aclose(self) -> None:
        """Close both clients."""
        await self.http.aclose()
        await self.sdk.close()

    def keep(
        self, kind: str, started: float, attempts: list[Attempt], ok: bool, detail: str
    ) -> Outcome:
        """Record one request's Outcome."""
        outcome = Outcome(kind, started, self.now(), attempts, ok, detail[:300])
        self.outcomes.append(outcome)
        return outcome

    async def chat(self, seed: int, stream: bool) -> None:
        """One page through the SDK, plain or streamed, read to its end."""
        attempts: list[Attempt] = []
        ATTEMPTS.set(attempts)
        started, kind = self.now(), "chat-stream" if stream else "chat"
        body: dict[str, Any] = {"model": SERVED, "messages": page_messages(seed % 64)}
        options = {"max_tokens": self.max_tokens, "temperature": 0, "extra_body": pixels()}
        try:
            if stream:
                create = self.sdk.chat.completions.create
                chunks = await create(**body, **options, stream=True)  # type: ignore[call-overload]
                finish = None
                async for chunk in chunks:
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                ok, detail = finish is not None, f"finish {finish}"
            else:
                answer = await self.sdk.chat.completions.create(**body, **options)  # type: ignore[call-overload]
                ok, detail = bool(answer.choices), f"finish {answer.choices[0].finish_reason}"
        except Exception as exc:  # every failure is an outcome to report
            ok, detail = False, f"{type(exc).__name__}: {exc}"
            if _status(exc) and attempts:  # the hook saw this answer: name why it failed
                attempts[-1].error = detail[:200]
            else:  # no answer at all (a lost connection, a stream cut mid-answer)
                attempts.append(Attempt(self.now(), 0, None, detail[:200]))
        self.keep(kind, started, attempts, ok, detail)

    async def send(
        self, method: str, path: str, attempts: list[Attempt], **kwargs: Any
    ) -> httpx.Response | None:
        """One request, tried again on 429/502/503 after Retry-After; None if it never came."""
        for _ in range(self.retries + 1):
            try:
                response = await self.http.request(method, path, **kwargs)
            except httpx.HTTPError as exc:
                attempts.append(Attempt(self.now(), 0, None, f"{type(exc).__name__}: {exc}"[:200]))
                await asyncio.sleep(1)
                continue
            attempts.append(Attempt(self.now(), response.status_code, _retry_after(response)))
            if response.status_code not in RETRIED:
                return response
            await asyncio.sleep(min(float(_retry_after(response) or 1), 30))
        return None

    async def document(self, data: bytes, pages: int) -> None:
        """A PDF through /v1/ocr; every page must come back with text and no error."""
        attempts: list[Attempt] = []
        started = self.now()
        # the same PDF every time: the results cache must not answer it, or no engine reads it
        fields = {"max_tokens": str(self.max_tokens), "cache": "false"}
        response = await self.send(
            "POST", "/v1/ocr", attempts, files={"file": ("d.pdf", data)}, data=fields
        )
        ok, detail = pages_ok(response, pages)
        self.keep("ocr", started, attempts, ok, detail)

    async def disconnect(self, seed: int) -> None:
        """A streamed page whose client hangs up after the first chunk."""
        attempts: list[Attempt] = []
        started = self.now()
        body = {"model": SERVED, "messages": page_messages(seed % 64), "stream": True,
                "max_tokens": 64, "temperature": 0, **pixels()}  # fmt: skip
        ok, detail = False, "no answer"
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
                attempts.append(Attempt(self.now(), response.status_code, _retry_after(response)))
                if response.status_code == 200:
                    async for _ in response.aiter_raw():
                        ok, detail = True, "hung up after the first chunk"
                        break
                else:
                    detail = (await response.aread()).decode(errors="replace")
        except httpx.HTTPError as exc:
            attempts.append(Attempt(self.now(), 0, None, f"{type(exc).__name__}: {exc}"[:200]))
        self.keep("disconnect", started, attempts, ok, detail)

    async def bad(self, item: BadInput) -> None:
        """A bad input: a 2xx, or a 4xx in OpenAI's error shape; never a 5xx."""
        attempts: list[Attempt] = []
        started = self.now()
        headers = {"content-type": item.content_type}
        response = await self.send(
            "POST", "/v1/chat/completions", attempts, content=item.body, headers=headers
        )
        ok, detail = _openai_shaped(response)
        if attempts and not ok:
            attempts[-1].ok = False
        elif attempts and response is not None and response.status_code < 500:
            attempts[-1].ok = True  # the 4xx asked for
        self.keep("bad-input", started, attempts, ok, f"{item.label}: {detail}")


def _retry_after(response: httpx.Response) -> str | None:
    value: str | None = response.headers.get("retry-after")
    return value


def _status(exc: Exception) -> int:
    return int(getattr(exc, "status_code", 0) or 0)


def pages_ok(response: httpx.Response | None, pages: int) -> tuple[bool, str]:
    """Whether a document answer holds pages 1..`pages`, each with text and no error."""
    if response is None:
        return False, "no answer after the retries"
    if response.status_code != 200:
        return False, f"{response.status_code}: {response.text[:200]}"
    shown = orjson.loads(response.content)["pages"]
    numbers = [page["index"] for page in shown]
    failed = [page["index"] for page in shown if page.get("error") or page.get("text") is None]
    if numbers != list(range(1, pages + 1)) or failed:
        return False, f"pages {numbers}, failed {failed}"
    return True, f"{pages} pages"


def _openai_shaped(response: httpx.Response | None) -> tuple[bool, str]:
    if response is None:
        return False, "no answer after the retries"
    if response.status_code < 300:
        return True, str(response.status_code)
    try:
        error = orjson.loads(response.content)["error"]
        shaped = set(error) == {"message", "type", "param", "code"}
    except (orjson.JSONDecodeError, KeyError, TypeError):
        shaped = False
    ok = response.status_code < 500 and shaped
    return ok, f"{response.status_code} {'shaped' if shaped else 'NOT OpenAI-shaped'}"
