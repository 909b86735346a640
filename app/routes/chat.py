"""`POST /v1/chat/completions` (and the bare `/chat/completions` that seed recipes use)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app import catalog, chat
from app.auth import authenticate
from app.bodies import capped
from app.context import RequestContext
from app.errors import GatewayError, PayloadTooLarge, error_response
from app.quotas.asgi import admit
from app.state import Gateway

router = APIRouter()


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes."""
    too_large = PayloadTooLarge(
        f"the request body is over {limit} bytes (OCRVL_MAX_BODY_BYTES); "
        "send a smaller or more compressed image"
    )
    return b"".join([chunk async for chunk in capped(request, limit, too_large)])


async def chat_completions(request: Request) -> Response:
    """Relay a chat completion to a healthy backend serving the requested model."""
    gateway: Gateway = request.state.gateway
    context: RequestContext = request.state.context
    await admit(request, await authenticate(request))
    parsed = chat.parse(await read_body(request, gateway.settings.max_body_bytes))
    parsed = await gateway.media.inline_chat(parsed)  # vLLM never fetches a URL (docs/ocr.md)
    context.model, context.stream = parsed.model, parsed.stream
    served_models = gateway.pool.require_models(f"to serve {parsed.model!r}")
    context.served_model = catalog.resolve(parsed.model, served_models)
    parsed, context.images_resized = await gateway.images.fit(parsed)  # OCRVL_RESIZE_IMAGES
    return await gateway.relay.complete(parsed, context.served_model, context, request.receive)


class ChatEndpoint:
    """`chat_completions` as a plain ASGI endpoint: the route every page takes skips FastAPI's
    per-request dependency solving and response wrapping (about a tenth of the gateway's CPU
    per page in bench.overhead) and takes the same steps, in the same order, itself."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await chat_completions(Request(scope, receive))
        except GatewayError as error:
            response = error_response(error)
        await response(scope, receive, send)


for path in ("/v1/chat/completions", "/chat/completions"):  # the bare one: seed recipes, hey
    router.routes.append(Route(path, ChatEndpoint(), methods=["POST"], include_in_schema=False))
