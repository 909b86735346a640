"""The memory model's graph terms against what vLLM 0.32 logged on real H100s (bench/results).

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

from app.profiles import ROOT
from app.profiles.memory import CUDA_GRAPH_BYTES, MORE_GRAPHS_BYTES
from app.profiles.shapes import GiB

RESULTS = ROOT / "bench" / "results"
GRAPHS_WHOLE = RESULTS / "gpu-h100-2026-12-07-graphs-whole-raw.tar.gz"  # twenty-seventh pass
ENCODER_GRAPHS = RESULTS / "gpu-h100-2026-12-07-encoder-graphs-raw.tar.gz"  # twenty-sixth pass
ENCODER = RESULTS / "gpu-h100-2026-12-06-encoder-raw.tar.gz"  # twenty-third pass, one engine

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


def captures(tarball: Path, *members: str) -> list[list[Capture]]:
    """Every capture each named vLLM log records, in order, the tarball read once."""
    with tarfile.open(tarball) as tar:
        files = tar.getmembers()
        texts = []
        for member in members:
            handle = tar.extractfile(next(f for f in files if f.name.endswith(member)))
            assert handle is not None
            texts.append(handle.read().decode())
    return [_parse(text) for text in texts]


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
