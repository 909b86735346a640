"""Write the request body `make hey` sends: one synthetic A4 page, shaped like PaddleOCR's client.

    python -m bench.hey_body --out .cache/hey/request.json [--max-tokens 4096] [--model NAME]

The page is a seeded ~300 KB JPEG of text lines (tests/support/pages.py); the body carries what
PaddleOCR's pipeline sends with it (shared/CLIENTS.md): temperature 0, skip_special_tokens,
max_completion_tokens and the min/max pixel hints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.support.pages import chat_body, document_page

# PaddleOCR's own per-request pixel bounds for the VLM step.
MM_PROCESSOR_KWARGS = {"min_pixels": 112896, "max_pixels": 1003520}


def build(model: str, max_tokens: int, seed: int) -> dict[str, object]:
    """The chat completion body for one page."""
    return chat_body(
        document_page(seed),
        model=model,
        max_completion_tokens=max_tokens,
        temperature=0,
        skip_special_tokens=True,
        mm_processor_kwargs=MM_PROCESSOR_KWARGS,
    )


def main(argv: list[str] | None = None) -> int:
    """Write the body to --out and say how big it is."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON body")
    parser.add_argument("--model", default="PaddleOCR-VL-1.5-0.9B", help="model name to send")
    parser.add_argument(
        "--max-tokens", type=int, default=4096, help="max_completion_tokens (PaddleOCR: 4096)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic page")
    args = parser.parse_args(argv)
    body = json.dumps(build(args.model, args.max_tokens, args.seed)).encode()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(body)
    print(f"{args.out}: {len(body) / 1024:.0f} KiB, model {args.model}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
