"""`ocrvl ocr FILE --job` and `ocrvl jobs status|result|cancel|list`: jobs from the shell.

Imports only argparse at module level (httpx loads on use). Interrupted while following a job,
`ocrvl ocr --job` prints the job's id: the job goes on, and `ocrvl jobs` picks it up again; the
command stops there (app/client.py lists the files it did not send). Interrupted while sending a
file, it says the file may have become a job. A Ctrl-C ends every command with status 130 and a
line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.progress import Progress

ACCEPT = {"md": "text/markdown", "json": "application/json", "ndjson": "application/x-ndjson"}
POLL_EVERY = 1.0
INTERRUPTED = 130


def connection_flags(parser: argparse.ArgumentParser) -> None:
    """`--url` and `--key`, as `ocrvl ocr` has them."""
    parser.add_argument(
        "--url",
        default=os.environ.get("OCRVL_URL", "http://127.0.0.1:8000"),
        help="gateway base URL (default OCRVL_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--key", default=os.environ.get("OCRVL_API_KEY"), help="API key (default OCRVL_API_KEY)"
    )


def register(commands: Any) -> None:
    """Add `jobs` to the `ocrvl` command tree."""
    jobs = commands.add_parser("jobs", help="document jobs on a gateway (see `ocrvl ocr --job`)")
    actions = jobs.add_subparsers(metavar="ACTION", required=True)
    status = actions.add_parser("status", help="a job's status and progress (JSON)")
    status.add_argument("id")
    status.add_argument("--wait", type=float, default=0, help="long-poll up to N s (<= 60)")
    status.set_defaults(func=_status)
    result = actions.add_parser("result", help="write a job's result (the pages done so far)")
    result.add_argument("id")
    result.add_argument("--out", type=Path, help="result file (.md, .json, .ndjson)")
    result.add_argument("--format", choices=tuple(ACCEPT), help="default from --out, or md")
    result.set_defaults(func=_result)
    cancel = actions.add_parser("cancel", help="cancel a job (its finished pages are kept)")
    cancel.add_argument("id")
    cancel.set_defaults(func=_cancel)
    listing = actions.add_parser("list", help="your jobs, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.add_argument("--after", help="list after this job id")
    listing.set_defaults(func=_list)
    for parser in (status, result, cancel, listing):
        connection_flags(parser)


def _client(args: argparse.Namespace) -> Any:
    import httpx  # noqa: PLC0415 (lazy: `ocrvl --help` stays instant)

    headers = {"authorization": f"Bearer {args.key}"} if args.key else {}
    timeout = httpx.Timeout(30.0, read=120.0)
    return httpx.Client(base_url=args.url, headers=headers, timeout=timeout, trust_env=False)


class Refused(Exception):
    """The gateway answered with an error."""


def refused(response: Any, message: str) -> str:
    """The gateway's refusal as the commands print it; a 401 says where the key comes from."""
    text = f"HTTP {response.status_code}: {message}"
    if response.status_code == 401:
        sent = "authorization" in response.request.headers
        text += (
            "; the key sent (--key or OCRVL_API_KEY) is not one this gateway knows"
            if sent
            else "; no key was sent: give one with --key KEY or the OCRVL_API_KEY variable "
            "(`ocrvl keys create NAME` makes one)"
        )
    return text


def _checked(response: Any) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise Refused(refused(response, message))
    return response


def _run(args: argparse.Namespace, action: Any) -> int:
    import httpx  # noqa: PLC0415

    try:
        with _client(args) as http:
            code: int = action(http)
            return code
    except (Refused, httpx.HTTPError, OSError) as exc:
        print(f"ocrvl jobs: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ocrvl jobs: interrupted", file=sys.stderr)
        return INTERRUPTED


def _status(args: argparse.Namespace) -> int:
    def action(http: Any) -> int:
        params = {"wait": str(args.wait)} if args.wait else {}
        job = _checked(http.get(f"/v1/ocr/jobs/{args.id}", params=params)).json()
        print(json.dumps(job, indent=2))
        return 0

    return _run(args, action)


