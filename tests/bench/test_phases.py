"""Where a page's time goes: the histograms' totals and their change over a level's window."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from app.bench import engine
from app.metrics import Metrics


def _vllm_text(observed: dict[str, list[float]], engines: int = 1) -> str:
    """vLLM's histograms as prometheus_client (the library vLLM uses) writes them: one label
    set per engine, each engine observing `observed`."""
    registry = CollectorRegistry()
    for metric, values in observed.items():
        histogram = Histogram(metric, "", ["model_name", "engine"], registry=registry)
        for index in range(engines):
            for value in values:
                histogram.labels("PaddleOCR-VL-0.9B", str(index)).observe(value)
    return generate_latest(registry).decode()


def test_totals_read_vllm_histograms_summed_over_engines() -> None:
    """Sum and count of each phase, added up over the engines' label sets; buckets, other
    histograms and gauges are ignored."""
    text = _vllm_text(
        {
            "vllm:e2e_request_latency_seconds": [2.0, 4.0],
            "vllm:request_prefill_time_seconds": [0.5, 1.5],
            "vllm:time_per_output_token_seconds": [0.01],  # not a phase
        },
        engines=2,
    )
    text += 'vllm:num_requests_running{engine="0"} 3.0\n'
    assert engine.totals(text) == {"vllm": (12.0, 4.0), "prefill": (4.0, 4.0)}


def test_totals_read_the_gateways_chat_route_only() -> None:
    """The gateway's own Metrics, rendered: the chat route's durations and the queue's waits
    count, /metrics and /v1/ocr's durations do not."""
    metrics = Metrics()
    metrics.latency.labels("/v1/chat/completions").observe(3.0)
    metrics.latency.labels("/v1/chat/completions").observe(5.0)
    metrics.latency.labels("/metrics").observe(0.001)
    metrics.latency.labels("/v1/ocr").observe(40.0)
    metrics.queue_wait.observe(1.5)
    found = engine.totals(metrics.render().decode())
    assert found["gateway"] == (8.0, 2.0)
    assert found["gateway_queue"] == (1.5, 1.0)
    assert set(found) == {"gateway", "gateway_queue"}


def test_phases_are_the_change_over_the_samples_that_bracket_the_window() -> None:
    """Means from the last sample at or before the window's start to the last at or before its
    end; a phase first seen inside the window counts from zero; samples after the end and
    before the bracketing one are ignored."""
    timeline: list[tuple[float, engine.Totals]] = [
        (9.0, {"vllm": (1.0, 1.0)}),
        (10.0, {"vllm": (100.0, 10.0)}),  # the start's bracket (start = 10.2)
        (15.0, {"vllm": (130.0, 13.0), "decode": (2.0, 1.0)}),
        (19.9, {"vllm": (160.0, 14.0), "decode": (8.0, 3.0)}),  # the end's bracket (end = 20)
        (20.5, {"vllm": (999.0, 99.0), "decode": (999.0, 99.0)}),  # after the window
    ]
    found = engine.phases(timeline, start=10.2, end=20.0)
    assert found["mean_s"] == {"vllm": pytest.approx(15.0), "decode": pytest.approx(8 / 3)}
    assert found["requests"] == {"vllm": 4, "decode": 3}
    assert found["from_s"] == pytest.approx(-0.2)
    assert found["to_s"] == pytest.approx(-0.1)


def test_phases_need_two_samples_and_a_request() -> None:
    """No window to speak of: one sample, none, or no request finished between the two."""
    assert engine.phases([], 0.0, 10.0) == {}
    assert engine.phases([(1.0, {"vllm": (1.0, 1.0)})], 0.0, 10.0) == {}
    still = [(1.0, {"vllm": (5.0, 2.0)}), (9.0, {"vllm": (5.0, 2.0)})]
    assert engine.phases(still, 1.0, 10.0) == {}
    # a window that starts before the first sample is measured from that sample
    assert engine.phases([(1.0, {}), (9.0, {"vllm": (4.0, 2.0)})], 0.0, 10.0)["mean_s"] == {
        "vllm": 2.0
    }


def test_the_gateways_queue_wait_is_per_page_over_every_request_it_answered() -> None:
    """The gateway observes the wait only of requests that waited; per page it is their total
    over all the gateway's requests in the window, and 0 when none waited."""
    timeline: list[tuple[float, engine.Totals]] = [
        (0.0, {"gateway": (10.0, 5.0), "gateway_queue": (1.0, 1.0)}),
        (10.0, {"gateway": (50.0, 15.0), "gateway_queue": (7.0, 3.0)}),  # 2 of 10 waited 6 s
    ]
    found = engine.phases(timeline, 0.0, 10.0)
    assert found["mean_s"] == {"gateway": 4.0, "gateway_queue": pytest.approx(0.6)}
    assert found["requests"] == {"gateway": 10, "gateway_queue": 2}
    nobody = [(0.0, {"gateway": (0.0, 0.0), "gateway_queue": (0.0, 0.0)}),
              (5.0, {"gateway": (8.0, 4.0), "gateway_queue": (0.0, 0.0)})]  # fmt: skip
    assert engine.phases(nobody, 0.0, 5.0)["mean_s"] == {"gateway": 2.0, "gateway_queue": 0.0}
