"""Greedy answers of two endpoints for the same pages, compared (issue 37: the plugin on and off).

    python3 -m bench.gpu.same_tokens URL_A URL_B --key KEY --pages 16 --max-tokens 48 --out FILE

Each page is sent alone (no batch beside it, so batch composition cannot move a greedy token) to
A, then to B, with PaddleOCR's body at temperature 0; the answers' texts and token counts must be
equal. On random weights the text is nonsense, which is as good as any text for equality.
Exit 0 when every answer matched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from app.bench.corpus import synthetic
from app.bench.load import Shape, auth


def answer(client: httpx.Client, url: str, key: str, body: bytes) -> dict[str, Any]:
    """One chat completion's text, token count and finish reason."""
    reply = client.post(f"{url}/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"} | auth(key))  # fmt: skip
    reply.raise_for_status()
    data = reply.json()
    choice = data["choices"][0]
    return {"text": choice["message"]["content"], "tokens": data["usage"]["completion_tokens"],
            "finish": choice["finish_reason"]}  # fmt: skip


def compare(urls: list[str], key: str, pages: int, max_tokens: int) -> dict[str, Any]:
    """Every page to each URL in turn; which pages' answers differ."""
    shape = Shape(max_tokens=max_tokens)
    rows = []
    with httpx.Client(timeout=300.0, trust_env=False) as client:
        model = client.get(f"{urls[0]}/v1/models", headers=auth(key)).json()["data"][0]["id"]
        for page in synthetic(pages):
            body = shape.body(page, model)
            got = [answer(client, url, key, body) for url in urls]
            rows.append({"page": page.name, "answers": got, "equal": got[0] == got[1]})
    return {
        "urls": urls,
        "pages": pages,
        "max_tokens": max_tokens,
        "equal": sum(row["equal"] for row in rows),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.same_tokens")
    parser.add_argument("urls", nargs=2)
    parser.add_argument("--key", default="")
    parser.add_argument("--pages", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    report = compare(args.urls, args.key, args.pages, args.max_tokens)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"same tokens: {report['equal']} of {report['pages']} pages equal", flush=True)
    return 0 if report["equal"] == report["pages"] else 1


if __name__ == "__main__":
    sys.exit(main())
