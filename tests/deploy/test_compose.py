"""The compose files, resolved and validated by Docker Compose v2 itself (no engine needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.compose import (
    BASE,
    ENV_EXAMPLE,
    GPU_PROFILES,
    REQUIRED,
    ROOT,
    defaulted,
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
    "gpus-2": ([BASE], {"GPUS": "2"}),
    "cpu": ([BASE], {"GPU_PROFILE": "cpu"}),
    "paddleocr": ([BASE, "compose/paddleocr.yml"], {}),
    "monitoring": ([BASE, "compose/monitoring.yml"], {}),
    "gpus-2+monitoring": ([BASE, "compose/monitoring.yml"], {"GPUS": "2"}),
    "mps": ([BASE], {"GPU_PROFILE": "h200-141gb"}),
    "mps+monitoring": ([BASE, "compose/monitoring.yml"], {"GPU_PROFILE": "h200-141gb"}),
    "gpus-2-mps": ([BASE], {"GPU_PROFILE": "h200-141gb", "GPUS": "2"}),
    "one-engine": ([BASE], {"GPU_PROFILE": "h200-141gb", "ENGINES_PER_GPU": "1"}),
}
COMPOSE_FILES = [
    ROOT / BASE,
    *sorted((ROOT / "compose").glob("*.yml")),
    *sorted((ROOT / "compose" / "engines").glob("*.yml")),
    *sorted((ROOT / "compose" / "layouts").glob("*.yml")),
]
PER_PROFILE = {"ENGINES_PER_GPU", "LAYOUT_MAX_BATCH"}
"""Variables whose default is the profile's own (.env.example shows them commented out)."""


