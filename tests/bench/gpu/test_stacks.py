"""bench.gpu.stacks: py-spy's raw stacks read into inclusive and leaf shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu.stacks import frame, main, shares

RAW = """\
<module> (<string>:1);run (vllm/v1/engine/core.py:1229);step (vllm/v1/engine/core.py:514) 6
<module> (<string>:1);run (vllm/v1/engine/core.py:1229);encode (models/paddleocr_vl.py:1172) 3
Thread._bootstrap (threading.py:1030);poll (zmq/sugar/poll.py:106) 1
not a stack line
"""


def test_frame_keeps_the_function_and_the_file_name() -> None:
    """`function (path/to/file.py:123)` reads as `function file.py:123`."""
    assert frame("run (vllm/v1/engine/core.py:1229)") == "run core.py:1229"
    assert frame("<module> (<string>:1)") == "<module> <string>:1"


def test_shares_count_a_frame_once_per_stack_and_the_top_as_leaf(tmp_path: Path) -> None:
    """Inclusive: every stack the frame is on; leaf: only stacks it tops; junk lines skipped."""
    path = tmp_path / "spy.txt"
    path.write_text(RAW)
    total, inclusive, leaves = shares([path])
    assert total == 10
    assert inclusive["run core.py:1229"] == 9
    assert inclusive["<module> <string>:1"] == 9
    assert inclusive["poll poll.py:106"] == 1
    assert leaves == {
        "step core.py:514": 6,
        "encode paddleocr_vl.py:1172": 3,
        "poll poll.py:106": 1,
    }


def test_the_command_prints_percentages_and_refuses_empty_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """90.0 % for the frame under 9 of 10 samples; an empty file is an error (exit 1)."""
    path, empty = tmp_path / "spy.txt", tmp_path / "empty.txt"
    path.write_text(RAW)
    empty.write_text("")
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "10 samples in 1 file(s)" in out
    assert " 90.0 %  run core.py:1229" in out
    assert main([str(empty)]) == 1


def test_ticks_turn_sample_shares_into_shares_of_the_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """py-spy keeps busy samples only: 10 samples in 2 files of 10 ticks are half the time, and
    the frame under 9 of them was on the stack 45 % of the time (90 % of the samples)."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(RAW)
    second.write_text("")
    assert main([str(first), str(second), "--ticks", "10"]) == 0
    out = capsys.readouterr().out
    assert "50.0% of 20 ticks: busy samples per tick" in out
    assert " 90.0 %   45.0 %  run core.py:1229" in out
