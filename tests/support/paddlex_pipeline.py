"""PaddleX's own PaddleOCR-VL-1.5 pipeline on given pages with given layout boxes.

Runs tests/support/paddlex_fixed_layout.py in `.venv-paddleocr` (`PADDLEOCR_VENV`; its pins
clash with the gateway's and vLLM's, so it is a subprocess) against an OpenAI-compatible server,
the layout model replaced by boxes looked up by page size (that script says how and why).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("PADDLEOCR_VENV", ROOT / ".venv-paddleocr"))
SCRIPT = ROOT / "tests" / "support" / "paddlex_fixed_layout.py"
TIMEOUT = 300.0  # import ~4 s, then one request per block to a local stand-in


class PaddleXFailed(RuntimeError):
    """The pipeline raised, or the script died: the message carries its traceback."""


@dataclass(frozen=True)
class PaddleXRun:
    """What the pipeline made: one report per page, in input order, and the layout calls."""

    pages: list[dict[str, Any]]
    layout_calls: list[dict[str, Any]]
    seconds: float


def python() -> Path:
    """The Python of `.venv-paddleocr` (it may not exist: callers decide to skip or fail)."""
    return VENV / "bin" / "python"


def run(
    server_url: str,
    inputs: list[Path],
    layouts: dict[str, list[dict[str, Any]]],
    workdir: Path,
    *,
    predict: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> PaddleXRun:
    """`PaddleOCRVL(pipeline_version="v1.5").predict(path, **predict)` for each input."""
    spec = {
        "server_url": server_url,
        "api_key": api_key,
        "inputs": [str(path) for path in inputs],
        "layouts": layouts,
        "predict": predict or {},
    }
    spec_path, out_path = workdir / "paddlex-spec.json", workdir / "paddlex-out.json"
    spec_path.write_text(json.dumps(spec))
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True",  # no probing of model hosters
        "PADDLE_PDX_CACHE_HOME": str(workdir / "paddlex-cache"),  # not ~/.paddlex
    }
    done = subprocess.run(
        [str(python()), str(SCRIPT), str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=TIMEOUT,
        cwd=workdir,
        check=False,
    )
    output = (done.stdout + done.stderr)[-4000:]
    if not out_path.exists():
        raise PaddleXFailed(f"the PaddleX script wrote nothing (exit {done.returncode}):\n{output}")
    report = json.loads(out_path.read_text())
    if not report["ok"]:
        error = report["error"]
        raise PaddleXFailed(f"{error['type']}: {error['message']}\n{error['traceback']}")
    return PaddleXRun(report["pages"], report["layout_calls"], report["seconds"])
