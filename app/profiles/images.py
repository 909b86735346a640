"""Which vLLM runs each profile: compose/gpu-profiles.yml, read the way compose reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from app.profiles import COMPOSE_FILE, ROOT

VERSION_LABEL = "ocrvl.vllm-version"


class TargetError(ValueError):
    """compose/gpu-profiles.yml is missing or malformed."""


@dataclass(frozen=True)
class Target:
    """The image and vLLM version a profile runs on, and the extra environment it needs;
    `vllm_image` is the vLLM image the engine image is built over (its VLLM_IMAGE build arg)."""

    profile: str
    image: str
    vllm_version: str
    environment: dict[str, str]
    vllm_image: str = ""


def load_targets(path: Path | None = None) -> dict[str, Target]:
    """Every service of the compose file, keyed by profile name."""
    path = path or ROOT / COMPOSE_FILE
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"cannot read {path}: {exc}") from exc
    services = (document or {}).get("services")
    if not isinstance(services, dict):
        raise TargetError(f"{path}: no `services:` mapping")
    targets: dict[str, Target] = {}
    for name, service in services.items():
        labels = (service or {}).get("labels") or {}
        version = labels.get(VERSION_LABEL)
        image = (service or {}).get("image")
        if not isinstance(image, str) or not isinstance(version, str):
            raise TargetError(f"{path}: service {name!r} needs `image:` and label {VERSION_LABEL}")
        environment = {
            str(k): str(v) for k, v in ((service or {}).get("environment") or {}).items()
        }
        build = (service or {}).get("build") or {}
        base = (
            str((build.get("args") or {}).get("VLLM_IMAGE", "")) if isinstance(build, dict) else ""
        )
        base = re.sub(r"^\$\{\w+:-(.*)\}$", r"\1", base)  # ${VLLM_CPU_IMAGE:-image}: its default
        targets[str(name)] = Target(str(name), image, version, environment, base)
    return targets


def version_tuple(version: str) -> tuple[int, ...]:
    """`0.19.1` -> (0, 19, 1), for comparisons."""
    return tuple(
        int(part) for part in version.split("+", maxsplit=1)[0].split(".") if part.isdigit()
    )