def _result(args: argparse.Namespace) -> int:
    return _run(args, lambda http: write_result(http, args.id, args.out, args.format))


def _cancel(args: argparse.Namespace) -> int:
    def action(http: Any) -> int:
        job = _checked(http.delete(f"/v1/ocr/jobs/{args.id}")).json()
        print(f"{job['id']}: {job['status']}, deleted")
        return 0

    return _run(args, action)


def _list(args: argparse.Namespace) -> int:
    def action(http: Any) -> int:
        params = {"limit": str(args.limit), **({"after": args.after} if args.after else {})}
        page = _checked(http.get("/v1/ocr/jobs", params=params)).json()
        print(f"{'ID':<30} {'STATUS':<10} {'PAGES':>11} {'CREATED':<20}")
        for job in page["data"]:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(job["created_at"]))
            pages = f"{job['pages_done']}/{job['pages_total']}"
            print(f"{job['id']:<30} {job['status']:<10} {pages:>11} {created:<20}")
        if page["has_more"]:
            print(f"more: ocrvl jobs list --after {page['last_id']}", file=sys.stderr)
        return 0

    return _run(args, action)


def write_whole(path: Path, text: str) -> None:
    """`text` into `path` whole or not at all: written to NAME.partial, then renamed over it, so
    no reader (nor a Ctrl-C) ever sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def write_result(http: Any, job_id: str, out: Path | None, fmt: str | None) -> int:
    """The job's result to `out` (or stdout) in `fmt`; 1 when a page failed."""
    if fmt is None:
        suffix = out.suffix.lstrip(".") if out is not None else ""
        fmt = suffix if suffix in ACCEPT else "md"
    response = _checked(http.get(f"/v1/ocr/jobs/{job_id}/result", headers={"accept": ACCEPT[fmt]}))
    if out is None:
        sys.stdout.write(response.text)
        sys.stdout.flush()
    else:  # a Ctrl-C mid-write leaves `out` as it was
        write_whole(out, response.text)
    return 1 if response.headers.get("x-ocr-pages-failed", "0") != "0" else 0


def follow(http: Any, file: Path, fields: dict[str, str], out: Path | None, fmt: str | None) -> int:
    """Submit `file` as a job, draw its progress from its status, then write its result."""
    try:
        with file.open("rb") as handle:
            files = {"file": (file.name, handle, "application/octet-stream")}
            job = _checked(http.post("/v1/ocr/jobs", data=fields, files=files)).json()
    except KeyboardInterrupt:  # the gateway may have made the job, its answer not read
        print(f"ocrvl ocr: interrupted while sending {file}: it may or may not have become a "
              "job (`ocrvl jobs list` shows it)", file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    progress = Progress(file.name, sys.stderr)
    # Ctrl-C from the moment the job exists (its id on the terminal included) leaves it running
    # and says how to pick it up: never a traceback, however soon after the id it comes.
    try:
        print(f"{file.name}: job {job['id']}", file=sys.stderr)
        progress.start(job["pages_total"])
        while job["status"] in ("queued", "running"):
            time.sleep(POLL_EVERY)
            job = _checked(http.get(f"/v1/ocr/jobs/{job['id']}")).json()
            while progress.done < job["pages_done"]:
                progress.step(failed=progress.failed < job["pages_failed"])
    except KeyboardInterrupt:
        progress.finish()
        print(
            f"interrupted; job {job['id']} goes on: `ocrvl jobs status {job['id']}`, "
            f"`ocrvl jobs result {job['id']}`",
            file=sys.stderr,
        )
        return INTERRUPTED
    progress.finish()
    if job["status"] != "succeeded":
        error = (job.get("error") or {}).get("message", "")
        raise Refused(f"job {job['id']} {job['status']}" + (f": {error}" if error else ""))
    try:
        return write_result(http, job["id"], out, fmt)
    except KeyboardInterrupt:
        print(f"interrupted; job {job['id']} succeeded: `ocrvl jobs result {job['id']}` writes "
              "its result", file=sys.stderr)  # fmt: skip
        return INTERRUPTED
