"""Reading a vLLM engine's /metrics: load, KV cache use, cache size."""

from __future__ import annotations

from app.engines import parse_metrics

# Two engines (data-parallel ranks) as vLLM 0.32 writes them, with a label value that holds braces.
TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="8192",\
kv_sharing="{}"} 1.0
"""


def test_load_sums_engines_and_takes_the_fullest_kv_cache() -> None:
    """Running and waiting add up over engines; KV use is the fullest engine's."""
    load = parse_metrics(TEXT, now=10.0)
    assert load is not None
    assert (load.running, load.waiting, load.kv_usage) == (5, 1, 0.5)
    assert (load.num_gpu_blocks, load.block_size, load.max_num_seqs) == (8192, 16, None)


def test_readings_go_stale() -> None:
    """A reading older than a few seconds no longer steers routing."""
    load = parse_metrics(TEXT, now=10.0)
    assert load is not None
    assert load.fresh(now=11.0)
    assert not load.fresh(now=20.0)


def test_a_server_without_vllm_series_has_no_load() -> None:
    """Another server's /metrics (or an empty one) gives None: routing uses in-flight counts."""
    assert parse_metrics("# nothing\nprocess_cpu_seconds_total 1.0\n") is None
    assert parse_metrics("") is None


def test_unparseable_values_are_skipped() -> None:
    """NaN or garbage values do not break the reading."""
    load = parse_metrics(
        'vllm:num_requests_running{a="b"} NaN\nvllm:num_requests_waiting 2\n'
        "vllm:kv_cache_usage_perc +Inf\n"
    )
    assert load is not None
    assert (load.running, load.waiting, load.kv_usage) == (0, 2, 0.0)
