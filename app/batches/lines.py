"""The input file's rules, as OpenAI's: one JSON object a line, `custom_id` unique, one endpoint.

A file that is not JSONL at all, mixes endpoints, repeats a `custom_id`, holds too many lines or
a line over OCRVL_MAX_BODY_BYTES (chat's own cap on a request) fails the batch at validation
(`errors.data[]`, each naming its line); a line that is JSON but not a request (no `custom_id`,
a method other than POST, no `body` object) or is not JSON at all in a file that otherwise is,
becomes that line's error-file entry and the rest run.
"""

from __future__ import annotations

import secrets
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ENDPOINTS = ("/v1/chat/completions",)
MAX_ERRORS = 100  # validation errors listed; the rest would say the same
SKIP_CHUNK = 1024 * 1024  # a line over the cap is read past in pieces this big


@dataclass(frozen=True, slots=True)
class Line:
    """One request line: its number in the file (1-based) and what it holds, or why not."""

    number: int
    custom_id: str | None
    body: Any  # the request's body (a dict unless `problem` says why not)
    problem: str | None = None


def read_lines(path: Path, cap: int | None = None) -> Generator[tuple[int, bytes | None]]:
    """Each non-blank line of the file with its number (blocking: run in a thread). A line of
    more than `cap` bytes comes as None: it is skipped a chunk at a time, never held whole."""
    limit = -1 if cap is None else cap + 1
    with path.open("rb") as handle:
        number = 0
        while raw := handle.readline(limit):
            number += 1
            if cap is not None and len(raw) > cap and not raw.endswith(b"\n"):
                while (rest := handle.readline(SKIP_CHUNK)) and not rest.endswith(b"\n"):
                    pass
                yield number, None
            elif raw.strip():
                yield number, raw


def parsed(number: int, raw: bytes | None, endpoint: str) -> Line:
    """The line as a request, or the reason it is not one (its error-file entry)."""
    if raw is None:
        return Line(number, None, None, f"line {number} is over the size a line may have")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Line(number, None, None, f"line {number} is not valid JSON: {exc}")
    if not isinstance(value, dict):
        return Line(number, None, None, f"line {number} is not a JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(number, None, None, f"line {number}: `custom_id` must be a non-empty string")
    return Line(number, custom_id, value.get("body"), _problem(value, endpoint))


def _problem(value: dict[str, Any], endpoint: str) -> str | None:
    """What keeps a line with a `custom_id` from being a request, if anything."""
    if value.get("method") != "POST":
        return f'`method` must be "POST"; got {value.get("method")!r}'
    if value.get("url") != endpoint:
        return f"`url` must be the batch's endpoint {endpoint!r}"
    if not isinstance(value.get("body"), dict):
        return "`body` must be a JSON object: the request's body"
    return None


MISMATCHED = "the line's url {!r} is not the batch's endpoint {!r}: one batch, one endpoint"
DUPLICATE = "custom_id {!r} is used by an earlier line: each line's custom_id must be unique"
NOT_JSONL = "the input file is not JSONL: none of its lines is a JSON object (one request a line)"
TOO_MANY = (
    "the input file has {} request lines; a batch may have at most {} (OCRVL_BATCH_MAX_REQUESTS)"
)
TOO_LARGE = (
    "line {} is over {} bytes, what one request may be (OCRVL_MAX_BODY_BYTES, as on "
    "/v1/chat/completions); send a smaller or more compressed image"
)


def validation_errors(
    path: Path, endpoint: str, max_requests: int, max_line_bytes: int
) -> tuple[int, list[dict[str, Any]]]:
    """(request lines, errors that fail the whole batch) for the file (blocking); the file is
    read a line at a time, and a line over `max_line_bytes` is never held whole."""
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    count = objects = 0
    for number, raw in read_lines(path, max_line_bytes):
        count += 1
        if raw is None:
            message = TOO_LARGE.format(number, max_line_bytes)
            errors.append(_error("line_too_large", message, number, None))
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(value, dict):
            continue
        objects += 1
        url, custom_id = value.get("url"), value.get("custom_id")
        if isinstance(url, str) and url != endpoint:
            message = MISMATCHED.format(url[:100], endpoint)
            errors.append(_error("mismatched_endpoint", message, number, "url"))
        if isinstance(custom_id, str):
            if custom_id in seen:
                message = DUPLICATE.format(custom_id[:100])
                errors.append(_error("duplicate_custom_id", message, number, "custom_id"))
            seen.add(custom_id)
    if count == 0:
        errors.append(_error("empty_file", "the input file has no request lines", None, None))
    elif objects == 0:
        errors.append(_error("invalid_file_format", NOT_JSONL, None, None))
    if count > max_requests:
        errors.append(_error("too_many_tasks", TOO_MANY.format(count, max_requests), None, None))
    return count, errors[:MAX_ERRORS]


def _error(code: str, message: str, line: int | None, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def output_line(
    custom_id: str | None,
    status: int | None,
    request_id: str,
    body: Any,
    error: dict[str, Any] | None = None,
) -> bytes:
    """One output (or error) file line, OpenAI's shape: an answer's status and body, or
    (`status` None) an `error` for a line that never became a request."""
    response = (
        None if status is None else {"status_code": status, "request_id": request_id, "body": body}
    )
    line = {
        "id": f"batch_req_{secrets.token_hex(16)}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }
    return orjson.dumps(line) + b"\n"


def is_error(line: dict[str, Any]) -> bool:
    """The line goes to the error file: no answer, or an answer with a 4xx/5xx status."""
    response = line.get("response")
    return line.get("error") is not None or not response or int(response["status_code"]) >= 400
