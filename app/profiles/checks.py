"""`ocrvl profile check`: a profile is valid for its vLLM, its card and its memory.

Each finding names the file and the key. Errors fail the check; warnings do not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from app.profiles import flagsets
from app.profiles.gpus import CPU_PROFILE, Card, card_for_profile
from app.profiles.images import Target, version_tuple
from app.profiles.memory import EngineLimits, plan
from app.profiles.parsers import ParserRefusal, ServeParser, installed_version, options_in
from app.profiles.shapes import ModelShape

FORBIDDEN = ("host", "port", "api-key", "served-model-name", "model")
"""Compose passes these on the command line; a profile must not pin them."""
REQUIRED = (
    "max-model-len",
    "max-num-seqs",
    "max-num-batched-tokens",
    "dtype",
    "mm-processor-cache-gb",
)
SWITCHES_ON = ("no-enable-prefix-caching", "trust-request-mm-kwargs")
"""As vLLM's PaddleOCR-VL recipe; PaddleOCR's client always sends mm_processor_kwargs."""
PRE_AMPERE_TEXT_BACKENDS = ("TRITON_ATTN", "FLEX_ATTENTION")
PRE_AMPERE_VISION_BACKEND = "TORCH_SDPA"
FIRST_WITHOUT_SM70 = (0, 20)


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or risky) in one profile file."""

    path: Path
    key: str | None
    message: str
    error: bool = True

    def __str__(self) -> str:
        where = f"{self.path}: {self.key}" if self.key else str(self.path)
        return f"{where}: {'error' if self.error else 'warning'}: {self.message}"


def _structure(config: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, str]:
    """Rules both `vllm serve --config` and PaddleX need; vLLM alone would not catch them."""
    found: dict[str, str] = {}
    for key, value in config.items():
        negation = f"no-{key}"
        if "_" in key:
            found[key] = f"use dashed keys: `{key.replace('_', '-')}`"
        elif value is False:
            fix = f"write `{negation}: true`" if negation in flags else "leave the key out"
            found[key] = f"`{key}: false`: PaddleX turns every boolean into a bare `--{key}`; {fix}"
        elif isinstance(value, dict | list):
            found[key] = "PaddleX passes str(value), a Python repr: quote the JSON as a string"
        elif value is None:
            found[key] = "empty value"
        elif key in FORBIDDEN:
            found[key] = f"`{key}` is passed by compose on the command line; remove it"
    return found


def _required(
    config: Mapping[str, Any], flags: Mapping[str, Any], card: Card | None
) -> dict[str, str]:
    found: dict[str, str] = {}
    needed = REQUIRED + (("gpu-memory-utilization",) if card else ())
    for key in needed:
        if key not in config:
            found[key] = "missing: every profile sets it explicitly"
    for key in SWITCHES_ON:
        if key in flags and config.get(key) is not True:
            found[key] = f"missing `{key}: true`"
    try:
        limit = json.loads(str(config.get("limit-mm-per-prompt")))
    except json.JSONDecodeError:
        limit = None
    if not isinstance(limit, dict) or limit.get("image") != 1:
        found["limit-mm-per-prompt"] = (
            "must be the JSON string '{\"image\": 1}': one page per request"
        )
    return found


def _card_rules(config: Mapping[str, Any], card: Card, target: Target) -> dict[str, str]:
    found: dict[str, str] = {}
    dtype = str(config.get("dtype", "auto"))
    if not card.has_bf16 and dtype not in ("float16", "half", "float32", "float"):
        found["dtype"] = (
            f"{card.name} (compute capability {card.compute_capability}) has no bfloat16: "
            f"set `dtype: float16` (got {dtype})"
        )
    if not card.has_flash_attention:
        text = str(config.get("attention-backend", "")).upper()
        if text not in PRE_AMPERE_TEXT_BACKENDS:
            found["attention-backend"] = (
                f"FlashAttention needs compute capability 8.0: set one of "
                f"{', '.join(PRE_AMPERE_TEXT_BACKENDS)} (got {text or 'none'})"
            )
        vision = str(config.get("mm-encoder-attn-backend", "")).upper()
        if vision != PRE_AMPERE_VISION_BACKEND:
            found["mm-encoder-attn-backend"] = (
                f"set {PRE_AMPERE_VISION_BACKEND}: no FlashAttention below 8.0 and Triton's "
                f"encoder attention hangs on sm_70 (vllm#36357); got {vision or 'none'}"
            )
    if card.compute_capability < 7.5 and version_tuple(target.vllm_version) >= FIRST_WITHOUT_SM70:
        found["(image)"] = (
            f"vLLM {target.vllm_version} images have no sm_70 kernels; pin a 0.19.x image"
        )
    return found


