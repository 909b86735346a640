"""`ocrvl ocr FILE...`: send documents to a gateway's /v1/ocr and write the pages as they come.

Imports only argparse at module level: `ocrvl --help` stays instant; httpx loads on use.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import IO, Any

from app.documents.page_markdown import page_markdown
from app.jobs.commands import INTERRUPTED, Refused, follow, refused, write_whole
from app.progress import Progress

FORMATS = ("md", "json", "ndjson")
FIGURE_NAME = re.compile(r"imgs/[A-Za-z0-9_.-]+\.jpg")


def register(commands: Any) -> None:
    """Add `ocr` to the `ocrvl` command tree."""
    ocr = commands.add_parser(
        "ocr",
        help="read documents (images, PDFs) through a gateway's /v1/ocr",
        description="Send each FILE to POST /v1/ocr and write its pages as they arrive. Exit "
        "status 1 when a page failed, 2 when a request did, 130 when interrupted (Ctrl-C).",
    )
    ocr.add_argument("files", nargs="+", metavar="FILE", type=Path)
    ocr.add_argument("--task", default="ocr", help="ocr, table, formula, chart, spotting, seal")
    ocr.add_argument("--pages", help='pages to read, e.g. "1-3,7" (default all)')
    ocr.add_argument("--dpi", type=int, help="PDF rendering resolution (server default 144)")
    ocr.add_argument("--max-tokens", type=int, help="output token cap per page")
    ocr.add_argument("--model", help="model name (default: the first served model)")
    ocr.add_argument(
        "--layout",
        choices=("auto", "on", "off"),
        help="read pages block by block with the server's layout service (default auto: when "
        "it has one and --task is ocr); with a .md --out, figures are written beside it in imgs/",
    )
    ocr.add_argument(
        "--out",
        type=Path,
        help="result file (.md, .json or .ndjson); a folder with several FILEs; default stdout",
    )
    ocr.add_argument("--format", choices=FORMATS, help="output format (default from --out, or md)")
    ocr.add_argument(
        "--job",
        action="store_true",
        help="send each FILE as a job (POST /v1/ocr/jobs): progress from its status; "
        "Ctrl-C stops the command: the job followed goes on (`ocrvl jobs status ID`) and the "
        "FILEs after it are not sent (listed on stderr)",
    )
    ocr.add_argument(
        "--url",
        default=os.environ.get("OCRVL_URL", "http://127.0.0.1:8000"),
        help="gateway base URL (default OCRVL_URL or http://127.0.0.1:8000)",
    )
    ocr.add_argument(
        "--key", default=os.environ.get("OCRVL_API_KEY"), help="API key (default OCRVL_API_KEY)"
    )
    ocr.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read every file; the worst outcome decides the exit status."""
    import httpx  # noqa: PLC0415 (lazy: `ocrvl --help` stays instant)

    if (folder := _missing_folder(args)) is not None:
        print(f"ocrvl ocr: --out {args.out}: the folder {folder} does not exist; create it "
              "or name another", file=sys.stderr)  # fmt: skip
        return 2
    status = 0
    headers = {"accept": "application/x-ndjson"}
    if args.key:
        headers["authorization"] = f"Bearer {args.key}"
    timeout = httpx.Timeout(30.0, read=None)  # a page may take minutes to come back
    with httpx.Client(base_url=args.url, headers=headers, timeout=timeout, trust_env=False) as http:
        for index, file in enumerate(args.files):
            try:
                code = _read_file(http, file, args)
            except (OSError, httpx.HTTPError, RequestFailed) as exc:
                print(f"ocrvl ocr: {file}: {exc}", file=sys.stderr)
                code = 2
            except KeyboardInterrupt:  # a moment no closer handler covers: still no traceback
                print(f"ocrvl ocr: interrupted while reading {file}", file=sys.stderr)
                code = INTERRUPTED
            if code == INTERRUPTED:  # Ctrl-C stops the command, not only the job it followed
                _not_sent(args.files[index + 1 :])
                return INTERRUPTED
            status = max(status, code)
    return status


def _not_sent(files: list[Path]) -> None:
    """The files a Ctrl-C left unsent, on stderr as a shell reads them: none is lost silently."""
    if files:
        print(f"ocrvl ocr: interrupted; not sent: {shlex.join(map(str, files))}", file=sys.stderr)


def _missing_folder(args: argparse.Namespace) -> Path | None:
    """The folder a one-file `--out` would be written in, when it does not exist (several
    files: `--out` is a folder, made when missing)."""
    out: Path | None = args.out
    if out is None or len(args.files) > 1 or out.parent.is_dir():
        return None
    return out.parent


class RequestFailed(Exception):
    """The gateway refused the document."""


def _read_file(http: Any, file: Path, args: argparse.Namespace) -> int:
    fields = {
        name: str(value)
        for name in ("task", "pages", "dpi", "max_tokens", "model", "layout")
        if (value := getattr(args, name)) is not None
    }
    if args.job:
        target = _output(file, args)
        try:
            return follow(http, file, fields, target.path, target.fmt)
        except Refused as exc:
            raise RequestFailed(str(exc)) from None
    out, progress = _output(file, args), Progress(file.name, sys.stderr)
    try:
        with file.open("rb") as handle, out:
            files = {"file": (file.name, handle, "application/octet-stream")}
            with http.stream("POST", "/v1/ocr", data=fields, files=files) as response:
                if response.status_code != 200:
                    response.read()
                    raise RequestFailed(_error_message(response))
                for line in response.iter_lines():
                    if line.strip():
                        _handle(json.loads(line), out, progress)
    except KeyboardInterrupt:  # the connection is closed: the gateway stops reading the pages
        progress.finish()
        print(f"ocrvl ocr: interrupted while reading {file}: {out.set_aside()}", file=sys.stderr)
        return INTERRUPTED
    progress.finish()
    return 1 if out.failed else 0


