"""`make serve MODEL=tiny ENGINES=2` as README gives it (with two engines): vLLM + gateway, the
README snippet, each engine's output in its own log, both engines serving behind one gateway,
Ctrl-C stopping all cleanly once the page in flight is answered."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from app.proxy import backend_error, stopping
from tests.conftest import (
    ROOT,
    VENV_BIN,
    _tail,
    decoded_to_the_end,
    engine_environment,
    running_requests,
    wait_until_up,
)
from tests.support.prometheus import metric
from tests.support.servers import free_port, free_ports, ignored_signals

pytestmark = pytest.mark.vllm
BACKEND = "sk-backend-make-serve-test"
Serving = tuple[int, int, Path, "subprocess.Popen[bytes]"]  # engines' first port, gateway's, log


def readme_snippet(name: str) -> str:
    """The fenced code block that follows `<!-- snippet: NAME -->` in README.md."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- snippet: {name} -->\n```\w*\n(.*?)```", readme, re.DOTALL)
    assert match, f"README.md has no snippet {name!r}"
    return match.group(1)


@pytest.fixture(scope="module")
def make_serve(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, int, Path, subprocess.Popen[bytes]]]:
    """`make serve MODEL=tiny ENGINES=2` on free ports (engines on VLLM_PORT and VLLM_PORT+1),
    in its own process group as a terminal runs it; the module's last test stops it with
    Ctrl-C (here too, if it did not). (One start for the whole module: each costs CI two engine
    starts. SIGTERM to make alone, what a service manager sends, is
    tests/real/test_serve_stop.py's.)"""
    vllm_port, port = free_ports(2), free_port()
    log = Path(tmp_path_factory.mktemp("make-serve")) / "make-serve.log"
    env = {
        **engine_environment(),
        "OCRVL_API_KEYS": "sk-local",
        "OCRVL_BACKEND_API_KEY": BACKEND,  # the engines' key (serve.sh's own is random)
        "STOP_GRACE_S": "90",  # the last test's page drains past serve.sh's default 10 s
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["make", "serve", "MODEL=tiny", "ENGINES=2", f"VLLM_PORT={vllm_port}", f"PORT={port}",
             f"LAYOUT_PORT={free_port()}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until_up(f"http://127.0.0.1:{port}/ready", process, log, 900)
        yield vllm_port, port, log, process
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in the terminal
            process.wait(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def assert_stopped_cleanly(log: Path) -> None:
    """serve.sh stopped everything and exited 0: its last word, no `Error N` from make (GNU
    make itself then ends by the signal it was sent, as it always does), and no shutdown noise
    of the engine (xgrammar's nanobind leak report) on the terminal: that goes to its log."""
    terminal = log.read_text(errors="replace")
    assert "make serve: stopped" in terminal, terminal[-3000:]
    assert not re.search(r"\*\*\* \[.*\] Error \d+", terminal), terminal[-3000:]
    assert "nanobind" not in terminal, terminal[-3000:]


def test_engine_output_goes_to_a_log_named_at_start(make_serve: Serving) -> None:
    """By default each engine's output is in logs/vllm-PORT.log, named on the terminal at start;
    the terminal holds the gateway's own JSON lines and none of vLLM's (its GET /metrics lines
    every second)."""
    vllm_port, port, log, _ = make_serve
    httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5)
    terminal = log.read_text(errors="replace")
    for engine_port in (vllm_port, vllm_port + 1):
        name = f"logs/vllm-{engine_port}.log"
        assert f"make serve: vllm-{engine_port}'s output: {name}" in terminal
        engine = (ROOT / name).read_text(errors="replace")
        assert "GET /health" in engine
    assert '"logger":"ocrvl.' in terminal
    assert "GET /metrics" not in terminal
    assert "GET /health" not in terminal


def test_readme_snippet_returns_a_completion(make_serve: Serving) -> None:
    """The OpenAI SDK snippet in README.md prints a completion through the gateway."""
    _, port, log, _ = make_serve
    code = readme_snippet("sdk").replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    result = subprocess.run(
        [str(VENV_BIN / "python"), "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr + _tail(log)
    assert result.stdout.strip()


ABANDONED_TOKENS = 4000
"""The page a client gives up on: it would end by itself in ~10 s on an idle core, ~35 s at the
~115 tokens/s of CI's busy cores (2026-12-05)."""


def test_a_client_that_gives_up_frees_the_engine(make_serve: Serving) -> None:
    """A client timing out mid-generation leaves vLLM running nothing: the engine stops the
    request rather than decode it to its end. (The test waits for the engines to run nothing,
    however long that takes on busy cores, then asks them how the request ended: a fixed
    second for it raced the abort through the gateway.)"""
    vllm_port, port, _, _ = make_serve
    body = {
        "model": "PaddleOCR-VL",
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": ABANDONED_TOKENS,
        "ignore_eos": True,
    }
    ports = (vllm_port, vllm_port + 1)
    with httpx.Client(timeout=5) as probe:

        def engines() -> list[str]:
            return [probe.get(f"http://127.0.0.1:{p}/metrics").text for p in ports]

        decoded = sum(map(decoded_to_the_end, engines()))
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=body,
                headers={"authorization": "Bearer sk-local"},
                timeout=httpx.Timeout(5, read=1.5),
            )
        # not stopped, the request would end by itself: 4,000 tokens at a sixth of the idle pace
        deadline = time.monotonic() + 120
        while sum(map(running_requests, texts := engines())) > 0:
            assert time.monotonic() < deadline, "vLLM kept running the abandoned request"
            time.sleep(0.05)
    assert sum(map(decoded_to_the_end, texts)) == decoded, "vLLM decoded the abandoned request"


def routing(port: int) -> list[str]:
    """The gateway's view of each engine it routes by (its `ocrvl_backend_*` gauges)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return [line for line in text.splitlines() if line.startswith("ocrvl_backend_")]


def sees_both_idle(view: list[str]) -> bool:
    """Both engines healthy, and none running, queueing or given anything, as last read."""
    idle = ("ocrvl_backend_in_flight", "ocrvl_backend_engine_running",
            "ocrvl_backend_engine_waiting")  # fmt: skip
    healthy = [line for line in view if line.startswith("ocrvl_backend_healthy")]
    busy = [line for line in view if line.startswith(idle) and float(line.split()[-1]) != 0]
    return len(healthy) == 2 and all(line.endswith(" 1.0") for line in healthy) and not busy


def test_two_engines_serve_through_one_gateway(make_serve: Serving) -> None:
    """Pages sent at once through the gateway are answered, and both engines served some.

    The gateway routes by what it last read of each engine (every second): the page the test
    before left on one engine steered all eight to the other until the next reading (9 to 0,
    here under load). So they go once it reads both idle."""
    vllm_port, port, log, _ = make_serve
    body = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}],
            "max_tokens": 16}  # fmt: skip
    deadline = time.monotonic() + 60
    while not sees_both_idle(view := routing(port)):
        assert time.monotonic() < deadline, "\n".join(view)
        time.sleep(0.05)

    def send(_: int) -> int:
        url, key = f"http://127.0.0.1:{port}/v1/chat/completions", "Bearer sk-local"
        return httpx.post(url, json=body, headers={"authorization": key}, timeout=120).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(send, range(8))) == [200] * 8, _tail(log)
    served = [metric(httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=5).text,
                     "vllm:request_success_total") for p in (vllm_port, vllm_port + 1)]  # fmt: skip
    last = "\n".join(routing(port))
    assert all(count > 0 for count in served), f"{served}\n{last}\n{_tail(log)}"
    assert sum(served) >= 8


PAGE_SECONDS = 10
"""How long the engine decodes the page in flight at the Ctrl-C, at the pace measured just
before it: the tiny model's pace varies tenfold with the load (~460 tokens/s idle here, ~115
on CI's busy cores, ~45 here under heavy load), so a page of fixed length either ended before
the Ctrl-C reached the engine (600 tokens, then 2,000: CI and here) or took 45 s of the 90 its
drain may (2,000 at ~45 tokens/s). Ten seconds outlast the way from the page's first event to
the engine by far (the test's Ctrl-C, serve.sh's SIGTERM: milliseconds), and the page comes back
well within the engine's `shutdown-timeout` (90 s) and STOP_GRACE_S (90), its stream included
(which trailed the engine: a page sized for 20 s took 35 to 53 s to stream, here under heavy
load)."""
MAX_PAGE_TOKENS = 4000  # the profile's max-model-len, 4,096, less the prompt's 23
MIN_PAGE_TOKENS = 1000
"""The least the page is: a pace read low (the cores busy for a moment, then free) once sized it
at 300 tokens, which the idle engine decodes in under a second, so it ended before the Ctrl-C
reached the engine (CI, 2026-12-06). 1,000 tokens take 2 s idle, 22 s at the slowest pace seen
(~45 tokens/s), well within the drain's 90 s. The pace is also the faster of two readings: a
page too long costs seconds, one too short fails."""


def decode_pace(port: int) -> float:
    """Tokens a second an engine decodes now, a whole answer's through the gateway (its prefill
    and the way there and back included: a little under the engine's own pace)."""
    body = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}],
            "max_tokens": 300, "ignore_eos": True}  # fmt: skip
    start = time.monotonic()
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                        headers={"authorization": "Bearer sk-local"}, timeout=120)  # fmt: skip
    assert answer.status_code == 200, answer.text
    tokens: int = answer.json()["usage"]["completion_tokens"]
    return tokens / (time.monotonic() - start)


