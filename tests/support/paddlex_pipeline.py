"""PaddleX's own PaddleOCR-VL-1.5 pipeline on given pages with given layout boxes, and the
session's PaddleX worker that runs it and tests/paddlex/paddlex_serving.py.

Runs tests/support/paddlex_fixed_layout.py in `.venv-paddleocr` (`PADDLEOCR_VENV`; its pins
clash with the gateway's and vLLM's, so it is another process) against an OpenAI-compatible
server, the layout model replaced by boxes looked up by page size (that script says how and
why). Every PaddleX script of a session runs in one worker (`worker()`, tests/support/
paddlex_worker.py), which imports PaddleX once and forks a child per call.
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import paddlex_worker

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("PADDLEOCR_VENV", ROOT / ".venv-paddleocr"))
SCRIPT = ROOT / "tests" / "support" / "paddlex_fixed_layout.py"
TIMEOUT = 300.0  # the worker's import ~5-15 s (first call), then one request per block
PRELOAD = (  # what the worker imports once: what the scripts' calls would import every time
    "numpy",
    "pydantic",
    "bs4",
    "paddlex",
    "paddlex.inference",
    "paddlex.inference.pipelines.paddleocr_vl.pipeline",
    "paddlex.inference.pipelines.layout_parsing.title_level",
    "paddlex.inference.models.layout_analysis.result",
    "paddleocr",
    "openai",  # the VLM's client, and what PaddleX's serving helpers import
)


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


_worker: paddlex_worker.Worker | None = None


def worker() -> paddlex_worker.Worker:
    """The session's PaddleX worker: made at the first call, stopped when pytest exits."""
    global _worker  # noqa: PLW0603 (one per session: each worker pays PaddleX's import)
    if _worker is None:
        home = Path(tempfile.mkdtemp(prefix="paddlex-worker-"))
        _worker = paddlex_worker.Worker(python(), home, environment(home), PRELOAD)
        atexit.register(_worker.stop)
    return _worker


def environment(home: Path) -> dict[str, str]:
    """The environment of the worker and of every call: pytest's, PaddleX offline, and its
    cache in the worker's `home`. PaddleX reads the cache's place at import, so there is one
    cache per session (per worker), not one per call."""
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK": "True",  # no probing of model hosters
        "PADDLE_PDX_CACHE_HOME": str(home / "paddlex-cache"),  # not ~/.paddlex
    }
    # PaddleX draws its layout images in a font it would download; OpenCV's wheel has one
    fonts = sorted(VENV.glob("lib/python*/site-packages/cv2/qt/fonts/DejaVuSans.ttf"))
    if fonts:
        environment["PADDLE_PDX_LOCAL_FONT_FILE_PATH"] = str(fonts[0])
    return environment


def call(script: Path, spec_path: Path, out_path: Path, timeout: float) -> paddlex_worker.Finished:
    """`python SCRIPT SPEC OUT` in the session's worker, in the spec's folder."""
    out_path.unlink(missing_ok=True)  # what the script writes, and only that, is its report
    running = worker()
    return running.run(
        script,
        [str(spec_path), str(out_path)],
        cwd=spec_path.parent,
        env=environment(running.home),
        timeout=timeout,
    )


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
    done = call(SCRIPT, spec_path, out_path, TIMEOUT)
    if not out_path.exists():
        raise PaddleXFailed(f"the PaddleX script wrote nothing ({done.why}):\n{done.output}")
    report = json.loads(out_path.read_text())
    if not report["ok"]:
        error = report["error"]
        raise PaddleXFailed(f"{error['type']}: {error['message']}\n{error['traceback']}")
    return PaddleXRun(report["pages"], report["layout_calls"], report["seconds"])
