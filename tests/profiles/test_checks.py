"""`ocrvl profile check`: vLLM's own parser, the stored flag set, the card and the memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.profiles import flagsets
from app.profiles.checks import Checker
from app.profiles.images import Target, load_targets
from app.profiles.parsers import ServeParser
from tests.profiles.conftest import PROFILE_FILES

WriteProfile = Callable[[str, str], Path]

GOOD_A10 = """\
gpu-memory-utilization: 0.65
max-model-len: 8192
max-num-seqs: 256
max-num-batched-tokens: 16384
dtype: bfloat16
limit-mm-per-prompt: '{"image": 1}'
trust-request-mm-kwargs: true
no-enable-prefix-caching: true
mm-processor-cache-gb: 0
"""

GOOD_V100 = """\
gpu-memory-utilization: 0.7
max-model-len: 8192
max-num-seqs: 256
max-num-batched-tokens: 16384
dtype: float16
attention-backend: TRITON_ATTN
mm-encoder-attn-backend: TORCH_SDPA
limit-mm-per-prompt: '{"image": 1}'
no-enable-prefix-caching: true
mm-processor-cache-gb: 0
"""


def test_profile_files_cover_every_target() -> None:
    """The eleven profiles exist and each has a service in compose/gpu-profiles.yml."""
    names = {path.stem for path in PROFILE_FILES}
    assert names == set(load_targets())
    assert len(names) == 11


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda path: path.stem)
def test_every_profile_passes_the_check(path: Path, checker: Checker) -> None:
    """No errors: flags, types, dtype, attention backends and memory all hold."""
    errors = [str(finding) for finding in checker.check(path) if finding.error]
    assert errors == []


@pytest.mark.parametrize("path", PROFILE_FILES, ids=lambda path: path.stem)
def test_every_profile_parses_with_its_vllms_parser(path: Path, serve_parser: ServeParser) -> None:
    """0.32 profiles go through `vllm serve MODEL --config FILE`; 0.19.1 through its flag set."""
    target = load_targets()[path.stem]
    config = yaml.safe_load(path.read_text())
    if target.vllm_version == serve_parser.version:
        namespace = serve_parser.parse_config_file(path)
        assert namespace.max_num_seqs == config["max-num-seqs"]
        assert namespace.enable_prefix_caching is False
        assert namespace.trust_request_mm_kwargs is True
        assert serve_parser.parse_paddlex(config).limit_mm_per_prompt == {"image": 1}
    else:
        stored = flagsets.load(target.vllm_version)["flags"]
        assert flagsets.problems(config, stored, target.vllm_version) == []


@pytest.mark.parametrize(
    ("name", "base", "line", "key", "words"),
    [
        ("a10-24gb", GOOD_A10, "max-num-seqz: 8", "max-num-seqz", "not a `vllm serve` flag"),
        ("a10-24gb", GOOD_A10, "block-size: sixteen", "block-size", "not a valid int"),
        ("a10-24gb", GOOD_A10, "enforce-eager: false", "enforce-eager", "no-enforce-eager: true"),
        ("a10-24gb", GOOD_A10, "enforce-eager: 1", "enforce-eager", "is a switch"),
        ("a10-24gb", GOOD_A10, "api-server-count: true", "api-server-count", "takes a value"),
        ("a10-24gb", GOOD_A10, "kv-transfer-config: {a: 1}", "kv-transfer-config", "Python repr"),
        ("a10-24gb", GOOD_A10, "port: 8000", "port", "passed by compose"),
        ("a10-24gb", GOOD_A10, "max_num_seqs: 8", "max_num_seqs", "dashed keys"),
        ("a10-24gb", GOOD_A10, "attention-backend: XFORMERS", "attention-backend", "backend"),
        (
            "v100-32gb",
            GOOD_V100,
            "trust-request-mm-kwargs: true",
            "trust-request-mm-kwargs",
            "vLLM 0.19.1",
        ),
        ("v100-32gb", GOOD_V100, "max-num-batched-tokens: 16k2", "max-num-batched-tokens", "valid"),
    ],
)
def test_a_broken_flag_is_rejected_naming_file_and_key(
    name: str,
    base: str,
    line: str,
    key: str,
    words: str,
    checker: Checker,
    profile_file: WriteProfile,
) -> None:
    """One bad line among good ones: the finding names the file and that key."""
    flag = line.split(":", maxsplit=1)[0]
    lines = [kept for kept in base.splitlines() if not kept.startswith(flag + ":")]
    path = profile_file(name, "\n".join([*lines, line]) + "\n")
    errors = [finding for finding in checker.check(path) if finding.error]
    assert [finding.key for finding in errors] == [key]
    assert str(errors[0]).startswith(f"{path}: {key}: error: ")
    assert words in errors[0].message


@pytest.mark.parametrize(
    ("name", "base", "old", "new", "key"),
    [
        ("v100-32gb", GOOD_V100, "dtype: float16", "dtype: bfloat16", "dtype"),
        ("v100-32gb", GOOD_V100, "attention-backend: TRITON_ATTN", "", "attention-backend"),
        (
            "v100-32gb",
            GOOD_V100,
            "mm-encoder-attn-backend: TORCH_SDPA",
            "mm-encoder-attn-backend: TRITON_ATTN",
            "mm-encoder-attn-backend",
        ),
        ("a10-24gb", GOOD_A10, "trust-request-mm-kwargs: true", "", "trust-request-mm-kwargs"),
        ("a10-24gb", GOOD_A10, "mm-processor-cache-gb: 0", "", "mm-processor-cache-gb"),
        (
            "a10-24gb",
            GOOD_A10,
            "limit-mm-per-prompt: '{\"image\": 1}'",
            "limit-mm-per-prompt: '{\"image\": 4}'",
            "limit-mm-per-prompt",
        ),
    ],
)
def test_card_and_recipe_rules(
    name: str,
    base: str,
    old: str,
    new: str,
    key: str,
    checker: Checker,
    profile_file: WriteProfile,
) -> None:
    """No bf16 or FlashAttention below 8.0; the recipe's switches are required."""
    path = profile_file(name, base.replace(old, new))
    assert [finding.key for finding in checker.check(path) if finding.error] == [key]


