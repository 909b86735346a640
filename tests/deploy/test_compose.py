"""The compose files, resolved and validated by Docker Compose v2 itself (no engine needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.compose import (
    BASE,
    GPU_PROFILES,
    REQUIRED,
    ROOT,
    env_example,
    filled_env_example,
    profiles,
    resolved,
    run_config,
    variables,
)

# Every supported way of running the stack: the files given with -f, and extra variables.
LAYOUTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "base": ([BASE], {}),
    "gpus-2": ([BASE, "compose/gpus-2.yml"], {}),
    "cpu": ([BASE, "compose/cpu.yml"], {"GPU_PROFILE": "cpu"}),
    "paddleocr": ([BASE, "compose/paddleocr.yml"], {}),
    "monitoring": ([BASE, "compose/monitoring.yml"], {}),
    "gpus-2+monitoring": ([BASE, "compose/gpus-2.yml", "compose/monitoring.yml"], {}),
    "mps": ([BASE, "compose/mps.yml"], {"GPU_PROFILE": "h200-141gb"}),
    "mps+monitoring": (
        [BASE, "compose/mps.yml", "compose/monitoring.yml"],
        {"GPU_PROFILE": "h200-141gb"},
    ),
}
COMPOSE_FILES = [ROOT / BASE, *sorted((ROOT / "compose").glob("*.yml"))]


def layout(name: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    files, extra = LAYOUTS[name]
    return resolved(files, tmp_path, **{**extra, **env})


def vllm_services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in model["services"].items() if name.startswith("vllm")}


def profile_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(GPU_PROFILES.read_text())["services"]
    return services


@pytest.mark.parametrize("name", LAYOUTS)
def test_every_service_has_a_healthcheck_restart_policy_and_rotated_logs(
    name: str, tmp_path: Path
) -> None:
    """Each layout resolves; every service can report health, restarts, and caps its logs."""
    for service_name, service in layout(name, tmp_path)["services"].items():
        assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), service_name
        assert service["restart"] == "unless-stopped", service_name
        logging = service["logging"]
        assert logging["driver"] == "json-file", service_name
        assert {"max-size", "max-file"} <= set(logging["options"]), service_name


@pytest.mark.parametrize("name", LAYOUTS)
def test_only_nginx_is_published_beyond_the_host_loopback(name: str, tmp_path: Path) -> None:
    """vLLM and the gateway publish nothing; monitoring UIs bind 127.0.0.1; nginx is the door."""
    services = layout(name, tmp_path)["services"]
    published = {
        service_name: [port.get("host_ip", "0.0.0.0") for port in service.get("ports", [])]  # noqa: S104
        for service_name, service in services.items()
    }
    assert published.pop("nginx") == ["0.0.0.0"]  # noqa: S104
    for service_name, addresses in published.items():
        assert all(address == "127.0.0.1" for address in addresses), (service_name, addresses)
    nginx = services["nginx"]["ports"][0]
    assert (nginx["published"], nginx["target"]) == ("28118", 8080)


def test_base_chains_vllm_gateway_nginx_by_health(tmp_path: Path) -> None:
    """One vLLM on GPU 0 with the profile's image and file; each hop waits for the one behind."""
    model = layout("base", tmp_path)
    services = model["services"]
    assert set(services) == {"vllm", "gateway", "nginx"}
    vllm = services["vllm"]
    profile = REQUIRED["GPU_PROFILE"]
    assert vllm["image"] == profile_services()[profile]["image"]
    assert vllm["entrypoint"] == ["vllm"]
    command = vllm["command"]
    assert command[:2] == ["serve", "PaddlePaddle/PaddleOCR-VL-1.5"]
    assert command[command.index("--config") + 1] == f"/vllm_configs/{profile}.yaml"
    assert command[command.index("--served-model-name") + 1] == "PaddleOCR-VL-1.5-0.9B"
    assert vllm["environment"]["VLLM_API_KEY"] == REQUIRED["VLLM_API_KEY"]
    assert vllm["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}
    ]
    assert "ports" not in vllm
    assert vllm["healthcheck"]["start_period"] == "20m0s"
    assert {v["target"] for v in vllm["volumes"]} == {"/vllm_configs", "/root/.cache/huggingface"}
    gateway = services["gateway"]
    assert gateway["build"]["dockerfile"] == "Dockerfile"
    assert gateway["environment"]["OCRVL_BACKENDS"] == "http://vllm:8000"
    assert gateway["environment"]["OCRVL_BACKEND_API_KEY"] == REQUIRED["VLLM_API_KEY"]
    assert gateway["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert services["nginx"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    templates = services["nginx"]["volumes"][0]
    assert (templates["source"], templates["target"]) == (
        str(ROOT / "nginx" / "templates"),
        "/etc/nginx/templates",
    )


@pytest.mark.parametrize("profile", profiles())
def test_every_gpu_profile_resolves_to_its_image_and_config(profile: str, tmp_path: Path) -> None:
    """GPU_PROFILE picks the profile's image and environment and its vllm_configs/ file."""
    vllm = layout("base", tmp_path, GPU_PROFILE=profile)["services"]["vllm"]
    declared = profile_services()[profile]
    assert vllm["image"] == declared["image"]
    for name, value in (declared.get("environment") or {}).items():
        assert vllm["environment"][name] == str(value)
    config = vllm["command"][vllm["command"].index("--config") + 1]
    assert (ROOT / config.lstrip("/")).is_file()


def test_every_vllm_config_has_a_compose_profile() -> None:
    """Each vllm_configs/<profile>.yaml can be chosen with GPU_PROFILE."""
    configs = sorted(path.stem for path in (ROOT / "vllm_configs").glob("*.yaml"))
    assert configs == profiles()


def test_cpu_override_runs_the_cpu_image_without_a_gpu(tmp_path: Path) -> None:
    """No NVIDIA reservation; the CPU image, cpu.yaml, and the capabilities vLLM CPU asks for."""
    vllm = layout("cpu", tmp_path)["services"]["vllm"]
    assert "deploy" not in vllm
    assert vllm["image"] == profile_services()["cpu"]["image"]
    assert "/vllm_configs/cpu.yaml" in vllm["command"]
    assert vllm["cap_add"] == ["SYS_NICE"]


def test_paddleocr_override_runs_genai_server_with_the_same_profile(tmp_path: Path) -> None:
    """PaddleOCR's official image and `paddleocr genai_server … --backend_config <profile>`."""
    vllm = layout("paddleocr", tmp_path)["services"]["vllm"]
    assert "/paddleocr-genai-vllm-server:" in vllm["image"]
    assert vllm["entrypoint"] == ["paddleocr"]
    command = vllm["command"]
    assert command[0] == "genai_server"
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options == {
        "--model_name": "PaddleOCR-VL-1.5-0.9B",
        "--host": "0.0.0.0",  # noqa: S104
        "--port": "8000",
        "--backend": "vllm",
        "--backend_config": f"/vllm_configs/{REQUIRED['GPU_PROFILE']}.yaml",
    }
    assert vllm["environment"]["VLLM_API_KEY"] == REQUIRED["VLLM_API_KEY"]
    assert "deploy" in vllm


def test_monitoring_override_adds_prometheus_and_grafana(tmp_path: Path) -> None:
    """Prometheus reads compose/monitoring/prometheus.yml; Grafana gets its provisioning."""
    services = layout("monitoring", tmp_path)["services"]
    mounts = {
        name: {v["target"]: Path(v["source"]) for v in services[name]["volumes"] if "source" in v}
        for name in ("prometheus", "grafana")
    }
    assert mounts["prometheus"]["/etc/prometheus/prometheus.yml"].is_file()
    assert (mounts["grafana"]["/etc/grafana/provisioning"] / "datasources").is_dir()
    assert (mounts["grafana"]["/etc/grafana/dashboards"] / "ocrvl.json").is_file()
    environment = services["grafana"]["environment"]
    assert environment["GF_SECURITY_ADMIN_PASSWORD"] == REQUIRED["GRAFANA_ADMIN_PASSWORD"]


@pytest.mark.parametrize("name", LAYOUTS)
def test_gateway_and_nginx_are_locked_down_in_every_layout(name: str, tmp_path: Path) -> None:
    """Non-root, read-only root, no capabilities, no privilege gain, memory and pids capped;
    client keys from the mounted keys folder (the docker tier checks the running containers)."""
    services = layout(name, tmp_path)["services"]
    for service_name, uid in (("gateway", "10001"), ("nginx", "101")):
        service = services[service_name]
        assert service["user"] == f"{uid}:{uid}", service_name
        assert service["read_only"] is True, service_name
        assert service["cap_drop"] == ["ALL"], service_name
        assert "cap_add" not in service, service_name
        assert service["security_opt"] == ["no-new-privileges:true"], service_name
        assert service["mem_limit"], service_name
        assert service["pids_limit"], service_name
        assert service["tmpfs"], service_name
    gateway = services["gateway"]
    assert gateway["secrets"] == [{"source": "ocrvl-keys", "target": "/run/secrets/ocrvl-keys"}]
    keys_file = gateway["environment"]["OCRVL_API_KEYS_FILE"]
    assert keys_file == "/run/secrets/ocrvl-keys/api-keys.json"
    assert gateway["environment"]["OCRVL_API_KEYS"] == ""


def test_every_gateway_setting_reaches_the_gateway_container(tmp_path: Path) -> None:
    """Each OCRVL_* setting can be given in .env: compose sets it or passes it on when set."""
    from app.settings import Settings  # noqa: PLC0415

    environment = layout("base", tmp_path)["services"]["gateway"]["environment"]
    settings = {f"OCRVL_{name.upper()}" for name in Settings.model_fields}
    assert settings - set(environment) == set()
    passed_on = resolved([BASE], tmp_path, OCRVL_KEY_RPM="30")["services"]["gateway"]
    assert passed_on["environment"]["OCRVL_KEY_RPM"] == "30"


@pytest.mark.parametrize("name", LAYOUTS)
def test_no_layout_needs_an_engine_newer_than_20_10(name: str, tmp_path: Path) -> None:
    """No `healthcheck.start_interval` (Engine 25+), which Engine 20.10 refuses."""
    for service_name, service in layout(name, tmp_path)["services"].items():
        assert "start_interval" not in service["healthcheck"], service_name


@pytest.mark.parametrize(
    ("name", "variable"),
    [("base", "GPU_PROFILE"), ("base", "VLLM_API_KEY"), ("monitoring", "GRAFANA_ADMIN_PASSWORD")],
)
def test_a_missing_required_variable_stops_compose_and_says_what_to_set(
    name: str, variable: str, tmp_path: Path
) -> None:
    """`${VAR:?message}`: compose refuses to start and names the variable."""
    files, extra = LAYOUTS[name]
    env = {k: v for k, v in {**REQUIRED, **extra}.items() if k != variable}
    result = run_config(files, env, tmp_path=tmp_path)
    assert result.returncode != 0
    assert f"required variable {variable} is missing a value: set {variable}" in result.stderr


def test_every_variable_the_compose_files_use_is_in_env_example() -> None:
    """`.env.example` lists every ${VAR} of docker-compose.yml and compose/*.yml."""
    documented = set(env_example())
    for path in COMPOSE_FILES:
        missing = set(variables(path.read_text())) - documented
        assert not missing, f"{path.relative_to(ROOT)} uses undocumented {sorted(missing)}"


def test_env_example_states_the_compose_defaults() -> None:
    """Each `${VAR:-default}` default is the value .env.example shows for VAR."""
    documented = env_example()
    for path in COMPOSE_FILES:
        for name, default in variables(path.read_text()).items():
            if default is not None:
                assert documented[name] == default, (path.name, name)


@pytest.mark.parametrize("name", LAYOUTS)
def test_copying_env_example_changes_nothing_but_the_required_values(
    name: str, tmp_path: Path
) -> None:
    """`cp .env.example .env` (required values filled) resolves exactly like no .env at all."""
    files, extra = LAYOUTS[name]
    with_example = resolved(files, tmp_path, env_file=filled_env_example(tmp_path), **extra)
    without = resolved(files, tmp_path, **extra)
    assert with_example == without


def test_nginx_template_variables_are_all_given_by_compose(compose_model: dict[str, Any]) -> None:
    """Every ${NGINX_*} in nginx/templates is set in the nginx container's environment."""
    environment = compose_model["services"]["nginx"]["environment"]
    prefix = environment["NGINX_ENVSUBST_FILTER"]
    for template in (ROOT / "nginx" / "templates").glob("*.template"):
        used = set(variables(template.read_text()))
        assert all(name.startswith(prefix) for name in used), used
        assert used <= set(environment), used - set(environment)


def generate(count: int, *options: str) -> str:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compose_gpus.py"), str(count), *options],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_two_gpu_override_is_the_generators_output() -> None:
    """compose/gpus-2.yml is exactly `scripts/compose_gpus.py 2`, so the two never drift."""
    assert (ROOT / "compose" / "gpus-2.yml").read_text() == generate(2)


@pytest.mark.parametrize("count", [2, 3, 8])
def test_n_gpu_override_pins_one_vllm_per_gpu_and_balances_over_all(
    count: int, tmp_path: Path
) -> None:
    """One vLLM per device id 0..N-1; the gateway lists and waits for every one of them."""
    override = tmp_path / f"gpus-{count}.yml"
    override.write_text(generate(count))
    model = resolved([BASE, str(override)], tmp_path)
    vllms = vllm_services(model)
    names = ["vllm", *(f"vllm-{i}" for i in range(1, count))]
    assert sorted(vllms) == sorted(names)
    for index, name in enumerate(names):
        devices = vllms[name]["deploy"]["resources"]["reservations"]["devices"]
        assert [device["device_ids"] for device in devices] == [[str(index)]]
        assert vllms[name]["networks"]["default"]["aliases"] == ["vllm-backends"]
        assert vllms[name]["image"] == vllms["vllm"]["image"]
    gateway = model["services"]["gateway"]
    assert gateway["environment"]["OCRVL_BACKENDS"].split(",") == [
        f"http://{name}:8000" for name in names
    ]
    assert {k: v["condition"] for k, v in gateway["depends_on"].items()} == dict.fromkeys(
        names, "service_healthy"
    )


def test_the_generator_refuses_fewer_than_two_gpus() -> None:
    """One GPU is the base file; the generator says so instead of writing a useless override."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compose_gpus.py"), "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "one GPU is the base docker-compose.yml" in result.stderr
