"""What runs on the GPUs under compose: the profile's engines per GPU by default, one or two under
MPS on each of GPUS GPUs, and the layout service; resolved by Docker Compose v2 itself.

Nothing starts here (no GPU, no MPS daemon): whether MPS in containers serves as measured is the
GPU run's to show. The docker tier (tests/deploy/docker/) starts the CPU layout for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from app.profiles.engines import MPS_ENGINES, plan_for_card
from app.profiles.gpus import CARDS, Card, card_for_profile
from app.profiles.memory import layout_batch
from app.profiles.parsers import ServeParser
from app.profiles.reports import engines_env
from app.profiles.shapes import load_shape
from tests.deploy.compose import BASE, ROOT, compose_binary, profiles, resolved, run_config
from tests.deploy.layouts import engines_file, layout_env_file

PIPES = "/tmp/nvidia-mps"  # noqa: S108 (MPS's default pipe directory, shared by design)
LAYOUTS = ROOT / "compose" / "layouts"
TWO_FIT = [card for card in CARDS if not plan_for_card(card, load_shape(), MPS_ENGINES).errors]
"""The classes with room for two engines beside the layout service (32 GiB and more)."""


def generate(*arguments: str) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "scripts" / "compose_gpus.py")
    return subprocess.run(
        [sys.executable, script, *arguments], capture_output=True, text=True, check=False
    )


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> volume name, for the service's named volumes."""
    return {v["target"]: v["source"] for v in service["volumes"] if v["type"] == "volume"}


def devices(service: dict[str, Any]) -> list[list[str]]:
    reserved = service["deploy"]["resources"]["reservations"]["devices"]
    return [device["device_ids"] for device in reserved]


def engines(services: dict[str, Any]) -> list[str]:
    """The vLLM services: every one carries the alias the gateway discovers them by."""
    return sorted(
        name
        for name, service in services.items()
        if "vllm-backends" in (service["networks"].get("default") or {}).get("aliases", [])
    )


@pytest.mark.parametrize("profile", profiles())
def test_each_profile_includes_the_engines_its_header_gives(profile: str) -> None:
    """compose/engines/<profile>.yml defaults ENGINES_PER_GPU to the catalogue's number, which
    tests/profiles holds equal to the profile header's `Engines per GPU`."""
    assert (ROOT / "compose" / "engines" / f"{profile}.yml").read_text() == engines_file(profile)


@pytest.mark.parametrize(
    ("profile", "expected"),
    [(card.profile, card.engines_per_gpu) for card in CARDS] + [("cpu", 1)],
)
def test_plain_compose_runs_the_profiles_engines_per_gpu(
    profile: str, expected: int, tmp_path: Path
) -> None:
    """`docker compose up` with only GPU_PROFILE: as many engines per GPU as the catalogue (and
    so the header) says, two under an MPS daemon, one without."""
    services = resolved([BASE], tmp_path, GPU_PROFILE=profile)["services"]
    if expected == 2:
        assert engines(services) == ["vllm", "vllm-b"]
        assert "mps" in services
    else:
        assert engines(services) == ["vllm"]
        assert "mps" not in services


def test_plain_compose_on_an_h200_runs_two_engines_under_mps(tmp_path: Path) -> None:
    """GPU_PROFILE=h200-141gb and nothing else: the measured best, two engines with the plan's
    share under one MPS daemon, the layout service joined to it; every other class one."""
    services = resolved([BASE], tmp_path, GPU_PROFILE="h200-141gb")["services"]
    assert engines(services) == ["vllm", "vllm-b"]
    assert all(services[name]["ipc"] == "service:mps" for name in ("vllm", "vllm-b", "layout"))
    assert services["vllm"]["environment"]["ENGINE_GPU_MEMORY_UTILIZATION"] == "0.47"
    assert [card.profile for card in CARDS if card.engines_per_gpu == 2] == ["h200-141gb"]


