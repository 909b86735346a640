"""Stored flag sets: `ocrvl profile check` without an installed vLLM, and against vLLM 0.23."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.profiles import checks
from app.profiles.checks import Checker
from app.profiles.flagsets import FLAGSET_DIR
from app.profiles.images import load_targets
from app.profiles.parsers import ServeParser
from app.profiles.shapes import load_shape
from tests.profiles.conftest import PROFILE_FILES


def _no_vllm() -> ServeParser:
    raise AssertionError("the check imported vLLM although a stored flag set was there")


@pytest.fixture
def without_vllm(monkeypatch: pytest.MonkeyPatch) -> Checker:
    """A Checker in a venv without vLLM (the gateway image, a laptop): stored flag sets only."""
    monkeypatch.setattr(checks, "installed_version", lambda: "none")
    return Checker(load_shape(), load_targets(), parser_factory=_no_vllm)


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda p: p.stem)
def test_every_profile_passes_without_an_installed_vllm(path: Path, without_vllm: Checker) -> None:
    """Each shipped profile checks clean against its stored flag set (0.19.1 or 0.32.0)."""
    errors = [f for f in without_vllm.check(path) if f.error]
    assert errors == []


def test_the_h200_profile_on_vllm_0_23_lacks_only_trust_request_mm_kwargs(
    without_vllm: Checker,
) -> None:
    """0.23 (the H200 host's torch pins it) refuses one key of h200-141gb.yaml, nothing else."""
    path = next(p for p in PROFILE_FILES if p.stem == "h200-141gb")
    errors = [f for f in without_vllm.check(path, vllm_version="0.23.0") if f.error]
    assert [(f.key, f.message) for f in errors] == [
        (
            "trust-request-mm-kwargs",
            "`trust-request-mm-kwargs` is not a `vllm serve` flag of vLLM 0.23.0",
        )
    ]


@pytest.mark.parametrize("version", ["0.23.0", "0.32.0"])
def test_stored_flag_sets_name_their_version_and_source(version: str) -> None:
    """Each file says which vLLM it came from and holds the flags the profiles use."""
    stored = json.loads((FLAGSET_DIR / f"vllm-{version}.json").read_text())
    assert stored["vllm_version"] == version
    assert version in stored["source"]
    for flag in ("max-num-seqs", "gpu-memory-utilization", "api-server-count", "max-model-len"):
        assert flag in stored["flags"]
