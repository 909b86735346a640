"""The memory model's graph terms and KV cache against what vLLM 0.32 logged on real H100s
(bench/results).

vLLM's "Graph capturing finished in S secs, took X GiB" is the device's free memory before and
after the capture, so an engine's figure is its own only while no other engine on the card
allocates: these tests read the captures' times from the same log lines."""

from __future__ import annotations

import re
import tarfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from app.profiles import PROFILES_DIR, ROOT
from app.profiles.gpus import card_for_profile
from app.profiles.memory import CUDA_GRAPH_BYTES, MORE_GRAPHS_BYTES, EngineLimits, plan
from app.profiles.shapes import GiB, load_shape

RESULTS = ROOT / "bench" / "results"
GRAPHS_WHOLE = RESULTS / "gpu-h100-2026-12-07-graphs-whole-raw.tar.gz"  # twenty-seventh pass
ENCODER_GRAPHS = RESULTS / "gpu-h100-2026-12-07-encoder-graphs-raw.tar.gz"  # twenty-sixth pass
ENCODER = RESULTS / "gpu-h100-2026-12-06-encoder-raw.tar.gz"  # twenty-third pass, one engine
SHIPPED = RESULTS / "gpu-h100-2026-12-07-method2-raw.tar.gz"  # twenty-eighth: the profile as is

CAPTURE = re.compile(
    r"(\d\d-\d\d \d\d:\d\d:\d\d) \[model_runner\.py:\d+\] Graph capturing finished in (\d+) secs,"
    r" took ([\d.]+) GiB"
)
ENCODER_LINE = "Encoder CUDA graph capture complete"


class Capture(NamedTuple):
    start: datetime
    end: datetime
    gib: float
    encoder: bool  # the log's engine captured the vision encoder's graphs


def logs(tarball: Path, *members: str) -> list[str]:
    """The named logs' texts, the tarball read once."""
    with tarfile.open(tarball) as tar:
        files = tar.getmembers()
        texts = []
        for member in members:
            handle = tar.extractfile(next(f for f in files if f.name.endswith(member)))
            assert handle is not None
            texts.append(handle.read().decode())
    return texts


def captures(tarball: Path, *members: str) -> list[list[Capture]]:
    """Every capture each named vLLM log records, in order."""
    return [_parse(text) for text in logs(tarball, *members)]


def _parse(text: str) -> list[Capture]:
    encoder, found = ENCODER_LINE in text, []
    for match in CAPTURE.finditer(text):
        end = datetime.strptime(match[1], "%m-%d %H:%M:%S")
        found.append(Capture(end - timedelta(seconds=int(match[2])), end, float(match[3]), encoder))
    return found


def overlap(a: Capture, b: Capture) -> bool:
    return a.start < b.end and b.start < a.end


def test_the_extra_graphs_cost_what_two_engines_logged_one_after_the_other() -> None:
    """The twenty-seventh pass: engine 8119 with the profile's compilation-config took 2.04 GiB,
    8118 with vLLM's default 0.27, their captures one after the other; the model's default term
    is 8118's and the extra term the difference."""
    [plain], [graphs] = captures(GRAPHS_WHOLE, "logs/vllm-8118.log", "logs/vllm-8119.log")
    assert (plain.encoder, graphs.encoder) == (False, True)
    assert not overlap(plain, graphs)
    assert (plain.gib, graphs.gib) == (0.27, 2.04)
    assert CUDA_GRAPH_BYTES / GiB == pytest.approx(plain.gib, abs=0.005)
    assert MORE_GRAPHS_BYTES / GiB == pytest.approx(graphs.gib - plain.gib, abs=0.005)


def test_captures_at_the_same_time_do_not_give_the_extra() -> None:
    """The twenty-sixth pass's two captures overlapped, and their difference (0.91 GiB, the
    model's term until the twenty-seventh pass) is not what the graphs cost: its sum is."""
    [plain], [graphs] = captures(ENCODER_GRAPHS, "logs/vllm-8118.log", "logs/vllm-8119.log")
    assert (plain.encoder, graphs.encoder) == (False, True)
    assert overlap(plain, graphs)
    assert graphs.gib - plain.gib < MORE_GRAPHS_BYTES / GiB - 0.8
    total = (CUDA_GRAPH_BYTES + MORE_GRAPHS_BYTES) / GiB
    assert plain.gib + graphs.gib == pytest.approx(total, abs=0.2)


def test_one_engine_alone_with_the_encoders_graphs_stays_under_the_extra() -> None:
    """The twenty-third pass ran one engine on the card: the encoder's graphs (14 budgets, the
    language model's default sizes) took 1.78 GiB against 0.15 without, under the model's extra,
    which also holds 2 more budgets and the language model's sizes past 512."""
    graphed, fused = captures(ENCODER, "logs-graphs/vllm-8118.log", "logs-fused/vllm-8118.log")
    alone, without = graphed[-1], fused[-1]  # each log's first capture is vLLM's profiling
    assert (alone.encoder, alone.gib, without.encoder, without.gib) == (True, 1.78, False, 0.15)
    assert alone.gib - without.gib <= MORE_GRAPHS_BYTES / GiB


def test_the_h100_profile_predicts_the_kv_cache_vllm_logged() -> None:
    """The twenty-eighth pass started h100-80gb.yaml as it ships (0.88, the encoder's graphs and
    the language model's sizes to 2,048), one engine alone on the card: vLLM's KV cache within 1 %
    of the model's and no smaller (the model's 1.77 GiB of extra graphs before the capture, vLLM's
    own estimate of it included), its capture under the model's two graph terms."""
    [text] = logs(SHIPPED, "logs/vllm-8118.log")
    found = re.search(r"GPU KV cache size: ([\d,]+) tokens", text)
    assert found is not None
    logged = int(found[1].replace(",", ""))
    card = card_for_profile("h100-80gb")
    assert card is not None
    flags = yaml.safe_load((ROOT / PROFILES_DIR / "h100-80gb.yaml").read_text())
    predicted = plan(load_shape(), EngineLimits.from_flags(flags), card.memory_bytes).kv_tokens
    assert (logged, predicted) == (3_693_088, 3_675_504)
    assert predicted == pytest.approx(logged, rel=0.01)
    assert predicted <= logged
    capture = _parse(text)[-1]  # the first is vLLM's profiling estimate
    assert capture.encoder
    assert capture.gib <= (CUDA_GRAPH_BYTES + MORE_GRAPHS_BYTES) / GiB
