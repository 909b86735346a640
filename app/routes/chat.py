"""`POST /v1/chat/completions` (and the bare `/chat/completions` that seed recipes use)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from app import catalog, chat
from app.errors import PayloadTooLarge
from app.quotas import Admitted
from app.state import Context, GatewayDep

router = APIRouter()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes."""
    too_large = PayloadTooLarge(
        f"the request body is over {limit} bytes (OCRVL_MAX_BODY_BYTES); "
        "send a smaller or more compressed image"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(
    request: Request,
    _: Admitted,
    gateway: GatewayDep,
    context: Context,
) -> Response:
    """Relay a chat completion to a healthy backend serving the requested model."""
    parsed = chat.parse(await read_body(request, gateway.settings.max_body_bytes))
    parsed = await gateway.media.inline_chat(parsed)  # vLLM never fetches a URL (docs/ocr.md)
    context.model, context.stream = parsed.model, parsed.stream
    served_models = gateway.pool.require_models(f"to serve {parsed.model!r}")
    context.served_model = catalog.resolve(parsed.model, served_models)
    return await gateway.relay.complete(parsed, context.served_model, context, request.receive)
