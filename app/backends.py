"""The vLLM backends: their health, the models they serve, and who they are (discovery)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import httpx

from app.engines import EngineLoad
from app.errors import BackendUnavailable
from app.settings import BackendSpec

log = logging.getLogger("ocrvl.backends")

# How long an engine that refused a page because it is stopping stays out of rotation while its
# probes still pass: vLLM drains for its `shutdown-timeout` (90 s in every profile) answering
# /health 200 all along, then exits. A probe that finds it gone ends the hold sooner.
STOP_HOLD_S = 120.0


@dataclass(slots=True)
class Backend:
    """One vLLM OpenAI server, as the last probe saw it."""

    url: str
    healthy: bool = False
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # served id -> vLLM's entry
    in_flight: int = 0
    problem: str = "not probed yet"
    capacity: int | None = None  # pages at once, set by the operator; None: learnt
    engine: EngineLoad | None = None  # the engine's last /metrics reading
    held_until: float = 0.0  # monotonic: a stopping engine's probes do not bring it back before

    def mark_down(self, problem: str) -> None:
        """Take the backend out of rotation until a probe finds it well again."""
        if self.healthy:
            log.warning("backend %s is down: %s", self.url, problem)
        self.healthy = False
        self.problem = problem

    def mark_stopping(self, problem: str) -> None:
        """Take a draining engine out of rotation until a probe finds it gone (a restart is a
        new engine) or STOP_HOLD_S pass: its /health still answers 200 while it drains."""
        self.mark_down(f"stopping: {problem}")
        self.held_until = monotonic() + STOP_HOLD_S


class BackendPool:
    """All configured backends, probed in the background."""

    def __init__(
        self,
        specs: list[BackendSpec],
        client: httpx.AsyncClient,
        headers: dict[str, str],
        timeout: float,
        interval: float = 5.0,
        *,
        members: Callable[[], Awaitable[list[BackendSpec]]] | None = None,
    ) -> None:
        """`members` (DNS discovery) gives the backends anew before every probe round."""
        static = [spec for spec in specs if not spec.discover]
        self.backends = [Backend(spec.url, capacity=spec.capacity) for spec in static]
        self.specs = {spec.url: spec for spec in static}
        self._members = members
        self._discovered = [spec.url for spec in specs if spec.discover]
        self.interval = interval
        self._client = client
        self._headers = headers
        self._timeout = timeout

    async def probe(self, backend: Backend) -> None:
        """Ask one backend for `/health` and `/v1/models`; both must answer for it to serve,
        and an engine that said it is stopping must have gone first (or STOP_HOLD_S passed)."""
        problem = await self._check(backend)
        if problem is not None:
            backend.held_until = 0.0  # gone or broken: what answers next is a new engine
            backend.mark_down(problem)
        elif monotonic() >= backend.held_until:  # a draining engine answers, but stays down
            if not backend.healthy:
                log.info("backend %s is up, serving %s", backend.url, ", ".join(backend.models))
            backend.healthy, backend.problem, backend.held_until = True, "", 0.0

    async def _check(self, backend: Backend) -> str | None:
        """What keeps the backend from serving (None: nothing); its model list on success."""
        try:
            health = await self._client.get(f"{backend.url}/health", timeout=self._timeout)
            if health.status_code != 200:
                return f"/health answered {health.status_code}"
            listing = await self._client.get(
                f"{backend.url}/v1/models", headers=self._headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            return describe(exc)
        if listing.status_code != 200:
            hint = " (check OCRVL_BACKEND_API_KEY)" if listing.status_code == 401 else ""
            return f"/v1/models answered {listing.status_code}{hint}"
        try:
            backend.models = {entry["id"]: entry for entry in listing.json()["data"]}
        except (ValueError, KeyError, TypeError):
            return "/v1/models did not answer an OpenAI model list"
        return None

    async def probe_all(self) -> None:
        """Refresh the members (when discovered), then probe every backend once, concurrently."""
        if self._members is not None:
            self.reconcile(await self._members())
        await asyncio.gather(*(self.probe(backend) for backend in self.backends))

    async def watch(self) -> None:
        """Probe forever, every `interval` seconds (the lifespan runs this as a task)."""
        while True:
            await asyncio.sleep(self.interval)
            await self.probe_all()

    def reconcile(self, specs: list[BackendSpec]) -> None:
        """Make `specs` the members: newcomers join unhealthy until probed, leavers drop out.

        A request already sent to a leaver holds its `Backend` and finishes (or fails) there.
        """
        current = {backend.url: backend for backend in self.backends}
        wanted = {spec.url: spec for spec in specs}
        for url in current.keys() - wanted.keys():
            log.info("backend %s left the pool (%d in flight)", url, current[url].in_flight)
        for url in wanted.keys() - current.keys():
            log.info("backend %s joined the pool; it serves once a probe finds it well", url)
        self.backends = [
            current.get(url) or Backend(url, capacity=spec.capacity) for url, spec in wanted.items()
        ]
        self.specs = wanted

    def healthy(self) -> list[Backend]:
        """Backends that answered their last probe."""
        return [backend for backend in self.backends if backend.healthy]

    def served_models(self) -> dict[str, dict[str, Any]]:
        """Every model id a healthy backend serves, in backend order, with vLLM's entry."""
        served: dict[str, dict[str, Any]] = {}
        for backend in self.healthy():
            for model_id, entry in backend.models.items():
                served.setdefault(model_id, entry)
        return served

    def problems(self) -> str:
        """Why the backends are not serving, for error messages and /ready."""
        return "; ".join(f"{b.url}: {b.problem}" for b in self.backends if not b.healthy)

    def unavailable(self, what: str) -> BackendUnavailable:
        """A 503 saying `what` and why, with Retry-After set to the next probe."""
        return BackendUnavailable(
            f"{what}: {self.problems() or self._no_members()}",
            status=503,
            retry_after=max(math.ceil(self.interval), 1),
        )

    def _no_members(self) -> str:
        if self._discovered:
            return "DNS discovery found no address for " + ", ".join(self._discovered)
        return "no backend configured"

    def require_models(self, purpose: str) -> dict[str, dict[str, Any]]:
        """`served_models()`, or the 503 to answer when no healthy backend serves any."""
        served = self.served_models()
        if not served:
            raise self.unavailable(f"no healthy backend {purpose}")
        return served


def describe(exc: httpx.HTTPError) -> str:
    """A short cause for a transport error, without secrets (httpx puts none in these)."""
    kinds = {
        httpx.ConnectTimeout: "connect timed out",
        httpx.ConnectError: "connection refused or unreachable",
        httpx.ReadTimeout: "read timed out",
        httpx.RemoteProtocolError: "connection closed mid-answer",
    }
    if isinstance(exc, httpx.ConnectError) and "[SSL" in str(exc):  # ssl's own [SSL: REASON]
        return f"TLS handshake failed ({str(exc).strip()})"
    for kind, text in kinds.items():
        if isinstance(exc, kind):
            detail = str(exc).strip()
            return f"{text} ({detail})" if detail else text
    return f"{type(exc).__name__}: {exc}"
