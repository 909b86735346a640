"""`POST /v1/chat/completions` (and the bare `/chat/completions` that seed recipes use)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app import catalog, chat, policy, repetition
from app.auth import authenticate
from app.bodies import capped
from app.context import RequestContext
from app.errors import GatewayError, InvalidRequest, PayloadTooLarge, error_response, quoted
from app.quotas.asgi import admit, widen
from app.state import Gateway
from app.usage.reading import pages_of

router = APIRouter()
LOOP_GUARD_HEADER = "x-ocrvl-loop-guard"


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
    key_name = await authenticate(request)
    await admit(request, key_name)
    parsed = chat.parse(await read_body(request, gateway.settings.max_body_bytes))
    context.model, context.stream = parsed.model, parsed.stream
    served_models = gateway.pool.require_models(f"to serve {quoted(parsed.model)}")
    context.served_model = catalog.resolve(parsed.model, served_models)
    parsed = policy.apply(parsed, gateway.settings, served_models[context.served_model])
    await widen(request, key_name, parsed.pages)  # `n` > 1: n pages in the key's limits
    if gateway.usage is not None:  # the key's page budget; what it used is counted at the end
        await gateway.usage.admit(context, pages_of(parsed))
    parsed = await gateway.media.inline_chat(parsed)  # vLLM never fetches a URL (docs/ocr.md)
    gateway.images.check(parsed)  # what the model cannot take: 400 here, from image headers
    parsed, context.images_resized = await gateway.images.fit(parsed)  # OCRVL_RESIZE_IMAGES
    if loop_guarded(request, gateway.settings.chat_loop_guard, parsed):
        return await repetition.answer(gateway.relay, parsed, context, request.receive)
    return await gateway.relay.complete(parsed, context.served_model, context, request.receive)


def loop_guarded(request: Request, default: str, parsed: chat.ChatRequest) -> bool:
    """Whether the loop guard watches this chat request: `X-OCRVL-Loop-Guard: on|off`, else
    OCRVL_CHAT_LOOP_GUARD; one sequence (`n` 1) only (docs/ocr.md)."""
    header = request.headers.get(LOOP_GUARD_HEADER, default)
    wanted = guard_switch(header, LOOP_GUARD_HEADER, f"the {LOOP_GUARD_HEADER} header")
    return wanted == "on" and parsed.pages == 1


def guard_switch(value: str, param: str, name: str) -> str:
    """`on` or `off` (the loop guard's switch, any case), or 400 naming `param`."""
    wanted = value.strip().lower()
    if wanted not in ("on", "off"):
        raise InvalidRequest(
            f"{name} must be on or off; got {quoted(wanted)}", param=param, code="invalid_value"
        )
    return wanted


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