@pytest.mark.parametrize("count", ["1", "2"])
def test_one_word_runs_one_engine_on_the_h200(count: str, tmp_path: Path) -> None:
    """ENGINES_PER_GPU=1: one engine per GPU, no MPS daemon, the layout service unshared."""
    services = resolved(
        [BASE], tmp_path, GPU_PROFILE="h200-141gb", ENGINES_PER_GPU="1", GPUS=count
    )["services"]
    assert engines(services) == ["vllm", *(["vllm-1"] if count == "2" else [])]
    assert not {"mps", "mps-1"} & set(services)
    assert "ipc" not in services["layout"]
    assert "--gpu-memory-utilization" not in str(services["vllm"]["entrypoint"])


@pytest.mark.parametrize(
    "name", ["gpus-1-engines-1", "gpus-1-engines-2", "gpus-2-engines-1", "gpus-2-engines-2", "cpu"]
)
def test_every_shipped_layout_is_the_generators_output(name: str) -> None:
    """compose/layouts/*.yml are exactly `scripts/compose_gpus.py`'s output, so they never drift."""
    count, _, engines_per_gpu = name.removeprefix("gpus-").partition("-engines-")
    arguments = ["--cpu"] if name == "cpu" else [count, "--engines-per-gpu", engines_per_gpu]
    assert (LAYOUTS / f"{name}.yml").read_text() == generate(*arguments).stdout


@pytest.mark.parametrize("card", TWO_FIT, ids=lambda card: card.profile)
def test_every_mps_env_file_is_the_two_engine_plan(card: Card) -> None:
    """compose/mps/<profile>.env holds what `ocrvl profile plan --engines-per-gpu 2 --env`
    prints: each engine's share, max-num-seqs and fixed KV cache, and that plan starts."""
    result = plan_for_card(card, load_shape(), MPS_ENGINES)
    path = ROOT / "compose" / "mps" / f"{card.profile}.env"
    assert path.read_text() == engines_env(result, card.profile)


