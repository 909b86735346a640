"""compose/mps.yml: two engines per GPU under NVIDIA MPS, resolved by Docker Compose v2 itself.

Compose validates the layout for every GPU profile here; nothing starts (no GPU, no MPS
daemon), so whether MPS in containers serves as measured is the GPU run's to show.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from app.profiles.engines import MPS_ENGINES, plan_for_card
from app.profiles.gpus import CARDS, Card
from app.profiles.parsers import ServeParser
from app.profiles.reports import engines_env
from app.profiles.shapes import load_shape
from tests.deploy.compose import BASE, ROOT, resolved, run_config

MPS = "compose/mps.yml"
PIPES = "/tmp/nvidia-mps"  # noqa: S108 (MPS's default pipe directory, shared by design)


def generate(count: int, *options: str) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "scripts" / "compose_gpus.py")
    return subprocess.run(
        [sys.executable, script, str(count), *options], capture_output=True, text=True, check=False
    )


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> volume name, for the service's named volumes."""
    return {v["target"]: v["source"] for v in service["volumes"] if v["type"] == "volume"}


def devices(service: dict[str, Any]) -> list[list[str]]:
    reserved = service["deploy"]["resources"]["reservations"]["devices"]
    return [device["device_ids"] for device in reserved]


def test_mps_override_is_the_generators_output() -> None:
    """compose/mps.yml is exactly `scripts/compose_gpus.py 1 --engines-per-gpu 2`."""
    assert (ROOT / MPS).read_text() == generate(1, "--engines-per-gpu", "2").stdout


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_every_mps_env_file_is_the_two_engine_plan(card: Card) -> None:
    """compose/mps/<profile>.env holds what `ocrvl profile plan --engines-per-gpu 2 --env`
    prints: each engine's share, max-num-seqs and fixed KV cache, and that plan starts."""
    result = plan_for_card(card, load_shape(), MPS_ENGINES)
    assert result.errors == ()
    path = ROOT / "compose" / "mps" / f"{card.profile}.env"
    assert path.read_text() == engines_env(result, card.profile)


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_mps_layout_resolves_for_every_gpu_profile(card: Card, tmp_path: Path) -> None:
    """A daemon owning the IPC namespace and the pipe volume; two engines on the same GPU that
    join both, wait for it, and carry the plan; the gateway over both, waiting for both."""
    services = resolved([BASE, MPS], tmp_path, GPU_PROFILE=card.profile)["services"]
    assert {"mps", "vllm", "vllm-b", "gateway", "nginx"} == set(services)
    daemon = services["mps"]
    assert daemon["entrypoint"] == ["nvidia-cuda-mps-control", "-f"]
    assert daemon["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == PIPES
    assert daemon["ipc"] == "shareable"
    assert mounts(daemon) == {PIPES: "nvidia-mps"}
    assert devices(daemon) == [["0"]]
    flags = plan_for_card(card, load_shape(), MPS_ENGINES).flags
    for name in ("vllm", "vllm-b"):
        engine = services[name]
        assert engine["ipc"] == "service:mps", name
        assert mounts(engine)[PIPES] == "nvidia-mps", name
        assert engine["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == PIPES, name
        assert devices(engine) == [["0"]], name
        assert engine["depends_on"]["mps"]["condition"] == "service_healthy", name
        assert f"/vllm_configs/{card.profile}.yaml" in engine["command"], name
        planned = {
            key: engine["environment"][f"ENGINE_{key.upper().replace('-', '_')}"] for key in flags
        }
        assert planned == {key: str(value) for key, value in flags.items()}, name
        assert engine["networks"]["default"]["aliases"] == ["vllm-backends"], name
    gateway = services["gateway"]
    assert gateway["environment"]["OCRVL_BACKENDS"] == "http://vllm:8000,http://vllm-b:8000"
    assert {k: v["condition"] for k, v in gateway["depends_on"].items()} == {
        "vllm": "service_healthy",
        "vllm-b": "service_healthy",
    }


def test_the_cpu_profile_has_no_mps_layout(tmp_path: Path) -> None:
    """MPS shares a GPU: with GPU_PROFILE=cpu compose refuses, naming the missing plan file."""
    result = run_config([BASE, MPS], {"GPU_PROFILE": "cpu", "VLLM_API_KEY": "k"}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "compose/mps/cpu.env" in result.stderr


@pytest.fixture(scope="module")
def serve_parser() -> ServeParser:
    """The installed vLLM's own `vllm serve` parser."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's own, not this project's
        return ServeParser()


def test_the_engine_runs_the_profile_with_its_share_winning(
    tmp_path: Path, serve_parser: ServeParser
) -> None:
    """The engine's entrypoint, run by a real /bin/sh with the container's environment and a
    stand-in `vllm` that prints its arguments, gives vLLM's own parser `--config <profile>`
    then the plan's flags, and the plan wins over the profile's 0.95."""
    engine = resolved([BASE, MPS], tmp_path, GPU_PROFILE="h200-141gb")["services"]["vllm-b"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (bin_dir / "vllm").chmod(0o755)
    # `config` writes a literal $ as $$, as the file does; the container's shell sees one $.
    entrypoint = [part.replace("$$", "$") for part in engine["entrypoint"]]
    environment = {**engine["environment"], "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ran = subprocess.run(
        [*entrypoint, *engine["command"]], capture_output=True, text=True, env=environment,
        check=True,
    )  # fmt: skip
    arguments = ran.stdout.splitlines()
    assert arguments[:4] == ["serve", "PaddlePaddle/PaddleOCR-VL-1.5", "--config",
                             "/vllm_configs/h200-141gb.yaml"]  # fmt: skip
    profile = ROOT / "vllm_configs" / "h200-141gb.yaml"
    namespace = serve_parser.parse_config_file(profile, *arguments[4:])
    card = next(card for card in CARDS if card.profile == "h200-141gb")
    flags = plan_for_card(card, load_shape(), MPS_ENGINES).flags
    assert namespace.gpu_memory_utilization == flags["gpu-memory-utilization"] == 0.47
    assert namespace.max_num_seqs == flags["max-num-seqs"]
    assert namespace.kv_cache_memory_bytes == flags["kv-cache-memory-bytes"]
    assert namespace.max_model_len == 8192  # the rest is the profile's


def test_n_gpu_mps_override_gives_each_gpu_a_daemon_and_two_engines(tmp_path: Path) -> None:
    """--engines-per-gpu 2 for 2 GPUs: per GPU a daemon, its own pipe volume and IPC, two
    engines pinned to that GPU; the gateway over all four."""
    override = tmp_path / "gpus-2-mps.yml"
    override.write_text(generate(2, "--engines-per-gpu", "2").stdout)
    services = resolved([BASE, str(override)], tmp_path, GPU_PROFILE="h100-80gb")["services"]
    layout = {"mps": ("0", ["vllm", "vllm-b"]), "mps-1": ("1", ["vllm-1", "vllm-1-b"])}
    volumes = set()
    for daemon, (gpu, engines) in layout.items():
        assert devices(services[daemon]) == [[gpu]]
        volume = mounts(services[daemon])[PIPES]
        volumes.add(volume)
        for name in engines:
            assert devices(services[name]) == [[gpu]], name
            assert services[name]["ipc"] == f"service:{daemon}", name
            assert mounts(services[name])[PIPES] == volume, name
    assert len(volumes) == 2
    backends = services["gateway"]["environment"]["OCRVL_BACKENDS"].split(",")
    assert backends == [f"http://{name}:8000" for name in ("vllm", "vllm-b", "vllm-1", "vllm-1-b")]


@pytest.mark.parametrize("engines", ["0", "3"])
def test_the_generator_offers_one_or_two_engines_per_gpu(engines: str) -> None:
    """Only the measured layouts: one engine per GPU, or two under MPS."""
    result = generate(1, "--engines-per-gpu", engines)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_the_one_gpu_mps_layout_follows_gpu_device(tmp_path: Path) -> None:
    """GPU_DEVICE=3 moves the daemon and both engines to GPU 3, as it moves the base vLLM."""
    services = resolved([BASE, MPS], tmp_path, GPU_DEVICE="3")["services"]
    assert [devices(services[name]) for name in ("mps", "vllm", "vllm-b")] == [[["3"]]] * 3