def layout(name: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    files, extra = LAYOUTS[name]
    return resolved(files, tmp_path, **{**extra, **env})


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
    """One vLLM and the layout service on GPU 0, both the profile's engine image; the gateway
    finds the engines by their alias and waits for vLLM (and the layout service when it runs);
    nginx waits for the gateway."""
    model = layout("base", tmp_path)
    services = model["services"]
    assert set(services) == {"vllm", "layout", "gateway", "nginx"}
    vllm = services["vllm"]
    profile = REQUIRED["GPU_PROFILE"]
    declared = profile_services()[profile]
    assert vllm["image"] == defaulted(declared["image"]) == "ocrvl-engine:0.1.0-vllm0.32.0"
    assert vllm["build"]["dockerfile"] == "engine/Dockerfile"
    assert vllm["build"]["context"] == str(ROOT)
    assert vllm["build"]["args"]["VLLM_IMAGE"] == declared["build"]["args"]["VLLM_IMAGE"]
    assert vllm["entrypoint"] == ["vllm"]
    command = vllm["command"]
    assert command[:2] == ["serve", "PaddlePaddle/PaddleOCR-VL-1.5"]
    assert command[command.index("--config") + 1] == f"/vllm_configs/{profile}.yaml"
    assert command[command.index("--served-model-name") + 1] == "PaddleOCR-VL-1.5-0.9B"
    assert vllm["environment"]["VLLM_API_KEY"] == REQUIRED["VLLM_API_KEY"]
    assert vllm["environment"]["VLLM_PLUGINS"] is None  # unset: the plugin loads
    assert vllm["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}
    ]
    assert "ports" not in vllm
    assert vllm["healthcheck"]["start_period"] == "20m0s"
    assert {v["target"] for v in vllm["volumes"]} == {"/vllm_configs", "/root/.cache/huggingface"}
    assert next(v for v in vllm["volumes"] if v["target"] == "/vllm_configs")["source"] == str(
        ROOT / "vllm_configs"
    )
    gateway = services["gateway"]
    assert gateway["build"]["dockerfile"] == "Dockerfile"
    assert gateway["environment"]["OCRVL_BACKENDS"] == "dns+http://vllm-backends:8000"
    assert gateway["environment"]["OCRVL_LAYOUT_URL"] == "http://layout:8300"
    assert gateway["environment"]["OCRVL_BACKEND_API_KEY"] == REQUIRED["VLLM_API_KEY"]
    assert gateway["depends_on"]["vllm"]["condition"] == "service_healthy"
    assert gateway["depends_on"]["layout"] == {"condition": "service_healthy", "required": False}
    assert services["nginx"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    templates = services["nginx"]["volumes"][0]
    assert (templates["source"], templates["target"]) == (
        str(ROOT / "nginx" / "templates"),
        "/etc/nginx/templates",
    )


def test_the_layout_service_runs_from_the_engine_image_on_vllms_gpu(tmp_path: Path) -> None:
    """`python3 -m ocrvl_layout` on port 8300 with LAYOUT_MODEL and the batch the profiles make
    room for, on vLLM's GPU (GPU_DEVICE moves both), healthy once /ready answers."""
    services = layout("base", tmp_path, GPU_DEVICE="3", LAYOUT_MODEL="/models/mine")["services"]
    service, vllm = services["layout"], services["vllm"]
    assert (service["image"], service["build"]) == (vllm["image"], vllm["build"])
    assert service["entrypoint"] == ["python3", "-m", "ocrvl_layout"]
    options = dict(zip(service["command"][::2], service["command"][1::2], strict=True))
    assert options == {
        "--model": "/models/mine",
        "--host": "0.0.0.0",  # noqa: S104 (the compose network only: nothing publishes 8300)
        "--port": "8300",
        "--max-batch": "4",  # the default GPU_PROFILE's, the L4's (app/profiles/layout.py)
    }
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["device_ids"] == ["3"]
    assert service["expose"] == ["8300"]
    assert "ports" not in service
    probe = service["healthcheck"]["test"]
    assert probe[:2] == ["CMD", "python3"]
    assert "http://127.0.0.1:8300/ready" in probe[-1]
    default = layout("base", tmp_path)["services"]["layout"]["command"]
    assert default[1] == "PaddlePaddle/PP-DocLayoutV3_safetensors"


def test_the_layout_service_can_be_left_out_and_the_gateway_told(tmp_path: Path) -> None:
    """OCRVL_LAYOUT_URL= (empty) gives the gateway no layout service; `--scale layout=0` is
    allowed because the gateway's wait for it is not required."""
    gateway = layout("base", tmp_path, OCRVL_LAYOUT_URL="")["services"]["gateway"]
    assert gateway["environment"]["OCRVL_LAYOUT_URL"] == ""
    assert gateway["depends_on"]["layout"]["required"] is False


@pytest.mark.parametrize("profile", profiles())
def test_every_gpu_profile_resolves_to_its_image_and_config(profile: str, tmp_path: Path) -> None:
    """GPU_PROFILE picks the profile's engine image (built on its vLLM image), its environment
    and its vllm_configs/ file, for vLLM and the layout service alike."""
    services = layout("base", tmp_path, GPU_PROFILE=profile)["services"]
    declared = profile_services()[profile]
    for name in ("vllm", "layout"):
        assert services[name]["image"] == defaulted(declared["image"]), name
        base = defaulted(declared["build"]["args"]["VLLM_IMAGE"])
        assert services[name]["build"]["args"]["VLLM_IMAGE"] == base, name
        for key, value in (declared.get("environment") or {}).items():
            assert services[name]["environment"][key] == str(value), name
    vllm = services["vllm"]
    config = vllm["command"][vllm["command"].index("--config") + 1]
    assert (ROOT / config.lstrip("/")).is_file()


def test_every_vllm_config_has_a_compose_profile() -> None:
    """Each vllm_configs/<profile>.yaml can be chosen with GPU_PROFILE."""
    configs = sorted(path.stem for path in (ROOT / "vllm_configs").glob("*.yaml"))
    assert configs == profiles()


def test_every_engine_image_is_tagged_with_the_project_and_vllm_versions() -> None:
    """ENGINE_IMAGE:<project version>-vllm<the profile's vLLM>[-cpu], so two vLLM bases never
    share a tag, and a new project version is a new tag."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, service in profile_services().items():
        vllm = service["labels"]["ocrvl.vllm-version"]
        suffix = "-cpu" if name == "cpu" else ""
        assert service["image"] == f"${{ENGINE_IMAGE:-ocrvl-engine}}:{version}-vllm{vllm}{suffix}"
        assert f":v{vllm}" in service["build"]["args"]["VLLM_IMAGE"], name


def test_cpu_profile_runs_the_cpu_image_without_a_gpu(tmp_path: Path) -> None:
    """GPU_PROFILE=cpu alone: no NVIDIA reservation for vLLM or the layout service; the engine
    image over the CPU image (VLLM_CPU_IMAGE names another), cpu.yaml, and the capabilities
    vLLM CPU asks for."""
    services = layout("cpu", tmp_path)["services"]
    assert set(services) == {"vllm", "layout", "gateway", "nginx"}
    vllm = services["vllm"]
    assert "deploy" not in vllm
    assert "deploy" not in services["layout"]
    assert vllm["image"] == "ocrvl-engine:0.1.0-vllm0.32.0-cpu"
    assert vllm["build"]["args"]["VLLM_IMAGE"] == "vllm/vllm-openai-cpu:v0.32.0"
    assert "/vllm_configs/cpu.yaml" in vllm["command"]
    assert vllm["cap_add"] == ["SYS_NICE"]
    other = layout("cpu", tmp_path, VLLM_CPU_IMAGE="mine/vllm-cpu:arm64")["services"]
    assert other["layout"]["build"]["args"]["VLLM_IMAGE"] == "mine/vllm-cpu:arm64"


def test_paddleocr_override_runs_genai_server_with_the_same_profile(tmp_path: Path) -> None:
    """PaddleOCR's official image (nothing built for it) and `paddleocr genai_server …
    --backend_config <profile>`."""
    vllm = layout("paddleocr", tmp_path)["services"]["vllm"]
    assert "/paddleocr-genai-vllm-server:" in vllm["image"]
    assert "build" not in vllm
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
    """`.env.example` lists every ${VAR} of docker-compose.yml and the files under compose/; a
    variable whose default is the profile's own is there too, commented out (so that copying
    the file keeps the profile's default)."""
    documented = set(env_example())
    text = ENV_EXAMPLE.read_text()
    for name in PER_PROFILE:
        assert name not in documented
        assert f"\n# {name}=" in text, name
    for path in COMPOSE_FILES:
        missing = set(variables(path.read_text())) - documented - PER_PROFILE
        assert not missing, f"{path.relative_to(ROOT)} uses undocumented {sorted(missing)}"


def test_env_example_states_the_compose_defaults() -> None:
    """Each `${VAR:-default}` default is the value .env.example shows for VAR."""
    documented = env_example()
    for path in COMPOSE_FILES:
        for name, default in variables(path.read_text()).items():
            if default is not None and name not in PER_PROFILE:
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


def seconds_of(duration: str) -> float:
    """A Go duration as `docker compose config` writes it (`10m30s`, `680s`, `1h0m0s`)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0}
    total, number = 0.0, ""
    for char in duration:
        if char.isdigit() or char == ".":
            number += char
        else:
            total, number = total + float(number) * units[char], ""
    assert number == "", duration
    return total


def test_a_stop_waits_for_the_requests_in_flight_as_kubernetes_does(tmp_path: Path) -> None:
    """The gateway's stop grace covers its drain (OCRVL_REQUEST_TIMEOUT) and its closing, nginx's
    covers NGINX_PROXY_READ_TIMEOUT and it gets SIGQUIT, its graceful stop (Docker's own 10 s
    would kill either mid-page, SIGTERM makes nginx drop its open requests); both graces are
    Kubernetes' terminationGracePeriodSeconds, and a .env value replaces them."""
    services = layout("base", tmp_path)["services"]
    gateway, nginx = services["gateway"], services["nginx"]
    request_timeout = float(gateway["environment"]["OCRVL_REQUEST_TIMEOUT"])
    assert seconds_of(gateway["stop_grace_period"]) >= request_timeout + 20
    read_timeout = seconds_of(nginx["environment"]["NGINX_PROXY_READ_TIMEOUT"])
    assert seconds_of(nginx["stop_grace_period"]) > read_timeout
    assert nginx["stop_signal"] == "SIGQUIT"  # nginx's graceful stop; SIGTERM drops requests
    kubernetes = ROOT / "deploy" / "kubernetes" / "base"
    for name, service in (("gateway", gateway), ("nginx", nginx)):
        [deployment] = [d for d in yaml.safe_load_all((kubernetes / f"{name}.yaml").read_text())
                        if d and d["kind"] == "Deployment"]  # fmt: skip
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert seconds_of(service["stop_grace_period"]) == grace, name
    longer = layout("base", tmp_path, GATEWAY_STOP_GRACE_PERIOD="1200s")["services"]["gateway"]
    assert seconds_of(longer["stop_grace_period"]) == 1200


@pytest.mark.parametrize("name", ["base", "mps", "gpus-2-mps", "cpu"])
def test_every_engine_drains_its_pages_within_its_stop_grace(name: str, tmp_path: Path) -> None:
    """Each vLLM service's stop grace outlasts its profile's `shutdown-timeout` (the drain of
    its pages in flight on SIGTERM; vLLM's default 0 aborts them), and Kubernetes' pods give
    the same drain a preStop sleep on top."""
    services = layout(name, tmp_path)["services"]
    engines = {n: s for n, s in services.items() if n.startswith("vllm")}
    assert engines
    for service_name, service in engines.items():
        command = [str(word) for word in service.get("command") or []]
        profile = command[command.index("--config") + 1].rsplit("/", 1)[-1]
        config = yaml.safe_load((ROOT / "vllm_configs" / profile).read_text())
        assert config["shutdown-timeout"] > 0, profile
        grace = seconds_of(service["stop_grace_period"])
        assert grace >= config["shutdown-timeout"] + 5, service_name
    kubernetes = ROOT / "deploy" / "kubernetes" / "vllm" / "deployment.yaml"
    [pod] = [d["spec"]["template"]["spec"] for d in yaml.safe_load_all(kubernetes.read_text())
             if d and d["kind"] == "Deployment"]  # fmt: skip
    [container] = pod["containers"]
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    for profile in (ROOT / "vllm_configs").glob("*.yaml"):
        drain = yaml.safe_load(profile.read_text())["shutdown-timeout"]
        assert pod["terminationGracePeriodSeconds"] >= sleep + drain + 5, profile.name
