"""`make serve MODEL=tiny ENGINES=2` as README gives it (with two engines): vLLM + gateway, the
README snippet, each engine's output in its own log, both engines serving behind one gateway,
Ctrl-C stopping all cleanly once the page in flight is answered."""

from __future__ import annotations

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
    engine_environment,
    running_requests,
    wait_until_up,
)
from tests.support.prometheus import metric
from tests.support.servers import free_port, free_ports

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


def test_a_client_that_gives_up_frees_the_engine(make_serve: Serving) -> None:
    """A client timing out mid-generation leaves vLLM running nothing."""
    vllm_port, port, _, _ = make_serve
    body = {
        "model": "PaddleOCR-VL",
        "messages": [{"role": "user", "content": "OCR:"}],
        "max_tokens": 4000,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"authorization": "Bearer sk-local"},
            timeout=httpx.Timeout(5, read=1.5),
        )
    deadline = time.monotonic() + 1.0
    while True:
        running = [
            running_requests(httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=5).text)
            for p in (vllm_port, vllm_port + 1)
        ]
        if running == [0, 0]:
            break
        assert time.monotonic() < deadline, "vLLM kept running the abandoned request"
        time.sleep(0.05)


def test_two_engines_serve_through_one_gateway(make_serve: Serving) -> None:
    """Pages sent at once through the gateway are answered, and both engines served some."""
    vllm_port, port, log, _ = make_serve
    body = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}],
            "max_tokens": 16}  # fmt: skip

    def send(_: int) -> int:
        url, key = f"http://127.0.0.1:{port}/v1/chat/completions", "Bearer sk-local"
        return httpx.post(url, json=body, headers={"authorization": key}, timeout=120).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(send, range(8))) == [200] * 8, _tail(log)
    served = [metric(httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=5).text,
                     "vllm:request_success_total") for p in (vllm_port, vllm_port + 1)]  # fmt: skip
    assert all(count > 0 for count in served), served
    assert sum(served) >= 8


PAGE_TOKENS = 2000
"""The page in flight at the Ctrl-C: long enough that it is still decoding once the test has
seen it at an engine and sent the signal. The tiny model decodes ~300 tokens/s on an idle core,
so 600 lasted ~2 s, and on CI's busy cores two reads of the engines' /metrics took longer: the
page had ended before the test saw it running. 2,000 last ~7 s idle; well under the engine's
`shutdown-timeout` (90 s) and STOP_GRACE_S (90) even at a sixth of that pace."""


def test_ctrl_c_answers_the_page_in_flight_then_stops_everything(make_serve: Serving) -> None:
    """Ctrl-C while an engine decodes a page: the gateway and the engine both drain (the
    engine's `shutdown-timeout`, vllm_configs/cpu.yaml; vLLM's default aborts it), so the page
    comes back whole, 200, a second Ctrl-C meanwhile notwithstanding (serve.sh's stop goes on);
    the draining engine refuses a new request in the way the gateway reads as "stopping,
    nothing ran" (app/proxy.py moves such a page elsewhere); then every part is gone and make
    serve says it stopped. (Last in the module: it ends the module's make serve.)"""
    vllm_port, port, log, process = make_serve
    ports = (vllm_port, vllm_port + 1)
    body = {"model": "PaddleOCR-VL", "messages": [{"role": "user", "content": "OCR:"}],
            "max_tokens": PAGE_TOKENS, "ignore_eos": True}  # fmt: skip
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=5) as probe:
        answer = pool.submit(
            httpx.post, f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
            headers={"authorization": "Bearer sk-local"}, timeout=120,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not (busy := [p for p in ports if running_requests(
                probe.get(f"http://127.0.0.1:{p}/metrics").text) > 0]):  # fmt: skip
            assert not answer.done(), answer.result().text
            assert time.monotonic() < deadline, "the page never reached an engine"
            time.sleep(0.02)
        [engine] = busy
        engine_log = ROOT / f"logs/vllm-{engine}.log"
        before = engine_log.stat().st_size
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in the terminal
        while b"draining in-flight requests count=1" not in engine_log.read_bytes()[before:]:
            assert not answer.done(), "the page ended before the engine said it drains it"
            assert time.monotonic() < deadline + 30, "the engine never said it drains the page"
            time.sleep(0.02)
        # a second Ctrl-C, impatient: the stop under way goes on (the page still drains)
        os.killpg(process.pid, signal.SIGINT)
        refused = httpx.post(
            f"http://127.0.0.1:{engine}/v1/chat/completions",
            json={**body, "model": "PaddleOCR-VL-1.5-0.9B", "max_tokens": 4},
            headers={"authorization": f"Bearer {BACKEND}"}, timeout=30,
        )  # fmt: skip
        response = answer.result()
    assert response.status_code == 200, response.text + _tail(log)
    assert response.json()["usage"]["completion_tokens"] == PAGE_TOKENS
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
