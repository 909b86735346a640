"""Run PaddleOCR's own pipeline client on one page; write what it returned as JSON.

Runs in the separate `.venv-paddleocr` (`make paddleocr-venv`: `paddleocr[doc-parser]==3.7.0`,
whose pins - opencv-contrib-python 4.10, PyYAML 6.0.2 - clash with vLLM's in `.venv`), so it
imports nothing from the project. Layout detection, orientation and unwarping are off: no
paddlepaddle and no model download, only the VLM step runs, over HTTP to `--server-url`.

    .venv-paddleocr/bin/python tests/support/paddleocr_client.py \
        --server-url http://127.0.0.1:8000/v1 --api-key sk-... --out result.json page.jpg

Exit 0 with {"ok": true, "pages": [...]} or 1 with {"ok": false, "error": {...}} in `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any


def page_summary(result: Any) -> dict[str, Any]:
    """The parts of one PaddleOCRVLResult the tests look at."""
    blocks = [
        {"label": block.label, "content": block.content, "bbox": list(block.bbox)}
        for block in result["parsing_res_list"]
    ]
    return {
        "keys": sorted(result.keys()),
        "width": result["width"],
        "height": result["height"],
        "blocks": blocks,
        "markdown": result.markdown["markdown_texts"],
    }


def error_summary(exc: BaseException) -> dict[str, Any]:
    """The exception and, for the OpenAI SDK's errors, the HTTP status and body it carries."""
    error: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": traceback.format_exc(limit=8),
    }
    for name in ("status_code", "code", "body"):
        value = getattr(exc, name, None)
        if value is not None:
            error[name] = value
    return error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--server-url", required=True, help="the base URL, ending in /v1")
    parser.add_argument("--api-key", help="vl_rec_api_key; left out, the client sends `null`")
    parser.add_argument("--model-name", help="vl_rec_api_model_name (default: the pipeline's)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the pipeline's (4096)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        from paddleocr import PaddleOCRVL  # noqa: PLC0415 (timed)

        timings["import"] = time.monotonic() - started
        options: dict[str, Any] = {
            "vl_rec_backend": "vllm-server",
            "vl_rec_server_url": args.server_url,
            "use_layout_detection": False,
            "use_doc_orientation_classify": False,
            "use_doc_unwarping": False,
        }
        if args.api_key is not None:
            options["vl_rec_api_key"] = args.api_key
        if args.model_name is not None:
            options["vl_rec_api_model_name"] = args.model_name
        pipeline = PaddleOCRVL(**options)
        timings["init"] = time.monotonic() - started
        results = pipeline.predict(args.image, max_new_tokens=args.max_new_tokens)
        timings["predict"] = time.monotonic() - started
        report = {"ok": True, "pages": [page_summary(r) for r in results], "timings": timings}
    except Exception as exc:  # every failure is reported to the test
        timings["failed"] = time.monotonic() - started
        report = {"ok": False, "error": error_summary(exc), "timings": timings}
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2, default=str)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
