"""StandinVLM: a stand-in for vLLM whose answer depends only on the prompt and the image it got.

The fidelity tier (tests/fidelity/) drives the gateway's layout pipeline and PaddleX's own
PaddleOCR-VL-1.5 pipeline at one StandinVLM: the same crop with the same prompt gets the same
answer on both sides, so any difference in their markdown or block lists is a difference in what
the two pipelines do around the model. It speaks vLLM's OpenAI surface (`/health`,
`/v1/models`, `/v1/chat/completions`, whole or streamed a word a token) and records every chat
request. `fake_loop_every` is a fake fault: chosen `OCR:` blocks loop to their token limit.

An image is known by the SHA-256 of its decoded RGB pixels (and its size): exact, so two sides
match only when they sent the very same pixels. PaddleX sends each crop as a Pillow JPEG at
Pillow's default quality (75); a gateway that sends the same crop encoded the same way sends the
same pixels (both venvs run one Pillow), one that sends PNG or another quality does not.

The answers are plausible for each prompt and seeded by the pixels' digest: text lines (now and
then with inline `$…$` or `\\(…\\)` math, a section number, a trailing period, or a repetition
loop as the real model falls into), a numbered heading for a one-line strip, a number for a crop
as small as a formula number, OTSL tables with spans (app/documents/otsl.py), LaTeX with and
without `\\tag{}`, a chart as a `|`-separated table, seal text. Any other prompt is read as
`OCR:`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
from PIL import Image
from starlette.types import Receive, Scope, Send

from tests.support.servers import empty_lifespan, read_body

SERVED = "standin-paddleocr-vl"
WORDS = (
    "layout", "model", "block", "reading", "order", "table", "figure", "caption", "page",
    "column", "margin", "paragraph", "section", "result", "method", "value", "sample", "measure",
    "error", "rate", "image", "region", "crop", "prompt", "answer", "score", "label", "merge",
    "formula", "number", "header", "footer", "chart", "seal",
)  # fmt: skip
# The body fields that change what the model answers (PaddleX's client sets the first three).
SAMPLING = (
    "temperature", "max_completion_tokens", "skip_special_tokens", "max_tokens", "top_p",
    "top_k", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
)  # fmt: skip
MAX_MODEL_LEN = 8192  # as the GPU profiles serve the model (vllm_configs/)
SYMBOLS = ("x", "y", "z", "\\alpha", "\\beta", "\\lambda", "n", "k", "t")


@dataclass(frozen=True, slots=True)
class Received:
    """One chat request as the stand-in saw it."""

    prompt: str
    digest: str  # SHA-256 of the decoded RGB pixels, "" when no image came
    width: int
    height: int
    image_format: str  # "JPEG", "PNG", ... (what the data URL held)
    mm_processor_kwargs: tuple[tuple[str, Any], ...]
    sampling: tuple[tuple[str, Any], ...]  # the body's SAMPLING fields that were set
    body: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str, int, int]:
        """What decides the answer (prompt and pixels), with the size for messages."""
        return (self.prompt, self.digest, self.width, self.height)


def image_digest(url: str) -> tuple[str, int, int, str]:
    """(SHA-256 of the RGB pixels, width, height, format) of a base64 data: URL's image."""
    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ValueError(f"the stand-in reads base64 data: URLs only, got {url[:40]!r}")
    data = base64.b64decode(payload, validate=True)
    with Image.open(io.BytesIO(data)) as image:
        fmt = image.format or "?"
        rgb = image.convert("RGB")
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).hexdigest()
    return digest, rgb.width, rgb.height, fmt


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def _inline_math(rng: random.Random) -> str:
    a, b = rng.sample(SYMBOLS, 2)
    return rng.choice((f"${a}_{{{rng.randint(1, 9)}}}+{b}$", f"${a}^{{2}}$", f"\\({a}+{b}\\)"))


