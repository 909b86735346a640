"""The engine image in the running stack: vLLM with the packed-encoder plugin loaded, and the
layout service from the same image on the tiny checkpoint, found by the gateway.

Runs before test_stack.py (file order), whose last test takes the stack down.
"""

from __future__ import annotations

import base64
import json
import re

import httpx
import pytest

from tests.deploy.docker.conftest import ENGINE_TAG, Stack, docker
from tests.deploy.test_nginx import bearer
from tests.support.pages import document_page

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]
ENGINE_PACKAGES = "/opt/ocrvl-engine"  # engine/Dockerfile's --target, first on PYTHONPATH

WHERE = """
import json
from importlib.metadata import entry_points
import ocrvl_layout, ocrvl_vllm_plugin
plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
print(json.dumps({"plugins": plugins, "plugin": ocrvl_vllm_plugin.__file__,
                  "layout": ocrvl_layout.__file__}))
"""

IN_CONTAINER_GET = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=10) as answer:
    print(answer.status)
    print(answer.read().decode())
"""


def metric(text: str, name: str) -> float:
    """One unlabelled sample of a Prometheus text exposition."""
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert found, f"{name} not in the metrics"
    return float(found.group(1))


def layout_get(stack: Stack, path: str) -> tuple[int, str]:
    """GET the layout service from inside its own container (it publishes nothing)."""
    ran = stack.exec("layout", "python3", "-c", IN_CONTAINER_GET, f"http://127.0.0.1:8300{path}")
    assert ran.returncode == 0, ran.stderr
    status, _, body = ran.stdout.partition("\n")
    return int(status), body


def test_vllm_runs_the_engine_image_with_the_plugin_loaded(stack: Stack) -> None:
    """The vllm container runs the image built from engine/Dockerfile over the CPU base; vLLM's
    Python finds the plugin's entry point in the image's packages (not the mounted venv's), and
    the engine's log shows the plugin registering its class (VLLM_PLUGINS unset)."""
    config = stack.inspect("vllm")
    assert config["Config"]["Image"] == ENGINE_TAG
    # `docker inspect` lists a pass-through variable left unset by its bare name, no `=`.
    environment = dict(item.partition("=")[::2] for item in config["Config"]["Env"])
    assert environment["PYTHONPATH"].split(":")[0] == ENGINE_PACKAGES
    unset = stack.exec("vllm", "python3", "-c", "import os; print('VLLM_PLUGINS' in os.environ)")
    assert unset.stdout.strip() == "False", unset.stderr
    ran = stack.exec("vllm", "python3", "-c", WHERE)
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert found["plugins"]["ocrvl_packed_encoder"] == "ocrvl_vllm_plugin:register"
    assert found["plugin"].startswith(f"{ENGINE_PACKAGES}/")
    assert found["layout"].startswith(f"{ENGINE_PACKAGES}/")
    log = stack.compose("logs", "--no-color", "vllm")
    assert "ocrvl_packed_encoder" in log, log[-3000:]


def test_the_layout_service_runs_from_the_same_image_on_the_tiny_checkpoint(stack: Stack) -> None:
    """`layout` is the engine image with its own command: ready (its healthcheck passed), and
    it answers a page with boxes in the page's own pixels."""
    config = stack.inspect("layout")
    assert config["Config"]["Image"] == ENGINE_TAG
    assert config["Config"]["Entrypoint"] == ["python3", "-m", "ocrvl_layout"]
    assert "/models/tiny-layout" in config["Config"]["Cmd"]
    assert config["State"]["Health"]["Status"] == "healthy"
    assert layout_get(stack, "/ready")[0] == 200
    # Small enough for one argv string (Linux caps one at 128 KiB): the request goes in by exec.
    page = document_page(seed=5, width=310, height=438, quality=60)
    body = {"images": [f"data:image/jpeg;base64,{base64.b64encode(page).decode()}"]}
    ran = stack.exec(
        "layout", "python3", "-c",
        "import sys, urllib.request; r = urllib.request.Request('http://127.0.0.1:8300/v1/layout', "
        "data=sys.argv[1].encode(), headers={'Content-Type': 'application/json'}); "
        "print(urllib.request.urlopen(r, timeout=60).read().decode())",
        json.dumps(body),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (result,) = json.loads(ran.stdout)["results"]
    assert (result["width"], result["height"]) == (310, 438)
    assert isinstance(result["boxes"], list)
    image = docker("image", "inspect", ENGINE_TAG, "--format", "{{json .Config.Labels}}")
    assert json.loads(image)["ocrvl.engine-packages"] == "ocrvl-vllm-plugin ocrvl-layout"


def test_a_document_through_nginx_goes_through_the_layout_service(stack: Stack) -> None:
    """The gateway's OCRVL_LAYOUT_URL is the layout service: a page sent to /v1/ocr through
    nginx is a page more in the layout service's own count."""
    environment = stack.inspect("gateway")["Config"]["Env"]
    assert "OCRVL_LAYOUT_URL=http://layout:8300" in environment
    before = metric(layout_get(stack, "/metrics")[1], "ocrvl_layout_pages_total")
    answer = httpx.post(
        f"{stack.url}/v1/ocr", headers=bearer(stack.keys["ci-client"]), timeout=300,
        files={"file": ("page.png", document_page(seed=9, fmt="PNG"), "image/png")},
        data={"max_tokens": "8", "layout": "on"},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text[:500]
    assert metric(layout_get(stack, "/metrics")[1], "ocrvl_layout_pages_total") == before + 1
