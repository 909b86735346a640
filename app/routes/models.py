"""`GET /v1/models` (and `/models`): the served models and their PaddleOCR-VL aliases."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app import catalog
from app.auth import KeyName
from app.state import GatewayDep

router = APIRouter()


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(_: KeyName, gateway: GatewayDep) -> dict[str, Any]:
    """The models a request may name; the first one is served directly."""
    return catalog.listing(gateway.pool.require_models("to list models"))
