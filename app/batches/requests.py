"""One batch line through the chat route's own steps, in the background lane, to the relay.

The steps are /v1/chat/completions's (app/routes/chat.py): the body parsed and its model
resolved through the same aliases (app/catalog.py), the request policy (app/policy.py), remote
images fetched under the media rules, images fitted; then the relay. What the gateway or the
backend refuses becomes the line's answer with that status and OpenAI's error body, as OpenAI's
error file shows it; a backend that cannot take the line now (full, or none healthy) is waited
for and tried again, as a job's page is. A line of a guarded batch (`guarded`: the batch's
choice, else OCRVL_CHAT_LOOP_GUARD; app/routes/batches.py) is answered as a guarded unstreamed
chat request is (app/repetition.py): cut at a loop, `finish_reason` "repetition" and `loop`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message

from app import catalog, chat, policy, repetition
from app.backends import BackendPool
from app.batches.lines import Line, output_line
from app.context import RequestContext
from app.errors import GatewayError, InvalidRequest, quoted
from app.images import ChatImages
from app.jobs.pages import RETRY_DELAYS, TRANSIENT
from app.media import MediaPolicy
from app.proxy import Relay
from app.settings import Settings


@dataclass(frozen=True, slots=True)
class Answer:
    """A line's output (or error) file entry, and what it cost."""

    line: bytes
    failed: bool
    usage: dict[str, Any]
    model: str | None = None  # the served model, for the key's usage
    stops: tuple[tuple[str, int], ...] = ()  # the loop guard's stop: (label, tokens avoided)


@dataclass(frozen=True, slots=True)
class Chats:
    """What every line's request needs: the route's steps and the relay."""

    settings: Settings
    pool: BackendPool
    relay: Relay
    media: MediaPolicy
    images: ChatImages


async def _never() -> Message:
    """A batch line has no client to leave: it ends when its task is cancelled."""
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}  # pragma: no cover (never reached)


async def answer(
    chats: Chats, batch_id: str, owner: str, line: Line, *, guarded: bool = False
) -> Answer:
    """The line's entry: its answer, the refusal as an error body, or why it is no request;
    `guarded`: its answer is watched by the loop guard (one choice, `n` 1, only)."""
    request_id = f"{batch_id}-l{line.number}"
    if line.problem is not None:
        error = {"code": "invalid_request", "message": line.problem, "line": line.number}
        return Answer(output_line(line.custom_id, None, request_id, None, error), True, {})
    for delay in (*RETRY_DELAYS, None):
        context = RequestContext(request_id=request_id, key_name=owner)
        try:
            status, body = await _ask(chats, orjson.dumps(line.body), context, guarded)
        except TRANSIENT:
            if delay is None:
                raise
            await asyncio.sleep(delay)
            continue
        except GatewayError as exc:
            entry = output_line(line.custom_id, exc.status, request_id, exc.body())
            return Answer(entry, True, {})
        usage = body.get("usage") if isinstance(body, dict) else None
        entry = output_line(line.custom_id, status, request_id, body)
        stops = tuple(context.stops)
        return Answer(entry, status >= 400, usage or {}, context.served_model, stops)
    raise AssertionError("unreachable")  # pragma: no cover (the last delay re-raises)


async def _ask(chats: Chats, raw: bytes, context: RequestContext, guarded: bool) -> tuple[int, Any]:
    """The backend's status and body for the line's request."""
    parsed = chat.parse(raw)
    if parsed.stream:
        raise InvalidRequest("a batch line cannot stream: leave `stream` out", param="stream")
    context.model = parsed.model
    served_models = chats.pool.require_models(f"to serve {quoted(parsed.model)}")
    context.served_model = catalog.resolve(parsed.model, served_models)
    parsed = policy.apply(parsed, chats.settings, served_models[context.served_model])
    parsed = await chats.media.inline_chat(parsed)
    chats.images.check(parsed)
    parsed, context.images_resized = await chats.images.fit(parsed)
    if guarded and parsed.pages == 1:  # as a live request's guard: one sequence only
        return 200, await repetition.completion(chats.relay, parsed, context, _never)
    response = await chats.relay.complete(parsed, context.served_model, context, _never)
    return response.status_code, orjson.loads(bytes(response.body))