def _handle(event: dict[str, Any], out: Writer, progress: Progress) -> None:
    kind = event.get("object")
    if kind == "ocr.document":
        out.start(event)
        progress.start(len(event["pages"]))
    elif kind == "ocr.page":
        out.add(event)
        progress.step(failed="error" in event)
    elif kind == "ocr.summary":
        out.finish(event)


def _error_message(response: Any) -> str:
    try:
        return refused(response, json.loads(response.content)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return refused(response, repr(response.content[:300]))


def _output(file: Path, args: argparse.Namespace) -> Writer:
    fmt = args.format
    target: Path | None = args.out
    if target is not None and len(args.files) > 1:
        target.mkdir(parents=True, exist_ok=True)
        target = target / f"{file.name}.{fmt or 'md'}"
    if fmt is None:
        suffix = target.suffix.lstrip(".") if target is not None else ""
        fmt = suffix if suffix in FORMATS else "md"
    return Writer(target, fmt, file.name)


class Writer:
    """Writes results as they arrive: markdown pages in order as soon as they are contiguous,
    NDJSON lines at once, JSON rewritten whole (atomically) after every page. `pages_out`
    counts the pages in the output so far, `touched` says whether this run wrote `path`."""

    def __init__(self, path: Path | None, fmt: str, name: str) -> None:
        self.path, self.fmt, self.name = path, fmt, name
        self.failed = 0
        self.touched = False
        self._pages: dict[int, dict[str, Any]] = {}
        self._order: list[int] = []
        self._written = 0  # markdown: pages of `_order` already out
        self._head: dict[str, Any] = {}
        self._stream: IO[str] = sys.stdout

    def __enter__(self) -> Writer:
        if self.path is not None and self.fmt != "json":
            self._stream = self.path.open("w", encoding="utf-8")
            self.touched = True
        return self

    def __exit__(self, *_: object) -> None:
        if self._stream is not sys.stdout:
            self._stream.close()
        else:
            self._stream.flush()

    def start(self, head: dict[str, Any]) -> None:
        """The document's page numbers, in order."""
        self._head, self._order = head, list(head["pages"])
        if self.fmt == "ndjson":
            self._line(head)
        self._save_json()

    def add(self, page: dict[str, Any]) -> None:
        """One page, in whatever order they finish."""
        self.failed += "error" in page
        if self.fmt == "md" and self.path is not None:
            self._save_images(page.pop("images", None) or {})
        self._pages[page["index"]] = page
        if self.fmt == "ndjson":
            self._line(page)
        elif self.fmt == "json":
            self._save_json()
        else:
            self._flush_markdown()

    @property
    def pages_out(self) -> int:
        """Pages in the output so far: markdown's contiguous ones, every NDJSON line, the JSON
        file's pages (stdout has the JSON only once complete)."""
        if self.fmt == "md":
            return self._written
        return len(self._pages) if self.fmt == "ndjson" or self.path is not None else 0

    def set_aside(self) -> str:
        """After a Ctrl-C: what the output holds. A file this run wrote is renamed NAME.partial:
        it keeps the pages read, and no one takes it for a whole result (a rerun writes NAME)."""
        pages = f"only {self.pages_out} of {len(self._order)} pages" if self._head else "no page"
        if self.path is None:
            return f"{pages} written to stdout"
        if not self.touched:
            return f"no page written, {self.path} left as it was"
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            self.path.replace(partial)
        except OSError as exc:  # said, not raised: the command still stops here
            return f"{self.path} holds {pages}, not renamed {partial}: {exc}"
        return f"{self.path} held {pages}: renamed {partial}"

    def finish(self, summary: dict[str, Any]) -> None:
        """The summary line closes the document."""
        if self.fmt == "ndjson":
            self._line(summary)
        self._save_json(summary.get("usage"))

    def _save_images(self, images: dict[str, str]) -> None:
        """A page's figures (the server's `imgs/NAME.jpg` data URLs) beside the markdown file
        that names them, as PaddleX saves a page's markdown."""
        assert self.path is not None  # noqa: S101 (markdown to a file only)
        for name, url in images.items():
            if not FIGURE_NAME.fullmatch(name) or not url.startswith("data:image/"):
                continue  # only a plain imgs/NAME.jpg is written: nothing outside the folder
            target = self.path.parent / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(url.partition(",")[2]))

    def _line(self, value: dict[str, Any]) -> None:
        self._stream.write(json.dumps(value, ensure_ascii=False) + "\n")
        self._stream.flush()

    def _flush_markdown(self) -> None:
        while self._written < len(self._order) and self._order[self._written] in self._pages:
            text = page_markdown(self._pages[self._order[self._written]])
            self._stream.write(("\n\n" if self._written else "") + text)
            self._written += 1
            if self._written == len(self._order):
                self._stream.write("\n")
            self._stream.flush()

    def _save_json(self, usage: dict[str, Any] | None = None) -> None:
        if self.fmt != "json":
            return
        pages = [self._pages[n] for n in self._order if n in self._pages]
        document = {"file": self.name, "model": self._head.get("model"), "pages": pages}
        if usage is not None:
            document["usage"] = usage
        text = json.dumps(document, ensure_ascii=False, indent=2) + "\n"
        if self.path is None:
            if usage is not None:  # stdout cannot be rewritten: print it once, complete
                self._stream.write(text)
            return
        write_whole(self.path, text)
        self.touched = True