def heading(rng: random.Random) -> str:
    """One short line, as a title or a header reads: numbered in one of the ways PaddleX's
    title rule knows (`1.2`, `3`, `IV.`, `(2)`, full-width `(二)`, `三、`) or not at all."""
    n, m = rng.randint(1, 9), rng.randint(1, 9)
    numbers = (f"{n}.{m} ", f"{n}.{m}.{n} ", f"{n} ", f"{n}. ", "IV. ", "II ", f"({n}) ")
    numbers += ("\uff08二\uff09", "三、", "", "", "")
    text = rng.choice(numbers) + _words(rng, 1, 5).title()
    return text + "." if rng.random() < 0.3 else text


def ocr_text(rng: random.Random) -> str:
    """Text as the model reads a block: lines, sometimes numbered, with math, or looping."""
    kind = rng.random()
    if kind < 0.08:  # the model stuck in a loop: PaddleX truncates it
        return " ".join([_words(rng, 2, 3)] * rng.randint(12, 20))
    lines = []
    for _ in range(rng.randint(1, 4)):
        line = _words(rng, 3, 9)
        if rng.random() < 0.3:
            line += " " + _inline_math(rng) + " " + _words(rng, 1, 4)
        lines.append(line)
    text = "\n".join(lines)
    if kind < 0.25:
        text = f"{rng.randint(1, 9)}.{rng.randint(1, 9)} {text}"
    elif kind < 0.35:
        text = f"{rng.randint(1, 9)} {text}"
    if rng.random() < 0.3:
        text += "."
    if rng.random() < 0.1:
        text += "-\n" + _words(rng, 1, 3)  # a hyphen at a line break
    return text


def otsl_table(rng: random.Random) -> str:
    """An OTSL table: a header row, filled and empty cells, a column and a row span, now and
    then a short row (evened out) or no tags at all (kept as the model wrote it)."""
    if rng.random() < 0.2:
        return _words(rng, 4, 10)
    columns, rows = rng.randint(2, 4), rng.randint(2, 5)
    grid = [["<fcel>" + rng.choice(WORDS).title() for _ in range(columns)]]
    for r in range(rows):
        row = []
        for _ in range(columns):
            roll = rng.random()
            cell = "<ecel>" if roll < 0.1 else f"<fcel>{rng.randint(0, 999)}"
            if roll > 0.92 and r:
                cell = f"<fcel>{rng.choice(WORDS)} & <{rng.choice(WORDS)}>"  # escaped in HTML
            row.append(cell)
        grid.append(row)
    if columns > 2 and rng.random() < 0.5:
        grid[0][1] = "<lcel>"  # the first header cell spans two columns
    if rows > 2 and rng.random() < 0.5:
        grid[2][0] = "<ucel>"  # a row label spans two rows
    if rng.random() < 0.3:
        grid[-1].pop()
    return "".join("".join(row) + "<nl>" for row in grid)


def latex(rng: random.Random) -> str:
    """A display formula as the model writes one: `\\[…\\]` or `$$…$$`, maybe with a tag."""
    a, b, c = rng.sample(SYMBOLS, 3)
    body = rng.choice(
        (
            f"{a}^{{2}}+{b}^{{2}}={c}^{{2}}",
            f"\\frac{{{a}}}{{{b}}}=\\sum_{{i=1}}^{{n}} {c}_{{i}}",
            f"\\int_{{0}}^{{1}} {a}\\,d{b}={c}",
        )
    )
    if rng.random() < 0.4:
        body += f" \\tag{{{rng.randint(1, 20)}}}"
    return f"\\[{body}\\]" if rng.random() < 0.6 else f"$${body}$$"


def chart_table(rng: random.Random) -> str:
    """A chart read out as a `|`-separated table, header first."""
    series = rng.sample(WORDS, rng.randint(1, 3))
    lines = [" | ".join(["Year", *series])]
    for year in range(2018, 2018 + rng.randint(2, 5)):
        lines.append(" | ".join([str(year), *(str(rng.randint(0, 99)) for _ in series)]))
    return "\n".join(lines)


