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
