"""The layout service's GPU memory gauges (`ocrvl_layout_gpu_memory_bytes{kind}`): torch's
allocator read at each scrape, one sample per kind; none on a CPU, where there is no GPU."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.layout_service import ENGINE_VENV, ROOT

pytestmark = pytest.mark.engine

SCRIPT = """
from prometheus_client import CollectorRegistry, generate_latest
from ocrvl_layout.metrics import GpuMemory, Metrics
from ocrvl_layout.model import gpu_memory

registry = CollectorRegistry()
reads = []
def read():
    reads.append(1)
    return {"allocated": 1024, "max_allocated": 2048, "reserved": 4096, "max_reserved": 8192}
registry.register(GpuMemory(read))
print(generate_latest(registry).decode())
print(generate_latest(registry).decode().count("ocrvl_layout_gpu_memory_bytes{"), len(reads))
print("cpu:", gpu_memory(), generate_latest(Metrics().registry).decode().count(
    "ocrvl_layout_gpu_memory_bytes{"))
"""


def test_gauges_read_the_allocator_at_each_scrape_and_say_nothing_on_a_cpu() -> None:
    done = subprocess.run(
        [str(ENGINE_VENV / "bin" / "python"), "-c", SCRIPT],
        cwd=ROOT / "engine" / "layout",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for kind, value in (("allocated", 1024), ("max_allocated", 2048), ("reserved", 4096),
                        ("max_reserved", 8192)):  # fmt: skip
        assert f'ocrvl_layout_gpu_memory_bytes{{kind="{kind}"}} {float(value)}' in out
    assert "4 2" in out  # four samples on the second scrape, the allocator read at each
    assert "cpu: {} 0" in out  # no CUDA here: the service's own registry has no samples