def answer(prompt: str, digest: str, width: int, height: int) -> str:
    """The stand-in's answer: a function of the prompt and the image (digest, size) alone."""
    rng = random.Random(int(hashlib.sha256(f"{prompt}\0{digest}".encode()).hexdigest(), 16))
    if prompt == "Table Recognition:":
        return otsl_table(rng)
    if prompt == "Formula Recognition:":
        return latex(rng)
    if prompt == "Chart Recognition:":
        return chart_table(rng)
    if prompt == "Seal Recognition:":
        return f"{rng.choice(WORDS).title()} {rng.choice(WORDS).title()} Co., Ltd."
    if width <= 80 and height <= 60:  # a formula number, a page number
        number = rng.randint(1, 40)
        return rng.choice((f"({number})", f"\\(({number})\\)", str(number)))
    return heading(rng) if height <= 50 and width >= 6 * height else ocr_text(rng)


def parse(body: dict[str, Any]) -> Received:
    """The prompt and image of an OpenAI chat body (one user message, image then text)."""
    prompt, digest, width, height, fmt = "", "", 0, 0, ""
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            prompt = content
            continue
        for part in content or []:
            if part.get("type") == "text":
                prompt = part["text"]
            elif part.get("type") == "image_url":
                digest, width, height, fmt = image_digest(part["image_url"]["url"])
    kwargs = tuple(sorted((body.get("mm_processor_kwargs") or {}).items()))
    sampling = tuple((name, body[name]) for name in SAMPLING if name in body)
    return Received(prompt, digest, width, height, fmt, kwargs, sampling, body)


