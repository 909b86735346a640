"""scripts/up.sh: GPU_PROFILE detected by `ocrvl profile detect` before `docker compose up -d`.

No GPU to detect here, so `docker` and `ocrvl` are stand-ins on PATH that record their calls
(the docker tier, tests/deploy/docker/, runs `docker compose up` for real).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.compose import ROOT

UP = ROOT / "scripts" / "up.sh"


@pytest.fixture
def stand_ins(tmp_path: Path) -> Path:
    """A bin folder with a recording `docker` and an `ocrvl` that detects an L4."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "docker").write_text(
        '#!/bin/sh\necho "GPU_PROFILE=$GPU_PROFILE docker $*" >> "$RECORD"\n'
    )
    (folder / "ocrvl").write_text(
        '#!/bin/sh\necho "$*" >> "$RECORD"\necho vllm_configs/l4-24gb.yaml\n'
    )
    for stand_in in folder.iterdir():
        stand_in.chmod(0o755)
    return folder


def run_up(
    stand_ins: Path, record: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environment = {
        "PATH": f"{stand_ins}:{os.environ['PATH']}",
        "HOME": str(record.parent),
        "RECORD": str(record),
        **env,
    }
    return subprocess.run(
        [str(UP), *args], capture_output=True, text=True, env=environment, check=False
    )


def test_auto_profile_is_detected_then_compose_starts_with_it(
    stand_ins: Path, tmp_path: Path
) -> None:
    """GPU_PROFILE=auto: the detected profile's name goes to `docker compose up -d`."""
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, "-f", "docker-compose.yml", GPU_PROFILE="auto")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == [
        "profile detect",
        "GPU_PROFILE=l4-24gb docker compose -f docker-compose.yml up -d",
    ]
    assert "GPU_PROFILE=l4-24gb (detected" in result.stderr


def test_an_explicit_profile_is_used_as_is(stand_ins: Path, tmp_path: Path) -> None:
    """A named GPU_PROFILE skips detection."""
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, GPU_PROFILE="a100-80gb")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == ["GPU_PROFILE=a100-80gb docker compose up -d"]


def test_two_engines_per_gpu_add_the_mps_override(stand_ins: Path, tmp_path: Path) -> None:
    """ENGINES_PER_GPU=2: compose runs the base file with compose/mps.yml on top."""
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, GPU_PROFILE="h200-141gb", ENGINES_PER_GPU="2")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == [
        "GPU_PROFILE=h200-141gb docker compose -f docker-compose.yml -f compose/mps.yml up -d"
    ]


def test_detection_only_recommends_two_engines(stand_ins: Path, tmp_path: Path) -> None:
    """A detected H200 (its header: 2 engines per GPU) still gets one engine, and a note
    naming ENGINES_PER_GPU=2: MPS is never switched on by detection (docs/deploy.md)."""
    (stand_ins / "ocrvl").write_text(
        '#!/bin/sh\necho "$*" >> "$RECORD"\necho vllm_configs/h200-141gb.yaml\n'
    )
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, GPU_PROFILE="auto")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines()[-1] == "GPU_PROFILE=h200-141gb docker compose up -d"
    assert "should run 2 engines per GPU under NVIDIA MPS" in result.stderr
    assert "ENGINES_PER_GPU=2" in result.stderr


def test_a_profile_of_one_engine_gets_no_note(stand_ins: Path, tmp_path: Path) -> None:
    """An L4 (GPU-bound, one engine) starts as before, without the MPS note."""
    result = run_up(stand_ins, tmp_path / "calls", GPU_PROFILE="l4-24gb")
    assert result.returncode == 0, result.stderr
    assert "MPS" not in result.stderr


def test_two_engines_with_own_files_use_them_as_given(stand_ins: Path, tmp_path: Path) -> None:
    """-f given: up.sh adds nothing and says to include the MPS override."""
    record = tmp_path / "calls"
    result = run_up(
        stand_ins, record, "-f", "docker-compose.yml", GPU_PROFILE="h200-141gb", ENGINES_PER_GPU="2"
    )
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == [
        "GPU_PROFILE=h200-141gb docker compose -f docker-compose.yml up -d"
    ]
    assert "compose/mps.yml" in result.stderr


def test_other_engine_counts_are_refused(stand_ins: Path, tmp_path: Path) -> None:
    """ENGINES_PER_GPU=3: exit 2 before compose runs, naming the values it takes."""
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, GPU_PROFILE="h200-141gb", ENGINES_PER_GPU="3")
    assert result.returncode == 2
    assert "ENGINES_PER_GPU must be 1 or 2" in result.stderr
    assert not record.exists()