def _memory(
    config: Mapping[str, Any], card: Card | None, shape: ModelShape
) -> list[tuple[str, bool]]:
    try:
        limits = EngineLimits.from_flags(config, "cuda" if card else "cpu")
    except ValueError:
        return []  # a number vLLM cannot read either: already reported against its key
    if card is None and limits.kv_cache_memory_bytes is None:
        return [("no kv-cache-memory-bytes: vLLM's CPU backend sizes the KV cache itself", False)]
    result = plan(shape, limits, card.memory_bytes if card else None)
    return [(e, True) for e in result.errors] + [(w, False) for w in result.warnings]


class Checker:
    """Checks profile files; builds vLLM's parser once, on first need."""

    def __init__(
        self,
        shape: ModelShape,
        targets: Mapping[str, Target],
        parser_factory: Callable[[], ServeParser] = ServeParser,
    ) -> None:
        self.shape = shape
        self.targets = targets
        self._factory = parser_factory
        self._parser: ServeParser | None = None

    @property
    def parser(self) -> ServeParser:
        """The installed vLLM's `vllm serve` parser."""
        if self._parser is None:
            self._parser = self._factory()
        return self._parser

    def check(
        self, path: Path, profile: str | None = None, vllm_version: str | None = None
    ) -> list[Finding]:
        """Every finding for one file; `profile` overrides the name taken from the file name,
        `vllm_version` the version compose/gpu-profiles.yml gives it."""
        try:
            config = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            return [Finding(path, None, f"cannot read: {exc}")]
        if not isinstance(config, dict) or not config:
            return [Finding(path, None, "not a flat mapping of `vllm serve` flags")]
        name = profile or path.stem
        target = self.targets.get(name)
        if target is None:
            return [Finding(path, None, f"no service {name!r} in compose/gpu-profiles.yml")]
        if vllm_version:
            target = replace(target, vllm_version=vllm_version)
        card = card_for_profile(name)
        if card is None and name != CPU_PROFILE:
            return [
                Finding(path, None, f"{name!r} is not in the GPU catalogue (app/profiles/gpus.py)")
            ]
        try:
            flags, findings = self._flags(path, config, target)
        except (ImportError, FileNotFoundError) as exc:
            return [Finding(path, None, f"no flag set for vLLM {target.vllm_version}: {exc}")]
        messages = _structure(config, flags)
        for key, message in _required(config, flags, card).items():
            messages.setdefault(key, message)
        if card is not None:
            for key, message in _card_rules(config, card, target).items():
                messages.setdefault(key, message)
        findings = [f for f in findings if f.key not in messages]
        findings += [Finding(path, key, message) for key, message in messages.items()]
        findings += [
            Finding(path, None, m, error) for m, error in _memory(config, card, self.shape)
        ]
        return findings

    def _flags(
        self, path: Path, config: Mapping[str, Any], target: Target
    ) -> tuple[Mapping[str, Any], list[Finding]]:
        """The target vLLM's flag set and what it refuses: live parser or stored flag set."""
        live = target.vllm_version == installed_version()
        flags = self.parser.flags if live else flagsets.load(target.vllm_version)["flags"]
        clean = {k: v for k, v in config.items() if k not in _structure(config, flags)}
        found: dict[str | None, str] = dict(flagsets.problems(clean, flags, target.vllm_version))
        if live and not found:
            for route in ("vllm serve --config", "PaddleX --backend_config"):
                try:
                    if route.startswith("vllm"):
                        self.parser.parse_config_file(path)
                    else:
                        self.parser.parse_paddlex(clean)
                except ParserRefusal as refusal:
                    key = next((k for k in options_in(str(refusal)) if k in config), None)
                    found.setdefault(key, f"{route}: vLLM {target.vllm_version} says: {refusal}")
        return flags, [Finding(path, key, m) for key, m in found.items()]
