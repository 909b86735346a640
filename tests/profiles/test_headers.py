"""A profile says what it is in at most 15 comment lines: the header `ocrvl profile plan
--profile NAME --header` writes (its GPU, its vLLM, how to run it, where its numbers come from),
nothing of the lab's history."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from app.cli import main
from app.profiles import PROFILES_DIR, ROOT
from app.profiles.gpus import card_for_profile
from app.profiles.headers import HEADER_MAX_LINES, gpu_header
from app.profiles.images import load_targets
from app.profiles.shapes import load_shape

PROFILES = sorted(path.stem for path in (ROOT / PROFILES_DIR).glob("*.yaml"))
# what a header must not carry: a pass's figures or a result file (bench/results/README.md's)
HISTORY = re.compile(
    r"bench/results|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|"
    r"eleventh|twelfth|thirteenth|served|floor) pass\b|\bpass \d+",
    re.IGNORECASE,
)


def file_header(profile: str) -> str:
    """The comment lines the file opens with, up to its first blank line."""
    text = (ROOT / PROFILES_DIR / f"{profile}.yaml").read_text()
    return text.partition("\n\n")[0] + "\n"


def planned_header(profile: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["profile", "plan", "--profile", profile, "--header"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("profile", PROFILES)
def test_the_file_opens_with_the_header_plan_writes(
    profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vllm_configs/NAME.yaml opens with exactly `plan --profile NAME --header`'s lines, then a
    blank line and the flags: a header edited by hand, or a catalogue or compose change the file
    was not rewritten for, fails here."""
    assert file_header(profile) == planned_header(profile, capsys)


@pytest.mark.parametrize("profile", PROFILES)
def test_a_header_is_at_most_15_comment_lines_and_no_history(profile: str) -> None:
    """At most 15 lines, each a comment of at most 99 characters; no pass or result file named:
    the lab's history is bench/results/README.md's."""
    lines = file_header(profile).splitlines()
    assert len(lines) <= HEADER_MAX_LINES == 15
    assert all(line.startswith("#") and len(line) <= 99 for line in lines)
    assert HISTORY.search(file_header(profile)) is None


@pytest.mark.parametrize("profile", PROFILES)
def test_a_header_names_its_gpu_vllm_command_and_source(profile: str) -> None:
    """The GPU class (its nvidia-smi name, memory and compute capability), the vLLM version and
    image compose runs it on, the command that runs the file, and one link for its numbers."""
    header = " ".join(line.lstrip("# ") for line in file_header(profile).splitlines())
    target = load_targets()[profile]
    card = card_for_profile(profile)
    if card is not None:
        assert f"vLLM profile for {card.name}: {card.memory_mib:,} MiB" in header
        assert f"compute capability {card.compute_capability}" in header
        assert f"GPU_PROFILE={profile} docker compose up" in header
        assert f"make serve PROFILE={profile}" in header
        assert re.search(r"^# Engines per GPU: \d, (measured|modelled)", file_header(profile), re.M)
        assert re.search(r"^# Layout service: --max-batch \d", file_header(profile), re.M)
    else:
        assert "vLLM profile for the CPU backend" in header
    assert f"Target: vLLM {target.vllm_version}, {target.vllm_image} " in header
    assert "vllm serve " in header
    assert f"--config vllm_configs/{profile}.yaml" in header
    assert header.count("docs/gpu-profiles.md") == 1
    assert (ROOT / "docs" / "gpu-profiles.md").is_file()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--gpu-mem-gib", "24", "--header"], "--header needs --profile"),
        (["--profile", "b200-192gb", "--header"], "unknown profile 'b200-192gb'"),
    ],
)
def test_plan_header_refuses_a_card_with_no_profile(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header is a catalogue profile's: a bare memory size or an unknown name is exit 2."""
    assert main(["profile", "plan", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_the_header_follows_the_catalogue_and_compose() -> None:
    """A header is written from the catalogue's card and compose's target, not kept as text: a
    card with other memory and engines, on another vLLM, gets a header that says so, which the
    file's no longer equals."""
    card = card_for_profile("a10-24gb")
    assert card is not None
    target = load_targets()["a10-24gb"]
    header = gpu_header(
        replace(card, memory_mib=24000, engines_per_gpu=2, engines_measured=True, grounds="so"),
        replace(target, vllm_version="0.40.0", vllm_image="vllm/vllm-openai:v0.40.0"),
        load_shape(),
    )
    assert "24,000 MiB" in header
    assert "# Engines per GPU: 2, measured: so.\n" in header
    assert "# Target: vLLM 0.40.0, vllm/vllm-openai:v0.40.0 under the engine image" in header
    assert header != file_header("a10-24gb")