@pytest.mark.parametrize("card", TWO_FIT, ids=lambda card: card.profile)
def test_the_mps_layout_resolves_for_every_class_with_room(card: Card, tmp_path: Path) -> None:
    """A daemon owning the IPC namespace and the pipe volume; two engines and the layout service
    on the same GPU that join both and wait for it; the engines carry the plan."""
    services = resolved([BASE], tmp_path, GPU_PROFILE=card.profile, ENGINES_PER_GPU="2")["services"]
    assert {"mps", "vllm", "vllm-b", "layout", "gateway", "nginx"} == set(services)
    daemon = services["mps"]
    assert daemon["entrypoint"] == ["nvidia-cuda-mps-control", "-f"]
    assert daemon["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == PIPES
    assert daemon["ipc"] == "shareable"
    assert mounts(daemon)[PIPES] == "nvidia-mps"
    assert devices(daemon) == [["0"]]
    flags = plan_for_card(card, load_shape(), MPS_ENGINES).flags
    for name in ("vllm", "vllm-b", "layout"):
        client = services[name]
        assert client["ipc"] == "service:mps", name
        assert mounts(client)[PIPES] == "nvidia-mps", name
        assert client["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == PIPES, name
        assert devices(client) == [["0"]], name
        assert client["depends_on"]["mps"]["condition"] == "service_healthy", name
    for name in ("vllm", "vllm-b"):
        engine = services[name]
        assert f"/vllm_configs/{card.profile}.yaml" in engine["command"], name
        planned = {
            key: engine["environment"][f"ENGINE_{key.upper().replace('-', '_')}"] for key in flags
        }
        assert planned == {key: str(value) for key, value in flags.items()}, name
    gateway = services["gateway"]
    assert gateway["environment"]["OCRVL_BACKENDS"] == "dns+http://vllm-backends:8000"


@pytest.mark.parametrize("profile", ["rtx3060-12gb", "rtx4090-24gb", "cpu"])
def test_two_engines_where_none_fit_are_refused_or_ignored(profile: str, tmp_path: Path) -> None:
    """The RTX 3060 and RTX 4090 have no room for two beside the layout service (no compose/mps/
    plan: compose refuses, naming it); the CPU layout has one engine whatever ENGINES_PER_GPU
    says."""
    env = {"GPU_PROFILE": profile, "VLLM_API_KEY": "k", "ENGINES_PER_GPU": "2"}
    result = run_config([BASE], env, tmp_path=tmp_path)
    if profile == "cpu":
        assert result.returncode == 0, result.stderr
        assert engines(json.loads(result.stdout)["services"]) == ["vllm"]
    else:
        assert result.returncode != 0
        assert f"compose/mps/{profile}.env" in result.stderr


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
    then the plan's flags, and the plan wins over the profile's 0.94."""
    engine = resolved([BASE], tmp_path, GPU_PROFILE="h200-141gb")["services"]["vllm-b"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (bin_dir / "vllm").chmod(0o755)
    # `config` writes a literal $ as $$, as the file does; the container's shell sees one $.
    entrypoint = [part.replace("$$", "$") for part in engine["entrypoint"]]
    environment = {**engine["environment"], "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    environment = {key: value for key, value in environment.items() if value is not None}
    ran = subprocess.run(
        [*entrypoint, *engine["command"]], capture_output=True, text=True, env=environment,
        check=True,
    )  # fmt: skip
    arguments = ran.stdout.splitlines()
    assert arguments[:4] == ["serve", "PaddlePaddle/PaddleOCR-VL-1.5", "--config",
                             "/vllm_configs/h200-141gb.yaml"]  # fmt: skip
    profile = ROOT / "vllm_configs" / "h200-141gb.yaml"
    namespace = serve_parser.parse_config_file(profile, *arguments[4:])
    card = card_for_profile("h200-141gb")
    assert card is not None
    flags = plan_for_card(card, load_shape(), MPS_ENGINES).flags
    assert namespace.gpu_memory_utilization == flags["gpu-memory-utilization"] == 0.47
    assert namespace.max_num_seqs == flags["max-num-seqs"]
    assert namespace.kv_cache_memory_bytes == flags["kv-cache-memory-bytes"]
    assert namespace.max_model_len == 8192  # the rest is the profile's


def test_two_gpus_of_two_engines_give_each_gpu_a_daemon(tmp_path: Path) -> None:
    """GPUS=2 on an H200: per GPU a daemon, its own pipe volume and IPC, two engines pinned to
    that GPU; the layout service on GPU 0 with GPU 0's daemon; DNS finds all four engines."""
    services = resolved([BASE], tmp_path, GPU_PROFILE="h200-141gb", GPUS="2")["services"]
    layout = {"mps": ("0", ["vllm", "vllm-b", "layout"]), "mps-1": ("1", ["vllm-1", "vllm-1-b"])}
    volumes = set()
    for daemon, (gpu, clients) in layout.items():
        assert devices(services[daemon]) == [[gpu]]
        volume = mounts(services[daemon])[PIPES]
        volumes.add(volume)
        for name in clients:
            assert devices(services[name]) == [[gpu]], name
            assert services[name]["ipc"] == f"service:{daemon}", name
            assert mounts(services[name])[PIPES] == volume, name
    assert len(volumes) == 2
    assert engines(services) == ["vllm", "vllm-1", "vllm-1-b", "vllm-b"]


def copy_of_the_compose_tree(folder: Path) -> Path:
    """docker-compose.yml, compose/ and vllm_configs/ in `folder`: a project to add layouts to."""
    folder.mkdir()
    shutil.copy(ROOT / BASE, folder / BASE)
    shutil.copytree(ROOT / "compose", folder / "compose")
    shutil.copytree(ROOT / "vllm_configs", folder / "vllm_configs")
    return folder


@pytest.mark.parametrize("count", [3, 8])
def test_a_generated_layout_pins_one_engine_per_gpu(count: int, tmp_path: Path) -> None:
    """`compose_gpus.py N` saved as compose/layouts/gpus-N-engines-1.yml: GPUS=N runs one vLLM
    per device id 0..N-1 from one image, all found by their alias, the layout service on 0."""
    project = copy_of_the_compose_tree(tmp_path / "project")
    (project / "compose" / "layouts" / f"gpus-{count}-engines-1.yml").write_text(
        generate(str(count)).stdout
    )
    files = ["--project-directory", str(project), "-f", str(project / BASE)]
    command = [
        str(compose_binary()),
        *files,
        "--env-file",
        os.devnull,
        "config",
        "--format",
        "json",
    ]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GPU_PROFILE": "a100-80gb",
           "VLLM_API_KEY": "k", "GPUS": str(count)}  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    names = ["vllm", *(f"vllm-{index}" for index in range(1, count))]
    assert engines(services) == sorted(names)
    for index, name in enumerate(names):
        assert devices(services[name]) == [[str(index)]], name
        assert services[name]["image"] == services["vllm"]["image"]
    assert devices(services["layout"]) == [["0"]]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["0"], "1 or more"),
        (["1", "--engines-per-gpu", "3"], "invalid choice"),
        (["2", "--cpu"], "--cpu takes no GPU count"),
    ],
)
def test_the_generator_offers_only_the_measured_layouts(arguments: list[str], message: str) -> None:
    """One engine per GPU or two under MPS, on one or more GPUs; or the CPU layout."""
    result = generate(*arguments)
    assert result.returncode == 2
    assert message in result.stderr