class Tail:
    """What a file gains from now on (an engine's log), read at most every 20 ms."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.text, self.read_at = path, path.stat().st_size, b"", 0.0

    def has(self, needle: bytes) -> bool:
        if time.monotonic() - self.read_at >= 0.02:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                gained = file.read()
            self.text, self.offset = self.text + gained, self.offset + len(gained)
            self.read_at = time.monotonic()
        return needle in self.text


def test_ctrl_c_answers_the_page_in_flight_then_stops_everything(make_serve: Serving) -> None:
    """Ctrl-C while an engine decodes a page: the gateway and the engine both drain (the
    engine's `shutdown-timeout`, vllm_configs/cpu.yaml; vLLM's default aborts it), so the page
    comes back whole, 200, a second Ctrl-C meanwhile notwithstanding (serve.sh's stop goes on);
    the draining engine refuses a new request in the way the gateway reads as "stopping,
    nothing ran" (app/proxy.py moves such a page elsewhere); then every part is gone and make
    serve says it stopped. (Last in the module: it ends the module's make serve.)

    The page is streamed and read by the thread that presses Ctrl-C: its first event is the
    sign that an engine decodes it, and the Ctrl-C follows in the same breath. (Reading the
    engines' /metrics until one ran it came too late on loaded cores, and so did a reader
    thread's word to the main one: the page had ended before the Ctrl-C, CI and here.)"""
    vllm_port, port, log, process = make_serve
    # Ctrl-C must reach make serve as a terminal's does (tests/conftest.py): ignored, serve.sh
    # cannot trap it, and nothing stops (CI, 2026-12-05)
    assert signal.SIGINT not in ignored_signals(process.pid), _tail(log)
    ports = (vllm_port, vllm_port + 1)
    pace = max(decode_pace(port), decode_pace(port))
    page_tokens = max(MIN_PAGE_TOKENS, min(MAX_PAGE_TOKENS, round(pace * PAGE_SECONDS)))
    body = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}],
            "max_tokens": page_tokens, "ignore_eos": True}  # fmt: skip
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    engine_logs = {p: Tail(ROOT / f"logs/vllm-{p}.log") for p in ports}
    events: list[str] = []
    engine, refused = None, None
    with httpx.stream(
        "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=streamed,
        headers={"authorization": "Bearer sk-local"}, timeout=120,
    ) as answer:  # fmt: skip
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            if len(events) == 1:
                os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in the terminal
            if engine is None and (draining := [
                    p for p, tail in engine_logs.items()
                    if tail.has(b"draining in-flight requests count=1")]):  # fmt: skip
                [engine] = draining
                # a second Ctrl-C, impatient: the stop under way goes on (the page still drains)
                os.killpg(process.pid, signal.SIGINT)
                refused = httpx.post(
                    f"http://127.0.0.1:{engine}/v1/chat/completions",
                    json={**body, "model": "PaddleOCR-VL-1.5-0.9B", "max_tokens": 4},
                    headers={"authorization": f"Bearer {BACKEND}"}, timeout=30,
                )  # fmt: skip
    assert refused is not None, f"the page ({page_tokens} tokens) ended before it was drained"
    assert events[-1] == "[DONE]", events[-3:]
    ended = [json.loads(event) for event in events[:-1]]
    assert not [event for event in ended if "error" in event], events[-3:]
    [usage] = [event["usage"] for event in ended if event.get("usage")]  # asked for: once
    assert usage["completion_tokens"] == page_tokens, events[-3:]
    assert refused.status_code == 500, refused.text
    assert stopping(backend_error(refused.status_code, refused.content)), refused.text
    process.wait(timeout=90)
    deadline = time.monotonic() + 90  # make may end first (the second Ctrl-C); serve.sh says
    while b"make serve: stopped" not in log.read_bytes():  # it stopped once every part is gone
        assert time.monotonic() < deadline, _tail(log)
        time.sleep(0.05)
    for url in (f"http://127.0.0.1:{p}/health" for p in (port, *ports)):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=2)
    assert_stopped_cleanly(log)
