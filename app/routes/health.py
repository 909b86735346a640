"""Liveness, readiness and metrics: no key needed, never slowed by a backend."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from app.paddlex.envelope import log_id
from app.state import GatewayDep

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    """The gateway process is up; says nothing of the backends. The body is ours (`status`) and
    PaddleX's serving health answer (`logId`, `errorCode` 0, `errorMsg` "Healthy") at once, so
    a health check written for either passes."""
    return {"status": "ok", "logId": log_id(request), "errorCode": 0, "errorMsg": "Healthy"}


@router.get("/ready")
async def ready(gateway: GatewayDep) -> dict[str, Any]:
    """200 while at least one backend answered its last health probe (and, with
    OCRVL_READY_REQUIRES_LAYOUT, a layout service its), else 503; `layout` says how the layout
    service is either way (`off`: none configured)."""
    healthy = gateway.pool.healthy()
    if not healthy:
        raise gateway.pool.unavailable("no backend is healthy")
    layouts = gateway.layouts
    layout = {"status": "off"} if layouts is None else layouts.readiness()
    if layouts is not None and gateway.settings.ready_requires_layout and not layouts.ready():
        raise layouts.unavailable(
            f"no layout service is ready ({layouts.problems()}) and OCRVL_READY_REQUIRES_LAYOUT "
            "is on"
        )
    return {
        "status": "ready",
        "backends": [backend.url for backend in healthy],
        "layout": layout,
        "limits": {"storage": gateway.quotas.storage()},  # a Redis outage is not a 503
    }


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    """Prometheus text exposition of the gateway's metrics."""
    return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