@dataclass
class StandinVLM:
    """The stand-in's ASGI app and what it received (read from the test's thread)."""

    served: str = SERVED
    url: str = ""  # set once it listens
    received: list[Received] = field(default_factory=list)
    # a fake fault: one `OCR:` block in `fake_loop_every` (chosen by its pixels) loops to its
    # token limit, as PaddleOCR-VL now and then does (0: none)
    fake_loop_every: int = 0
    token_seconds: float = 0.0  # the pace of decoding: between two streamed tokens, or per token
    # of a whole answer before it is sent
    streamed: list[tuple[Received, int, int]] = field(default_factory=list)  # (request,
    # tokens sent before the stream ended or the client left, tokens it would have sent)
    _open: int = field(default=0, init=False, repr=False)  # streams begun, not yet in `streamed`
    _ended: threading.Condition = field(
        default_factory=threading.Condition, init=False, repr=False, compare=False
    )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/health":
            await _json(send, 200, {})
        elif path == "/v1/models":
            model = {"id": self.served, "object": "model", "owned_by": "vllm"}
            listing = [{**model, "max_model_len": MAX_MODEL_LEN}]
            await _json(send, 200, {"object": "list", "data": listing})
        elif path == "/v1/chat/completions":
            await self._chat(receive, send)
        else:
            await _json(send, 404, {"error": {"message": f"no route {path}"}})

    async def _chat(self, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        try:
            request = parse(orjson.loads(body))
        except (ValueError, KeyError, TypeError, binascii.Error, OSError) as exc:
            error = {"message": f"stand-in VLM: bad request: {exc}", "type": "BadRequestError"}
            await _json(send, 400, {"error": {**error, "param": None, "code": 400}})
            return
        self.received.append(request)
        model = request.body.get("model", self.served)
        if self.fake_loop_every and loops_here(request, self.fake_loop_every):
            tokens = looping(request, request_limit(request))
        else:
            tokens = words(answer(request.prompt, request.digest, request.width, request.height))
        finish = "length" if len(tokens) >= request_limit(request) else "stop"
        if request.body.get("stream"):
            await self._stream((receive, send), model, tokens, request, finish)
        else:
            await asyncio.sleep(self.token_seconds * len(tokens))  # the time to decode them
            await _json(send, 200, _completion(model, "".join(tokens), len(tokens), finish))

    async def _stream(
        self,
        channel: tuple[Receive, Send],
        model: str,
        tokens: list[str],
        request: Received,
        finish: str,
    ) -> None:
        """`tokens` one an event, `token_seconds` apart, usage on each as vLLM writes it when
        asked (`continuous_usage_stats`); the tokens sent before the client left are recorded
        (`streamed`), as vLLM would have generated them."""
        receive, send = channel
        with self._ended:
            self._open += 1  # before the client sees a byte: `streams_ended` waits for it
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        left = asyncio.Event()
        watcher = asyncio.create_task(_until_gone(receive, left))
        options = request.body.get("stream_options") or {}
        sent = 0
        try:
            for token in tokens:
                if left.is_set():
                    break
                sent += 1
                choice = {"index": 0, "delta": {"content": token}, "finish_reason": None}
                if sent == len(tokens):
                    choice["finish_reason"] = finish
                event: dict[str, Any] = {"object": "chat.completion.chunk", "model": model}
                event["choices"] = [choice]
                if options.get("continuous_usage_stats"):
                    event["usage"] = _usage(sent)
                await send({"type": "http.response.body", "body": _event(event), "more_body": True})
                await asyncio.sleep(self.token_seconds)
            else:
                if options.get("include_usage"):
                    tail = {"object": "chat.completion.chunk", "choices": [], "usage": _usage(sent)}
                    await send(
                        {"type": "http.response.body", "body": _event(tail), "more_body": True}
                    )
                await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        finally:
            watcher.cancel()
            with self._ended:
                self.streamed.append((request, sent, len(tokens)))
                self._open -= 1
                self._ended.notify_all()

    def streams_ended(self, timeout: float = 30.0) -> list[tuple[Received, int, int]]:
        """`streamed` once every stream begun has ended and is in it. A client that stops
        reading (the gateway's loop guard) has its answer before the stand-in notices it left,
        so a test reading `streamed` at once can miss the last stream (CI once did)."""
        with self._ended:
            if not self._ended.wait_for(lambda: self._open == 0, timeout):
                raise TimeoutError(f"{self._open} stream(s) still open after {timeout} s")
            return list(self.streamed)

    def keys(self) -> list[tuple[str, str, int, int]]:
        """The (prompt, digest, width, height) of every request so far, in arrival order."""
        return [request.key for request in self.received]


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


def words(text: str) -> list[str]:
    """`text` as the stand-in's tokens: a word (with the spaces before it) a token."""
    return re.findall(r"\s*\S+|\s+$", text) or [""]


def loops_here(request: Received, every: int) -> bool:
    """Whether the fake loop picks this request: an `OCR:` block, one in `every` by pixels."""
    return request.prompt == "OCR:" and int(request.digest[:8] or "0", 16) % every == 0


def looping(request: Received, limit: int) -> list[str]:
    """A looping answer `limit` tokens long: a line of text, then one short phrase over and
    over (a phrase of 2-3 words, the unit the guard should keep once)."""
    before, repeated = loop_parts(request)
    start, unit = words(before), words(repeated)
    tokens = start + unit * (limit // len(unit) + 1)
    return tokens[:limit]


def loop_parts(request: Received) -> tuple[str, str]:
    """(the text before the loop, the repeated unit) of `looping`'s answer."""
    rng = random.Random(int(hashlib.sha256(f"loop\0{request.digest}".encode()).hexdigest(), 16))
    return _words(rng, 3, 8) + ".", " " + _words(rng, 2, 3)


def request_limit(request: Received) -> int:
    limit = request.body.get("max_completion_tokens") or request.body.get("max_tokens")
    return limit if isinstance(limit, int) else MAX_MODEL_LEN


async def _until_gone(receive: Receive, left: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    left.set()


def _event(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens}


def _completion(model: str, text: str, tokens: int, finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens},
    }
