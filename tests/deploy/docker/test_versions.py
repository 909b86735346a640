"""What ships is what is tested: the gateway image holds locks/gateway.txt's pins, as the test
venv does, and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from tests.conftest import ROOT
from tests.deploy.docker.conftest import GATEWAY_TAG, Stack

pytestmark = pytest.mark.docker
# Run in a container of the gateway image and in the test venv alike: every installed
# distribution, and the lock's pins (argv[1]) whose markers hold there (packaging is a pin).
PROBE = """
import json, re, sys
from importlib import metadata
from packaging.markers import Marker
from packaging.utils import canonicalize_name as name_of
text = re.sub(r"\\\\\\n", " ", sys.argv[1])
wanted, marked = {}, []
for line in text.splitlines():
    line = line.split("--hash", 1)[0].strip()
    if not line or line.startswith(("#", "-")):
        continue
    pin, _, marker = line.partition(";")
    name, version = pin.strip().split("==")
    if marker.strip():
        marked.append(name_of(name))
    if not marker.strip() or Marker(marker).evaluate():
        wanted[name_of(name)] = version
installed = {name_of(d.metadata["Name"]): d.version for d in metadata.distributions()}
print(json.dumps({"wanted": wanted, "marked": marked, "installed": installed}))
"""


def probe(found: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The probe's findings; its error output when it failed."""
    assert found.returncode == 0, found.stderr
    result: dict[str, Any] = json.loads(found.stdout)
    return result


def test_the_image_and_the_test_venv_run_the_locked_versions(stack: Stack) -> None:
    """The image's packages are exactly the lock's pins for its Python (the project aside); the
    test venv has the same pins for its own; where the two Pythons pick different pins, only
    a marker of the lock made them differ."""
    lock = (ROOT / "locks" / "gateway.txt").read_text()
    # a container of its own (`stack` built the image): test_stack.py ends with `down`
    run = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", GATEWAY_TAG]
    image = probe(
        subprocess.run([*run, "-c", PROBE, lock], capture_output=True, text=True, timeout=120)
    )
    venv = probe(
        subprocess.run(
            [sys.executable, "-c", PROBE, lock], capture_output=True, text=True, timeout=60
        )
    )
    installed = dict(image["installed"])
    installed.pop(canonicalize_name("paddleocr-vl-server"))
    assert installed == image["wanted"]
    assert {name: venv["installed"].get(name) for name in venv["wanted"]} == venv["wanted"]
    common = image["wanted"].keys() & venv["wanted"].keys()
    assert {name: installed[name] for name in common} == {
        name: venv["installed"][name] for name in common
    }
    assert set(image["wanted"]) ^ set(venv["wanted"]) <= set(image["marked"])
