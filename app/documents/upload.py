"""The `/v1/ocr` request: a file (multipart upload, base64, data URL or http(s) URL) and options."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import difflib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

import orjson
from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from app import policy, scratch
from app.bodies import capped
from app.documents.errors import DocumentError
from app.documents.job import PROMPTS
from app.documents.layout_options import LayoutOptions, parse_layout
from app.documents.selection import PageSelection
from app.errors import InvalidRequest, Overloaded, PayloadTooLarge, clip, quoted

LOOP_MODES = ("cut", "retry", "off")  # the loop guard (app/documents/streams.py)
DEFAULT_DPI = 144  # PaddleOCR's PDF reader renders at 2x 72 dpi
DPI_RANGE = (36, 600)
JSON_OVERHEAD = 64 * 1024  # options around the file in a JSON or multipart body
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
NO_ROOM_RETRY_AFTER = 5  # seconds: the documents before this one finish and free their files
URL_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,30}):")  # base64 never has a colon


# Every field a document request (/v1/ocr, /v1/ocr/jobs) may carry, form or JSON: one line
# each. Anything else is refused with 400 `unknown_parameter` naming it, as chat refuses an
# unknown field (a misspelt `max_token` would otherwise be dropped and the page read with the
# default). A new field is a line here and its parsing in `parse_options` (or parse_layout).
FIELDS = (
    "file",
    "task",
    "pages",
    "dpi",
    "max_tokens",
    "model",
    "stream",
    "page_images",
    "callback_url",  # jobs
    "layout",  # and the layout pipeline's options (app/documents/layout_options.py)
    "layout_threshold",
    "layout_nms",
    "layout_unclip_ratio",
    "layout_merge_bboxes_mode",
    "layout_shape_mode",
    "markdown_ignore_labels",
    "chart_recognition",
    "seal_recognition",
    "prettify_markdown",
    "show_formula_number",
    "markdown_images",
    "ocr_image_blocks",
    "orientation",
    "unwarp",
    "cache",  # false: the results cache neither answers nor keeps (docs/cache.md)
    "loops",  # the loop guard: cut, retry, off (docs/loops.md)
)


@dataclass(frozen=True, slots=True)
class OcrOptions:
    """What the client asked for, checked."""

    task: str = "ocr"
    pages: PageSelection | None = None
    dpi: int = DEFAULT_DPI
    max_tokens: int | None = None
    model: str | None = None
    stream: bool = False
    page_images: bool = False  # each page's answer carries the image the model read
    callback_url: str | None = None  # jobs only (app/jobs/webhook.py checks it)
    layout: str = "auto"  # auto, on, off (docs/ocr-layout.md)
    layout_options: LayoutOptions = field(default_factory=LayoutOptions)
    cache: bool = True  # false: the results cache neither answers nor keeps (docs/cache.md)
    loops: str | None = None  # cut, retry, off (None: OCRVL_LOOPS); docs/loops.md


@dataclass(slots=True)
class Upload:
    """The file as it arrived: upload, decoded bytes, or a URL still to fetch."""

    options: OcrOptions
    upload: UploadFile | None = None
    data: bytes | None = None
    url: str | None = None


async def read_upload(request: Request, max_file_bytes: int) -> Upload:
    """The request's file and options; 400/413 naming the field otherwise."""
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("multipart/form-data"):
        limit = max_file_bytes + JSON_OVERHEAD
        parser = MultiPartParser(
            request.headers, _limited(request, limit), max_files=1, max_fields=32,
            max_part_size=JSON_OVERHEAD,
        )  # fmt: skip
        try:
            form = await parser.parse()
        except MultiPartException as exc:
            raise InvalidRequest(f"the multipart body cannot be read: {exc.message}") from None
        except OSError as exc:  # Starlette spools uploads over 1 MiB to the temp folder
            raise no_room(exc) from None
        try:
            refuse_unknown(form.keys())  # a file part under another name included
        except InvalidRequest:
            await form.close()
            raise
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            await form.close()
            raise InvalidRequest(
                "`file` is required: a form field with the image or PDF",
                param="file",
                code="missing_required_parameter",
            )
        fields = {k: v for k, v in form.multi_items() if isinstance(v, str)}
        try:
            options = parse_options(fields)
        except Exception:  # a bad option: the route never sees the spooled upload to close it
            await form.close()
            raise
        return Upload(options, upload=upload)
    if content_type.startswith("application/json"):
        limit = max_file_bytes * 4 // 3 + JSON_OVERHEAD  # base64 is 4/3 of the file
        raw = b"".join([chunk async for chunk in _limited(request, limit)])
        return await asyncio.to_thread(_from_json, raw)  # a 60 MB body: not on the event loop
    raise InvalidRequest(
        "send the file as multipart/form-data (field `file`) or as JSON "
        '{"file": "<base64, data: URL or http(s) URL>"}; '
        f"got Content-Type {content_type or 'none'!r}"
    )


