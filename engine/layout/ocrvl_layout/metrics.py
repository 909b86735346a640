"""The layout service's Prometheus metrics, in a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ocrvl_layout.model import gpu_memory

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PAGE_BUCKETS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024)
OUTCOMES = ("ok", "invalid", "overloaded", "not_ready", "closed", "error")


class GpuMemory(Collector):
    """`ocrvl_layout_gpu_memory_bytes{kind}`: torch's allocator on the service's GPU, read at
    each scrape (ocrvl_layout.model.gpu_memory); no samples on a CPU."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ocrvl_layout_gpu_memory_bytes",
            "torch's CUDA allocator in this process: allocated, max_allocated, reserved, "
            "max_reserved (the CUDA context is in none of them).",
            labels=["kind"],
        )
        for kind, value in self.read().items():
            family.add_metric([kind], float(value))
        yield family


class Metrics:
    """Batch sizes, queue waits, forward time per page, pages, requests and forward passes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batch_size = Histogram(
            "ocrvl_layout_batch_size",
            "Pages in one forward pass.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "ocrvl_layout_queue_wait_seconds",
            "From a page's arrival in the queue to the start of its forward pass.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.page_seconds = Histogram(
            "ocrvl_layout_page_seconds",
            "A forward pass's time over its pages (ms per page, in seconds), once per pass.",
            buckets=PAGE_BUCKETS,
            registry=r,
        )
        self.forward_seconds = Histogram(
            "ocrvl_layout_forward_seconds",
            "One forward pass and its candidate extraction.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.pages = Counter("ocrvl_layout_pages", "Pages run through the model.", registry=r)
        self.forward_passes = Counter(
            "ocrvl_layout_forward_passes", "Forward passes (batches) run.", registry=r
        )
        self.requests = Counter(
            "ocrvl_layout_requests",
            "POST /v1/layout requests by outcome.",
            ["outcome"],
            registry=r,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome=outcome)
        self.queue_depth = Gauge(
            "ocrvl_layout_queue_pages", "Pages waiting for a forward pass.", registry=r
        )
        self.held_pages = Gauge(
            "ocrvl_layout_held_pages",
            "Pages of the requests admitted, from before decoding to the end of their pass: "
            "what --max-queue bounds.",
            registry=r,
        )
        self.worker_restarts = Counter(
            "ocrvl_layout_worker_restarts",
            "Times the worker processes were replaced after one died.",
            registry=r,
        )
        self.ready = Gauge("ocrvl_layout_ready", "1 once the model is loaded and warm.", registry=r)
        r.register(GpuMemory(gpu_memory))
