"""Prometheus metrics of the gateway, in a registry of its own per app."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BACKEND_GAUGES = {
    "in_flight": "Requests the gateway has on the backend now.",
    "capacity": "Pages the backend serves at once (OCRVL_BACKENDS ;capacity=N, else learnt).",
    "sequences": "Sequences the gateway has on the backend at most (its engine's max-num-seqs, "
    "else 256; never below its capacity).",
    "healthy": "1 while the backend answered its last probe.",
    "engine_running": "vllm:num_requests_running at the last /metrics scrape (-1: unread).",
    "engine_waiting": "vllm:num_requests_waiting at the last /metrics scrape (-1: unread).",
    "engine_kv_usage": "vllm:kv_cache_usage_perc (0-1) at the last /metrics scrape (-1: unread).",
}
BackendReadings = Callable[[], Iterable[tuple[str, dict[str, float]]]]
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class Metrics:
    """The gateway's counters, gauges and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "ocrvl_requests",
            "Requests answered, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "ocrvl_request_duration_seconds",
            "Whole-request latency as the gateway saw it, by route.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.overhead = Histogram(
            "ocrvl_gateway_overhead_seconds",
            "Time spent in the gateway itself: latency minus time awaiting the backend "
            "(the HTTP client's own work while sending and reading counts as awaiting, so "
            "bench.overhead's outside view is the fuller figure).",
            ["route"],
            buckets=OVERHEAD_BUCKETS,
            registry=self.registry,
        )
        self.layout_stages = Histogram(
            "ocrvl_layout_stage_seconds",
            "Seconds a page spent in each stage of the layout pipeline, by stage: render (its "
            "image for the layout service), layout (the service's answer, its queue and batch "
            "included), cut (its blocks cut and encoded), blocks (its blocks read, all at "
            "once), assemble (its markdown and blocks); a stage that failed is not counted.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "ocrvl_requests_in_flight", "Requests being handled now.", registry=self.registry
        )
        self.queue_depth = Gauge(
            "ocrvl_queue_depth",
            "Requests waiting in the admission queue for a backend slot.",
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "ocrvl_queue_wait_seconds",
            "Time requests spent in the admission queue (served, shed or gone alike).",
            buckets=QUEUE_BUCKETS,
            registry=self.registry,
        )
        self.shed = Counter(
            "ocrvl_shed",
            "Requests answered 503 server_overloaded without a backend call, by reason "
            "(queue_full, expected_wait, queue_timeout).",
            ["reason"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            "ocrvl_upstream_errors",
            "Backend failures by kind (connect, timeout, disconnect, status_4xx, status_5xx, ...).",
            ["kind"],
            registry=self.registry,
        )

        self.truncated = Counter(
            "ocrvl_truncated_answers",
            "Answers that ended at their token limit (finish_reason length): a page cut short; "
            "raise max_completion_tokens or the profile's max-model-len.",
            ["route"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "ocrvl_rate_limited",
            "Requests answered 429 by the per-key limits, by key name (never the key) and "
            "limit (rpm or concurrency).",
            ["key", "limit"],
            registry=self.registry,
        )
        self.loops_stopped = Counter(
            "ocrvl_loops_stopped",
            "Answers of the document pipeline (and guarded chat) the loop guard stopped, by "
            "route and block label (a whole page: its task).",
            ["route", "label"],
            registry=self.registry,
        )
        self.loop_tokens_avoided = Counter(
            "ocrvl_loop_tokens_avoided",
            "Decode tokens the loop guard's stops saved: each stopped answer's max_tokens less "
            "the tokens it had generated.",
            ["route"],
            registry=self.registry,
        )
        # usage per key (ocrvl_usage_*) is exported by app/usage's own collector
        self.budget_refused = Counter(
            "ocrvl_budget_refused",
            "Requests answered 429 insufficient_quota, by key name and budget (day, month).",
            ["key", "budget"],
            registry=self.registry,
        )

        self.cache_hits = Counter(
            "ocrvl_cache_hits",
            "Pages answered from the results cache (no layout service, no engine).",
            registry=self.registry,
        )
        self.cache_misses = Counter(
            "ocrvl_cache_misses",
            "Pages looked up in the results cache and not found there (then read).",
            registry=self.registry,
        )
        self.cache_entries = Gauge(
            "ocrvl_cache_entries",
            "Pages the results cache holds (every key), at its last sweep.",
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "ocrvl_cache_bytes",
            "Bytes the results cache holds (every key), at its last sweep (OCRVL_CACHE_MAX_BYTES).",
            registry=self.registry,
        )

    def count_stops(self, route: str, stops: list[tuple[str, int]]) -> None:
        """Count the answers the loop guard stopped: (label, decode tokens avoided) each."""
        for label, avoided in stops:
            self.loops_stopped.labels(route, label).inc()
            self.loop_tokens_avoided.labels(route).inc(avoided)

    def watch_backends(self, read: BackendReadings) -> Collector:
        """Export per-backend load and capacity, read from `read` at each scrape; the lifespan
        unregisters the returned collector when it ends."""
        collector = _BackendCollector(read)
        self.registry.register(collector)
        return collector

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _BackendCollector(Collector):
    """`ocrvl_backend_*{backend}` gauges, read from the pool when Prometheus scrapes."""

    def __init__(self, read: BackendReadings) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        families = {
            name: GaugeMetricFamily(f"ocrvl_backend_{name}", text, labels=["backend"])
            for name, text in BACKEND_GAUGES.items()
        }
        for url, readings in self._read():
            for name, value in readings.items():
                families[name].add_metric([url], value)
        yield from families.values()
