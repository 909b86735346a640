"""Prometheus metrics of the gateway, in a registry of its own per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
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
        self.in_flight = Gauge(
            "ocrvl_requests_in_flight", "Requests being handled now.", registry=self.registry
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

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
