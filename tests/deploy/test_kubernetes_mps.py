"""Engines per GPU in Kubernetes: the H200 pool runs its class's two engines per GPU under the
device plugin's MPS sharing by default (overlays/mps), pools/h200-141gb/one-engine one.

Rendered by kustomize and validated strictly with the other overlays (test_kubernetes.py); here,
what makes the pool MPS. No cluster: whether the plugin shares the GPU as configured and the
pods serve as measured is the GPU run's to show.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from app.profiles.engines import MPS_ENGINES, plan_for_card
from app.profiles.gpus import card_for_profile
from app.profiles.shapes import load_shape
from tests.deploy.kubernetes import (
    KUBERNETES,
    Manifest,
    container,
    kubectl,
    named,
    pod_spec,
    render,
)

POOL = "vllm-h200-141gb"


@pytest.fixture(scope="module")
def objects() -> list[Manifest]:
    """overlays/mps as kustomize builds it."""
    return render("mps")


def test_device_plugin_config_shares_each_gpu_between_two_mps_clients(
    objects: list[Manifest],
) -> None:
    """The plugin's config in its own shape (`version: v1`, `sharing.mps.resources` with
    `nvidia.com/gpu` and 2 replicas) under the key a node selects with its
    nvidia.com/device-plugin.config label; `default` shares nothing; a stable name for Helm."""
    config = named(objects, "ConfigMap", "nvidia-device-plugin-configs")
    assert config["metadata"]["name"] == "nvidia-device-plugin-configs"  # no hash suffix
    assert config["metadata"]["namespace"] == "nvidia-device-plugin"
    assert set(config["data"]) == {"default", f"mps-{MPS_ENGINES}"}
    assert yaml.safe_load(config["data"][f"mps-{MPS_ENGINES}"]) == {
        "version": "v1",
        "flags": {"migStrategy": "none"},
        "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": MPS_ENGINES}]}},
    }
    default = yaml.safe_load(config["data"]["default"])
    assert default["version"] == "v1"
    assert "sharing" not in default


def test_vllm_pods_run_the_two_engine_plan_after_the_profile(objects: list[Manifest]) -> None:
    """The pool's args, then the memory model's share, max-num-seqs and fixed KV cache for two
    engines on an H200 (`ocrvl profile plan --profile h200-141gb --engines-per-gpu 2`)."""
    card = card_for_profile("h200-141gb")
    assert card is not None
    assert card.engines_per_gpu == MPS_ENGINES
    flags = plan_for_card(card, load_shape(), MPS_ENGINES).flags
    args = container(named(objects, "Deployment", POOL))["args"]
    assert args[:4] == ["serve", "PaddlePaddle/PaddleOCR-VL-1.5", "--config",
                        "/vllm_configs/h200-141gb.yaml"]  # fmt: skip
    planned = [part for key, value in flags.items() for part in (f"--{key}", str(value))]
    assert args[-len(planned) :] == planned


def test_each_pod_holds_one_mps_replica_on_a_shared_node(objects: list[Manifest]) -> None:
    """One `nvidia.com/gpu` (half a GPU under mps-2), two pods per GPU, and nodes that GPU
    Feature Discovery labels as MPS-shared with 2 replicas and an H200 -SHARED product."""
    deployment = named(objects, "Deployment", POOL)
    engine = container(deployment)
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert deployment["spec"]["replicas"] == MPS_ENGINES
    terms = pod_spec(deployment)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    for term in terms:  # every term (they are ORed) demands a shared node
        required = {e["key"]: e["values"] for e in term["matchExpressions"]}
        assert required["nvidia.com/gpu.sharing-strategy"] == ["mps"]
        assert required["nvidia.com/gpu.replicas"] == [str(MPS_ENGINES)]
        assert all(value.endswith("-SHARED") for value in required["nvidia.com/gpu.product"])


def pool(path: str) -> list[Manifest]:
    """A pool folder as kustomize builds it on its own."""
    built = subprocess.run(
        [str(kubectl()), "kustomize", str(KUBERNETES / "pools" / path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(built.stdout) if d]


def test_each_pod_asks_for_half_the_one_engine_pools_host(objects: list[Manifest]) -> None:
    """Two pods share one GPU's host: each requests half the CPU and memory of one-engine/."""
    single = named(pool("h200-141gb/one-engine"), "Deployment", POOL)
    whole = container(single)["resources"]["requests"]
    half = container(named(objects, "Deployment", POOL))["resources"]["requests"]
    assert int(half["cpu"]) * MPS_ENGINES == int(whole["cpu"])
    assert int(half["memory"].removesuffix("Gi")) * MPS_ENGINES == int(
        whole["memory"].removesuffix("Gi")
    )


@pytest.mark.parametrize("path", ["a100-80gb", "h200-141gb", "l4-24gb"])
def test_each_gpu_pool_runs_its_classes_engines_per_gpu_by_default(path: str) -> None:
    """A pool is what its profile's header says the class runs: the H200's (2, measured) on
    MPS-shared nodes with the two-engine plan, two pods per GPU; every other one engine per
    unshared GPU with the profile alone."""
    card = card_for_profile(path)
    assert card is not None
    deployment = named(pool(path), "Deployment", f"vllm-{path}")
    args = container(deployment)["args"]
    terms = pod_spec(deployment)["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    products = [v for t in terms for e in t["matchExpressions"] for v in e["values"]
                if e["key"] == "nvidia.com/gpu.product"]  # fmt: skip
    if card.engines_per_gpu == MPS_ENGINES:
        assert path == "h200-141gb"
        assert "--kv-cache-memory-bytes" in args
        assert all(product.endswith("-SHARED") for product in products)
        assert deployment["spec"]["replicas"] == MPS_ENGINES
    else:
        assert "--gpu-memory-utilization" not in args
        assert not any(product.endswith("-SHARED") for product in products)


def test_one_word_gives_the_h200_one_engine_per_gpu() -> None:
    """pools/h200-141gb/one-engine: the same pool name and Service, the profile as it is, one
    pod per unshared H200."""
    objects = pool("h200-141gb/one-engine")
    deployment = named(objects, "Deployment", POOL)
    assert container(deployment)["args"][-2:] == ["--served-model-name", "PaddleOCR-VL-1.5-0.9B"]
    assert deployment["spec"]["replicas"] == 1
    assert named(objects, "Service", POOL)["spec"]["clusterIP"] == "None"