def _from_json(raw: bytes) -> Upload:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object with `file`")
    file = body.get("file")
    if file is None or file == "":
        raise InvalidRequest(
            "`file` is required: base64, a data: URL, or an http(s) URL",
            param="file",
            code="missing_required_parameter",
        )
    if not isinstance(file, str):
        raise InvalidRequest(
            f"`file` must be a string (base64, a data: URL, or an http(s) URL); got "
            f"{type(file).__name__} {quoted(file)}",
            param="file",
            code="invalid_type",
        )
    options = parse_options(body)
    if file.startswith(("http://", "https://")):
        return Upload(options, url=file)
    refuse_scheme(file)
    if file.startswith("data:"):
        header, comma, file = file.partition(",")
        if not comma or not header.endswith(";base64"):
            raise InvalidRequest(
                "`file` as a data: URL must be base64: data:application/pdf;base64,...",
                param="file",
            )
    try:
        return Upload(options, data=base64.b64decode(file, validate=True))
    except ValueError:  # binascii.Error, and a non-ASCII string
        raise InvalidRequest(
            "`file` is not valid base64 (nor a data: or http(s) URL)", param="file"
        ) from None


def refuse_scheme(file: str) -> None:
    """400 for a `file` that is a URL of a scheme never fetched (`file:`, `ftp:`, `s3:`): only
    http(s) URLs are, and a data: URL is the file itself."""
    scheme = URL_SCHEME.match(file)
    if scheme is None or scheme.group(1).lower() in ("data", "http", "https"):
        return
    raise InvalidRequest(
        f"`file` is a {clip(scheme.group(1))}: URL, which the server does not fetch (only "
        "http(s) URLs are): send the file itself as base64, a data: URL, or an upload",
        param="file",
        code="invalid_value",
    )


def refuse_unknown(fields: Iterable[str]) -> None:
    """400 `unknown_parameter` for the first field that is not one of FIELDS (the closest
    known name suggested: `max_token`, `maxTokens` → `max_tokens`)."""
    for name in fields:
        if name in FIELDS:
            continue
        close = difflib.get_close_matches(name.lower(), FIELDS, n=1, cutoff=0.75)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise InvalidRequest(
            f"Unrecognized request argument supplied: {clip(name)}{hint} (docs/ocr.md lists "
            "every field of /v1/ocr and /v1/ocr/jobs, docs/ocr-layout.md the layout's)",
            param=clip(name),
            code="unknown_parameter",
        )


