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


def test_an_h200_gets_its_two_engines_and_one_word_gives_one(
    stand_ins: Path, tmp_path: Path
) -> None:
    """A detected H200 (its header: 2 engines per GPU, measured): compose starts as is, its
    include giving two engines under MPS, and up.sh says so; ENGINES_PER_GPU=1 in .env is
    passed on to compose and named as the reason."""
    (stand_ins / "ocrvl").write_text(
        '#!/bin/sh\necho "$*" >> "$RECORD"\necho vllm_configs/h200-141gb.yaml\n'
    )
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, GPU_PROFILE="auto")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines()[-1] == "GPU_PROFILE=h200-141gb docker compose up -d"
    assert (
        "GPU_PROFILE=h200-141gb: 2 engines under MPS per GPU on 1 GPU (the profile's default, "
        "measured; compose/layouts/gpus-1-engines-2.yml)"
    ) in result.stderr
    result = run_up(stand_ins, record, GPU_PROFILE="h200-141gb", ENGINES_PER_GPU="1")
    assert result.returncode == 0, result.stderr
    assert "1 engine per GPU on 1 GPU (ENGINES_PER_GPU; compose/layouts/gpus-1-engines-1.yml)" in (
        result.stderr
    )


def test_a_modelled_class_runs_one_engine(stand_ins: Path, tmp_path: Path) -> None:
    """An L4 or an H100 (not measured): one engine, no MPS, by the profile's default."""
    for profile in ("l4-24gb", "h100-80gb"):
        result = run_up(stand_ins, tmp_path / "calls", GPU_PROFILE=profile)
        assert result.returncode == 0, result.stderr
        assert f"GPU_PROFILE={profile}: 1 engine per GPU on 1 GPU (the profile's default" in (
            result.stderr
        )
        assert "MPS" not in result.stderr


def test_own_files_and_options_are_passed_on(stand_ins: Path, tmp_path: Path) -> None:
    """-f files and other options reach `docker compose` as given, before `up -d`."""
    record = tmp_path / "calls"
    files = ["-f", "docker-compose.yml", "-f", "compose/monitoring.yml"]
    result = run_up(stand_ins, record, *files, GPU_PROFILE="h200-141gb")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == [
        f"GPU_PROFILE=h200-141gb docker compose {' '.join(files)} up -d"
    ]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ENGINES_PER_GPU": "3"}, "ENGINES_PER_GPU must be 1 or 2"),
        ({"GPUS": "0"}, "GPUS must be 1 or more"),
        ({"GPUS": "4"}, "python3 scripts/compose_gpus.py 4 --engines-per-gpu 2"),
        ({"GPU_PROFILE": "b200-192gb"}, "no vllm_configs/b200-192gb.yaml"),
    ],
)
def test_what_compose_cannot_run_is_refused_before_it_runs(
    env: dict[str, str], message: str, stand_ins: Path, tmp_path: Path
) -> None:
    """Exit 2 before compose runs, saying what to change (or which layout to write)."""
    record = tmp_path / "calls"
    result = run_up(stand_ins, record, **{"GPU_PROFILE": "h200-141gb", **env})
    assert result.returncode == 2
    assert message in result.stderr
    assert not record.exists()