def test_the_one_gpu_layouts_follow_gpu_device(tmp_path: Path) -> None:
    """GPU_DEVICE=3 moves the daemon, both engines and the layout service to GPU 3."""
    services = resolved([BASE], tmp_path, GPU_PROFILE="h200-141gb", GPU_DEVICE="3")["services"]
    assert [devices(services[name]) for name in ("mps", "vllm", "vllm-b", "layout")] == [
        [["3"]]
    ] * 4


def layout_batch_of(services: dict[str, Any]) -> str:
    """The layout service's --max-batch as compose resolved its command."""
    command = services["layout"]["command"]
    return str(command[command.index("--max-batch") + 1])


@pytest.mark.parametrize("card", CARDS, ids=lambda card: card.profile)
def test_every_profiles_layout_env_file_is_the_batch_its_card_has_room_for(card: Card) -> None:
    """compose/engines/<profile>.env holds LAYOUT_MAX_BATCH as the memory model gives the card
    (the header's `Layout service:` line, tests/profiles); the CPU profile has none."""
    path = ROOT / "compose" / "engines" / f"{card.profile}.env"
    assert path.read_text() == layout_env_file(card.profile)
    assert f"LAYOUT_MAX_BATCH={layout_batch(card.memory_bytes)}\n" in path.read_text()
    assert not (ROOT / "compose" / "engines" / "cpu.env").exists()


@pytest.mark.parametrize(
    ("profile", "expected"),
    [("rtx3060-12gb", "1"), ("t4-16gb", "2"), ("l4-24gb", "4"), ("h200-141gb", "8"), ("cpu", "8")],
)
def test_plain_compose_gives_the_layout_service_its_cards_batch(
    profile: str, expected: str, tmp_path: Path
) -> None:
    """GPU_PROFILE alone: the layout service's --max-batch is the one the profile keeps room for
    (1 on a 12 GB RTX 3060, 2 on a 16 GB T4, 4 on a 24 GB L4, 8 on larger cards), the service's 8
    on the CPU."""
    assert layout_batch_of(resolved([BASE], tmp_path, GPU_PROFILE=profile)["services"]) == expected


def test_layout_max_batch_given_wins_over_the_profiles(tmp_path: Path) -> None:
    """LAYOUT_MAX_BATCH in the shell or in .env (compose's --env-file here) wins over the
    profile's file, on a GPU profile whose own batch differs and on one whose batch is 8."""
    assert (
        layout_batch_of(
            resolved([BASE], tmp_path, GPU_PROFILE="rtx3060-12gb", LAYOUT_MAX_BATCH="1")["services"]
        )
        == "1"
    )
    env_file = tmp_path / "mine.env"
    env_file.write_text("LAYOUT_MAX_BATCH=3\n")
    for profile in ("rtx3060-12gb", "l4-24gb"):
        services = resolved([BASE], tmp_path, env_file=env_file, GPU_PROFILE=profile)["services"]
        assert layout_batch_of(services) == "3"