def parse_options(fields: dict[str, Any]) -> OcrOptions:
    """The options from form fields (strings) or JSON values; a field not in FIELDS refused."""
    refuse_unknown(fields)
    task = fields.get("task") or "ocr"
    if not isinstance(task, str) or task not in PROMPTS:
        raise InvalidRequest(
            f"`task` must be one of {', '.join(PROMPTS)}; got {quoted(task)}",
            param="task",
            code="invalid_value",
        )
    pages = fields.get("pages")
    if pages is not None and not isinstance(pages, str | int):
        raise InvalidRequest('`pages` must be a string such as "1-3,7"', param="pages")
    try:
        selection = PageSelection.parse(None if pages is None else str(pages))
    except DocumentError as exc:
        raise exc.as_gateway_error() from None
    dpi = _integer(fields, "dpi", DEFAULT_DPI, (*DPI_RANGE, "the dpi range")) or DEFAULT_DPI
    # its upper bound is the served model's length: the route's policy check, as on chat
    max_tokens = _integer(fields, "max_tokens", None, (1, None, ""))
    model = fields.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise InvalidRequest("`model` must be a non-empty string", param="model")
    callback_url = fields.get("callback_url")
    if callback_url == "":
        callback_url = None
    if callback_url is not None and not isinstance(callback_url, str):
        raise InvalidRequest(
            "`callback_url` must be a URL string", param="callback_url", code="invalid_type"
        )
    layout, layout_options = parse_layout(fields)
    return OcrOptions(
        task, selection, dpi, max_tokens, model, _boolean(fields, "stream"),
        _boolean(fields, "page_images"), callback_url, layout, layout_options,
        _boolean(fields, "cache", default=True),
        _loops(fields.get("loops")),
    )  # fmt: skip


def _loops(value: object) -> str | None:
    """The `loops` option: cut, retry or off (None: the server's OCRVL_LOOPS)."""
    if value is None or value == "":
        return None
    if value not in LOOP_MODES:
        raise InvalidRequest(
            f"`loops` must be one of {', '.join(LOOP_MODES)}; got {quoted(value)}",
            param="loops",
            code="invalid_value",
        )
    return str(value)


def _integer(
    fields: dict[str, Any], name: str, default: int | None, bounds: tuple[int, int | None, str]
) -> int | None:
    """The field as an integer within (low, high, the setting that sets high), by chat's own
    rule and wording (app/policy.py); a form field's digits are the integer they spell."""
    value = fields.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    return policy.bounded_integer(name, value, *bounds)


def _boolean(fields: dict[str, Any], name: str, *, default: bool = False) -> bool:
    value = fields.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", ""):
        return value.lower() in ("true", "1") or (value == "" and default)
    raise InvalidRequest(f"`{name}` must be true or false; got {quoted(value)}", param=name)


def _limited(request: Request, limit: int) -> AsyncGenerator[bytes]:
    """The body's chunks, refused with 413 as soon as it passes `limit` bytes."""
    too_large = PayloadTooLarge(
        f"the request body is over {limit} bytes: a file may have at most "
        "OCRVL_MAX_FILE_BYTES; split the document or choose fewer pages before sending"
    )
    return capped(request, limit, too_large)


def no_room(exc: OSError) -> Exception:
    """A full temp folder is the server's problem, for now: 503 with Retry-After, not a 500."""
    if exc.errno not in NO_ROOM:
        return exc
    return Overloaded(
        "no room left to hold the uploaded file on the server (its temp folder is full); "
        f"retry after {NO_ROOM_RETRY_AFTER} s",
        retry_after=NO_ROOM_RETRY_AFTER,
    )


def spool(upload: Upload, data: bytes | None, folder: str) -> tuple[str, bytes]:
    """Write the file where the workers can open it; (path, its first KiB). Blocking: run in
    a thread. A multipart upload's own spooled copy is closed once copied, so a document holds
    one copy of its file while its pages are read, not two. A folder with no room even for
    the file's name (no inode left, a quota reached) is refused as a full one is."""
    path = None
    try:
        fd, path = tempfile.mkstemp(prefix=scratch.prefix("upload"), dir=folder)
        with os.fdopen(fd, "wb") as out:
            if upload.upload is not None:
                source: IO[bytes] = upload.upload.file
                source.seek(0)
                shutil.copyfileobj(source, out, 1024 * 1024)
            else:
                out.write(data or b"")
    except OSError as exc:
        if path is not None:
            remove(path)
        raise no_room(exc) from None
    finally:
        if upload.upload is not None:
            upload.upload.file.close()
    with open(path, "rb") as written:
        return path, written.read(1024)


def remove(path: str) -> None:
    """Delete a spooled file (blocking; a missing file is fine)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