def test_a_v100_profile_on_a_current_image_is_rejected(
    checker: Checker, profile_file: WriteProfile
) -> None:
    """vLLM >= 0.20 has no sm_70 kernels: the target image, not a key, is wrong."""
    targets = {**checker.targets}
    targets["v100-32gb"] = Target("v100-32gb", "vllm/vllm-openai:v0.32.0", "0.32.0", {})
    patched = Checker(checker.shape, targets, parser_factory=lambda: checker.parser)
    path = profile_file("v100-32gb", GOOD_V100 + "trust-request-mm-kwargs: true\n")
    messages = [finding.message for finding in patched.check(path) if finding.error]
    assert any("no sm_70 kernels" in message for message in messages)


def test_memory_that_does_not_fit_fails(checker: Checker, profile_file: WriteProfile) -> None:
    """A utilization too low for weights and activations: negative KV memory, an error."""
    path = profile_file("rtx3060-12gb", GOOD_A10.replace("0.65", "0.2"))
    errors = [finding for finding in checker.check(path) if finding.error]
    assert len(errors) == 1
    assert errors[0].key is None
    assert "negative KV memory" in errors[0].message


def test_a_budget_without_room_for_the_layout_service_fails(
    checker: Checker, profile_file: WriteProfile
) -> None:
    """0.95 of an A10 (the profile before the layout service shared its GPU) leaves 0.59 GiB
    beside vLLM's context, less than the layout service's 5.30 GiB (batch 4): an error naming
    both."""
    path = profile_file("a10-24gb", GOOD_A10.replace("0.65", "0.95"))
    errors = [finding for finding in checker.check(path) if finding.error]
    assert [finding.key for finding in errors] == [None]
    assert errors[0].message.startswith("no room for the layout service")
    assert "needs 5.30 GiB" in errors[0].message


def test_vllms_parser_catches_what_the_flag_set_cannot(
    checker: Checker, profile_file: WriteProfile
) -> None:
    """A value vLLM's own validation refuses is reported with vLLM's words, against its key."""
    path = profile_file("a10-24gb", GOOD_A10 + "sse-keep-alive-interval: -1\n")
    errors = [finding for finding in checker.check(path) if finding.error]
    assert [finding.key for finding in errors] == ["sse-keep-alive-interval"]
    assert "vllm serve --config" in errors[0].message
    assert "sse-keep-alive-interval" in errors[0].message


def test_check_command_exits_non_zero_and_names_the_key(
    profile_file: WriteProfile, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ocrvl profile check FILE` with one unknown flag: status 1, the file and key on stderr."""
    path = profile_file("v100-32gb", GOOD_V100 + "no-such-flag: 3\n")
    assert main(["profile", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert f"{path}: no-such-flag: error:" in captured.err
    assert f"{path}: FAILED" in captured.out


def test_stored_flag_set_reflects_vllm_0_19_1() -> None:
    """The committed flag set: what 0.19.1 has and lacks for these profiles."""
    flags = flagsets.load("0.19.1")["flags"]
    assert "trust-request-mm-kwargs" not in flags
    assert flags["no-enable-prefix-caching"]["kind"] == "switch"
    assert flags["max-num-seqs"]["type"] == "int"
    assert {"TRITON_ATTN", "TORCH_SDPA"} <= set(flags["attention-backend"]["values"])
    assert "XFORMERS" not in flags["mm-encoder-attn-backend"]["values"]


def test_live_flag_set_is_the_installed_vllms(serve_parser: ServeParser) -> None:
    """The flag set read off the installed parser knows 0.32's flags and its backend names."""
    assert serve_parser.flags["trust-request-mm-kwargs"]["kind"] == "switch"
    assert "TORCH_SDPA" in serve_parser.flags["mm-encoder-attn-backend"]["values"]
