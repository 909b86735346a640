"""compose/monitoring: the Prometheus config, and a dashboard that only asks for real metrics."""

from __future__ import annotations

import json
import re
import subprocess
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from tests.deploy.compose import ROOT

if TYPE_CHECKING:
    from tests.conftest import GatewayServer

MONITORING = ROOT / "compose" / "monitoring"
GRAFANA = MONITORING / "grafana"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GRAFANA / "dashboards" / "ocrvl.json").read_text())
    return loaded


def expressions() -> list[str]:
    panels = [panel for panel in dashboard()["panels"] if panel["type"] != "row"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_prometheus_config_is_valid() -> None:
    """promtool accepts prometheus.yml; it scrapes the gateway, every vLLM and the layout
    service by DNS."""
    config = MONITORING / "prometheus.yml"
    result = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = {
        job["job_name"]: job["dns_sd_configs"][0]["names"]
        for job in yaml.safe_load(config.read_text())["scrape_configs"]
    }
    assert jobs == {"gateway": ["gateway"], "vllm": ["vllm-backends"], "layout": ["layout"]}


def test_dashboard_queries_the_provisioned_datasource() -> None:
    """Every panel and variable of the dashboard uses the provisioned Prometheus, by uid."""
    provisioned = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    panels = [panel for panel in dashboard()["panels"] if panel["type"] != "row"]
    assert len(panels) >= 8
    for panel in panels:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(target["datasource"]["uid"] == uid for target in panel["targets"])
    for variable in dashboard()["templating"]["list"]:
        assert variable["datasource"]["uid"] == uid
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/ocrvl.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"


SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count"),
}


def exposed_names(text: str) -> set[str]:
    """The series names a Prometheus text exposition declares (a labelled counter that has not
    counted yet has its `# TYPE` line but no sample)."""
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1].isalpha()}
    for family, kind in re.findall(r"^# TYPE (\S+) (\w+)$", text, flags=re.MULTILINE):
        names |= {family, *(family + suffix for suffix in SAMPLE_SUFFIXES.get(kind, ("",)))}
    return names


@pytest.mark.vllm
def test_every_dashboard_metric_is_exported_by_the_gateway_or_vllm(
    gateway: GatewayServer,
) -> None:
    """The dashboard's series exist in the real gateway's and the real vLLM's /metrics."""
    key = {"authorization": f"Bearer {gateway.api_key}"}
    assert httpx.get(f"{gateway.url}/v1/models", headers=key).status_code == 200
    exported = exposed_names(httpx.get(f"{gateway.url}/metrics").text) | exposed_names(
        httpx.get(f"{gateway.backend.url}/metrics").text
    )
    series = re.compile(r"\b(?:ocrvl_|vllm:)[a-z0-9_:]+")
    wanted = {name for expr in expressions() for name in series.findall(expr)}
    assert {"ocrvl_requests_total", "vllm:kv_cache_usage_perc"} <= wanted
    assert wanted <= exported, sorted(wanted - exported)
