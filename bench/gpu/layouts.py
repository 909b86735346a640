"""Engine layouts per GPU, measured with the sweep: one engine (the profile as shipped) vs several.

    python3 -m bench.gpu.layouts prepare                       # full-size checkpoint, profile
    python3 -m bench.gpu.layouts run default,omp1 [--levels 1,32,64,128,256] [--duration 30]
    python3 -m bench.gpu.layouts run default-kv16,renderer8-kv16 --together   # one start, A/B
    python3 -m bench.gpu.layouts merge [LAYOUTS] --out DIR [--stem NAME] [--note TEXT]

bench/gpu/session.sh wraps these for the host, one stage per device call. Windows shorter than
a few latencies (12 s at c >= 128, where a page takes 5-17 s) read noise: keep 30 s there.

For the offline H200 host (../shared/gpu/README.md: vLLM 0.23.0 from /tmp/site; 0.32.0 with
GPU_VLLM_VERSION and bench/gpu/wheels_032.txt). `prepare` builds the full-size random PaddleOCR-VL
(tests/support/tiny_model.py --full) and writes the `h200-141gb` profile as shipped minus the keys
that vLLM lacks (its stored flag set says which). `run` starts each layout's engines one after
the other on a GPU (starting them together fails vLLM's memory profiling, unless the layout fixes
the KV: `kv_gib`; `gpu2-*` layouts start one per GPU at a time; `mps` layouts under one NVIDIA MPS
daemon; `resized` layouts send the pages already at the model's size,
`gateway-resized` ones have the gateway resize them (OCRVL_RESIZE_IMAGES=on);
`--together` starts every named layout at once, after checking they fit (`together_problems`),
sweeps them in turn and, with hey, loads them by hey in the reverse order), a real
`ocrvl serve` in front of them, and sweeps the gateway with pages of ~1,280 image tokens and 256
output tokens forced by ignore_eos; every engine's /metrics is sampled. Results go to
/tmp/gpu-results/<layout>.json (the host keeps /tmp between calls while it is held). `merge`
writes gpu-h200-<date>.{json,md,png}: the sweep table, ratios to the default layout, and per
layout the peak, its P99, the knee and what vLLM logged about memory.

With OCRVL_BENCH_HEY=PATH each layout is also loaded by hey (bench/gpu/hey_load.py) at
OCRVL_BENCH_HEY_C pages in flight for OCRVL_BENCH_HEY_S seconds through a fresh gateway, and
the layouts named in OCRVL_BENCH_HEY_DIRECT straight at their one engine too: a load generator
that uses every core, beside the sweep's one Python process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.gpu import hey_load

ROOT = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("GPU_BENCH_DIR", "/tmp/gpu-bench"))  # noqa: S108 (kept between calls)
RESULTS = Path(os.environ.get("GPU_RESULTS_DIR", "/tmp/gpu-results"))  # noqa: S108
MODEL_DIR = WORK / "paddleocr-vl-full"
PROFILE = ROOT / "vllm_configs" / "h200-141gb.yaml"
VLLM_VERSION = os.environ.get("GPU_VLLM_VERSION", "0.23.0")  # the host's (stored flag sets)
SERVED = "PaddleOCR-VL-1.5-0.9B"
KEY = "sk-gpu-bench"
# hey's binary: each layout is then also loaded by hey (bench/gpu/hey_load.py) at HEY_C pages in
# flight for HEY_S seconds after its sweep, the load generator's own limit ruled in or out
HEY = os.environ.get("OCRVL_BENCH_HEY")
HEY_C = int(os.environ.get("OCRVL_BENCH_HEY_C", "512"))
HEY_S = float(os.environ.get("OCRVL_BENCH_HEY_S", "60"))
# Layouts (comma-separated) whose one engine hey also loads directly, without the gateway, at
# the same concurrency: the gateway's own limit ruled in or out beside the load generator's
HEY_DIRECT = set(filter(None, os.environ.get("OCRVL_BENCH_HEY_DIRECT", "").split(",")))
LOGGED = {
    "kv_cache_tokens": re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens"),
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    "cuda_graphs_gib": re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([-\d.]+) GiB"),
}


@dataclass(frozen=True)
class Layout:
    """Engines per GPU (each with its memory share), API servers, max seqs, torch threads, GPUs."""

    engines: int  # per GPU
    share: float
    api_servers: int = 1
    max_num_seqs: int | None = None  # None: the profile's
    omp_threads: int | None = None  # OMP_NUM_THREADS of each engine; None: vLLM's own choice
    gpus: int = 1
    # --kv-cache-memory-bytes: KV fixed, vLLM's memory profiling skipped, so a GPU's engines can
    # start at once. The share then only sets vLLM's start-up check (free memory >= share x
    # total): at most 0.3 for layouts started together (four 16 GiB engines take ~80 GiB; a
    # 0.95 one-mps beside three-mps failed that check in the seventh pass)
    kv_gib: float | None = None
    mps: bool = False  # under NVIDIA MPS: engines share the GPU instead of taking turns
    renderer_workers: int | None = None  # --renderer-num-workers (vLLM's default: 1 thread)
    # The load, not the engines: every page sent already at the model's size (`ocrvl bench sweep
    # --resized`), so vLLM's API server decodes a smaller image and its resize changes nothing
    resized: bool = False
    # The product's way to the same pages: the gateway resizes them (OCRVL_RESIZE_IMAGES=on, on
    # its page workers), so its cost is in the measurement
    resize_in_gateway: bool = False


LAYOUTS = {
    "default": Layout(1, 0.95),  # h200-141gb as shipped
    "api4": Layout(1, 0.95, api_servers=4),
    "two": Layout(2, 0.45),
    "two-api2": Layout(2, 0.45, api_servers=2),
    "three": Layout(3, 0.30),
    "four": Layout(4, 0.22),
    # vLLM 0.23's engine keeps torch's intra-op pool at the core count; its OpenMP workers
    # spin after every small CPU op of the step loop (vLLM later pins serving to one thread).
    "omp1": Layout(1, 0.95, omp_threads=1),
    "two-omp1": Layout(2, 0.45, omp_threads=1),
    "three-omp1": Layout(3, 0.30, omp_threads=1),
    "four-omp1": Layout(4, 0.22, omp_threads=1),
    "gpu2": Layout(1, 0.95, gpus=2),
    "gpu2-omp1": Layout(1, 0.95, omp_threads=1, gpus=2),
    "gpu2-two-omp1": Layout(2, 0.45, omp_threads=1, gpus=2),
    "gpu2-three-omp1": Layout(3, 0.30, omp_threads=1, gpus=2),
    # Several engines under one MPS server (16 GiB of KV each: 932,064 tokens, over 3x what 384
    # pages in flight hold)
    "one-mps": Layout(1, 0.3, kv_gib=16, mps=True),  # the others' baseline under the same daemon
    "two-mps": Layout(2, 0.45, kv_gib=16, mps=True),
    "three-mps": Layout(3, 0.30, kv_gib=16, mps=True),
    "four-mps": Layout(4, 0.22, kv_gib=16, mps=True),
    "gpu2-two-mps": Layout(2, 0.45, kv_gib=16, mps=True, gpus=2),
    # vLLM's API server preprocesses images in one worker thread by default (renderer-num-
    # workers 1); side by side (`run --together`) with KV fixed so both start at once
    "default-kv16": Layout(1, 0.3, kv_gib=16),
    "renderer8-kv16": Layout(1, 0.3, kv_gib=16, renderer_workers=8),
    # API servers side by side with the default (`run --together`): PaddleOCR's genai_server
    # starts vLLM with 4 unless its config says otherwise
    "api2-kv16": Layout(1, 0.3, kv_gib=16, api_servers=2),
    "api4-kv16": Layout(1, 0.3, kv_gib=16, api_servers=4),
    # The API server's side: a second API server alone (graphs-api2, the encoder in CUDA graphs
    # beside two API servers, gave 1.20x), and pages that arrive at the model's size
    "api2": Layout(1, 0.95, api_servers=2),
    "resized": Layout(1, 0.95, resized=True),
    "api2-resized": Layout(1, 0.95, api_servers=2, resized=True),
    "gateway-resized": Layout(1, 0.95, resize_in_gateway=True),
    "api2-gateway-resized": Layout(1, 0.95, api_servers=2, resize_in_gateway=True),
    # The engine's own cap: 256 pages were running at c=384 and 512 in every one-engine layout
    # while KV stayed near 5 %, so the same layouts with room for 512 (the gateway is told, see
    # `backends`: it held the sixth pass's seqs512 run to 256)
    "seqs512": Layout(1, 0.95, max_num_seqs=512),
    "api2-seqs512": Layout(1, 0.95, api_servers=2, max_num_seqs=512),
    "api2-resized-seqs512": Layout(1, 0.95, api_servers=2, max_num_seqs=512, resized=True),
    "api2-gateway-resized-seqs512": Layout(
        1, 0.95, api_servers=2, max_num_seqs=512, resize_in_gateway=True
    ),
}
# One H200 as vLLM counts it ("Free memory on device cuda:0 (131.1/139.8 GiB)"), and what an
# engine holds beside a fixed KV: weights 1.82 GiB, CUDA graphs, activations (the seventh pass:
# three engines of 16 GiB KV under MPS held 57.8 GiB at most)
GPU_GIB = 139.8
ENGINE_OVERHEAD_GIB = 3.5


def profile_for(version: str) -> dict[str, Any]:
    """The shipped profile without the keys `version`'s stored flag set refuses."""
    from app.profiles import flagsets  # noqa: PLC0415

    config = yaml.safe_load(PROFILE.read_text())
    refused = {
        key for key, _ in flagsets.problems(config, flagsets.load(version)["flags"], version)
    }
    return {key: value for key, value in config.items() if key not in refused}


def prepare(vllm: list[str]) -> int:
    """Build the checkpoint (unless there) and write the profile vLLM 0.23 accepts."""
    WORK.mkdir(parents=True, exist_ok=True)
    if not (MODEL_DIR / "config.json").exists():
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "tests.support.tiny_model", str(MODEL_DIR), "--full"],
            check=True, cwd=ROOT,
        )  # fmt: skip
        print(f"checkpoint built in {time.monotonic() - started:.0f} s", flush=True)
    config = profile_for(VLLM_VERSION)
    dropped = sorted(set(yaml.safe_load(PROFILE.read_text())) - set(config))
    (WORK / "profile.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"profile for vLLM {VLLM_VERSION}: {config}; dropped {dropped}", flush=True)
    return 0


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"{log.name}: exited with {process.returncode}\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"{url} not up after {timeout:.0f} s")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _profile(name: str, layout: Layout) -> Path:
    """The layout's engine config: the profile with its share, seqs, KV and renderer workers."""
    config = yaml.safe_load((WORK / "profile.yaml").read_text())
    config["gpu-memory-utilization"] = layout.share
    if layout.max_num_seqs:
        config["max-num-seqs"] = layout.max_num_seqs
    if layout.kv_gib:
        config["kv-cache-memory-bytes"] = int(layout.kv_gib * 2**30)
    if layout.renderer_workers:
        config["renderer-num-workers"] = layout.renderer_workers
    profile = WORK / f"profile-{name}.yaml"
    profile.write_text(yaml.safe_dump(config, sort_keys=False))
    return profile


Launched = list[tuple[str, Path, subprocess.Popen[bytes]]]


def launch(name: str, layout: Layout, vllm: list[str], indices: Iterable[int]) -> Launched:
    """Start engines `indices` of the layout on each of its GPUs; (URL, log, process) each."""
    profile = _profile(name, layout)
    wave: Launched = []
    for gpu, index in ((g, i) for g in range(layout.gpus) for i in indices):
        port, log = _free_port(), WORK / f"vllm-{name}-{gpu}-{index}.log"
        command = [*vllm, "serve", str(MODEL_DIR), "--config", str(profile),
                   "--host", "127.0.0.1", "--port", str(port), "--served-model-name",
                   SERVED, "--api-server-count", str(layout.api_servers)]  # fmt: skip
        environment = _environment(layout, gpu)
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=environment,
                start_new_session=True,
            )  # fmt: skip
        wave.append((f"http://127.0.0.1:{port}", log, process))
    return wave


def _environment(layout: Layout, gpu: int) -> dict[str, str]:
    """An engine's environment: its GPU, MPS, torch threads."""
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    if layout.mps:
        environment |= _mps_environment()
    if layout.omp_threads:
        environment["OMP_NUM_THREADS"] = str(layout.omp_threads)
    return environment


def healthy(wave: Launched, label: str) -> list[tuple[str, Path]]:
    """Wait until every engine of `wave` answers /health; (URL, log) of each."""
    began = time.monotonic()
    for url, log, process in wave:
        _wait(f"{url}/health", process, log, 420)
    print(f"{label}: {len(wave)} engine(s) healthy after {time.monotonic() - began:.0f} s",
          flush=True)  # fmt: skip
    return [(url, log) for url, log, _ in wave]


@contextlib.contextmanager
def engines(name: str, layout: Layout, vllm: list[str]) -> Iterator[list[tuple[str, Path]]]:
    """Start the layout's engines; (URL, log) of each, stopped at the end.

    One engine per GPU at a time, the GPUs in parallel: engines sharing a GPU must not profile
    its memory at the same time, unless their KV is fixed (`kv_gib`)."""
    waves = [range(layout.engines)] if layout.kv_gib else [[i] for i in range(layout.engines)]
    processes: list[subprocess.Popen[bytes]] = []
    started: list[tuple[str, Path]] = []
    try:
        for number, indices in enumerate(waves):
            wave = launch(name, layout, vllm, indices)
            processes += [process for _, _, process in wave]
            started += healthy(wave, f"{name} wave {number}")
        yield started
    finally:
        _stop(processes)


def _mps_environment() -> dict[str, str]:
    """Where the MPS daemon and its clients (the engines) meet."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(WORK / "mps" / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(WORK / "mps" / "log")}  # fmt: skip


@contextlib.contextmanager
def mps(enabled: bool) -> Iterator[None]:
    """An NVIDIA MPS control daemon for the block (`launch` points MPS layouts' engines at it)."""
    if not enabled:
        yield
        return
    environment = {**os.environ, **_mps_environment()}
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(environment[key]).mkdir(parents=True, exist_ok=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], check=True, env=environment)
    try:
        yield
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", check=False, env=environment)
        time.sleep(2)


@contextlib.contextmanager
def gateway(backends: list[str], resize_images: bool = False) -> Iterator[str]:
    """A real `ocrvl serve` (one worker, production defaults) in front of `backends`."""
    port, log = _free_port(), WORK / "gateway.log"
    environment = {
        **os.environ,
        "OCRVL_BACKENDS": ",".join(backends),
        "OCRVL_API_KEYS": KEY,
        "OCRVL_LOG_LEVEL": "warning",
        "OCRVL_RESIZE_IMAGES": "on" if resize_images else "off",
        "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)])),
    }
    command = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    try:
        _wait(f"http://127.0.0.1:{port}/ready", process, log, 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop([process])


@contextlib.contextmanager
def gpu_sampler(path: Path) -> Iterator[None]:
    """nvidia-smi's utilisation and memory once a second into `path`, while the block runs."""
    query = "--query-gpu=index,utilization.gpu,memory.used"
    command = ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "1000"]
    try:
        with path.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL)
    except FileNotFoundError:
        yield
        return
    try:
        yield
    finally:
        process.terminate()
        process.wait()


def _gpu_summary(path: Path) -> dict[str, float] | None:
    rows = [line.split(",") for line in path.read_text().splitlines() if line.count(",") == 2]
    utilisation = [float(r[1]) for r in rows if r[1].strip().isdigit()]
    memory = [float(r[2]) for r in rows if r[2].strip().isdigit()]
    if not utilisation:
        return None
    return {
        "samples": len(utilisation),
        "utilization_avg_pct": sum(utilisation) / len(utilisation),
        "utilization_max_pct": max(utilisation),
        "memory_used_max_mib": max(memory) if memory else 0.0,
    }


def logged(log: Path) -> dict[str, float]:
    """What vLLM logged about memory: KV tokens, weights and CUDA graphs."""
    text = log.read_text(errors="replace")
    found: dict[str, float] = {}
    for key, pattern in LOGGED.items():
        match = pattern.search(text)
        if match:
            found[key] = float(match[1].replace(",", ""))
    return found


def backends(urls: Iterable[str], layout: Layout) -> list[str]:
    """The gateway's OCRVL_BACKENDS entries. A layout that sets max-num-seqs says so with
    `;capacity=N`: vLLM 0.32 does not expose max-num-seqs, so the gateway would otherwise hold
    each engine to the 256 every profile stays within (the sixth pass's `*-seqs512` layouts
    ran so: 256 running at most, the engine's 512 never reached)."""
    suffix = f";capacity={layout.max_num_seqs}" if layout.max_num_seqs else ""
    return [f"{url}{suffix}" for url in urls]


def _hey_body() -> Path:
    """The sweep's body (256 tokens, ignore_eos) around the corpus's first page, for hey."""
    from app.bench.corpus import synthetic  # noqa: PLC0415
    from app.bench.load import Shape  # noqa: PLC0415

    body = WORK / "hey-body.json"
    body.write_bytes(Shape(max_tokens=256, ignore_eos=True).body(synthetic(1)[0], SERVED))
    return body


def sweep_layout(
    name: str, layout: Layout, started: list[tuple[str, Path]], sweep: Any
) -> dict[str, Any]:
    """Sweep the gateway in front of `started`; the report, also in RESULTS/<name>.json (written
    at once, so a call cut short keeps it)."""
    began = time.monotonic()
    with gateway(backends((u for u, _ in started), layout), layout.resize_in_gateway) as gw:
        samples = WORK / f"gpu-{name}.csv"
        with gpu_sampler(samples):
            report = sweep(gw, name, [f"{u}/metrics" for u, _ in started])
    report["layout"] = asdict(layout) | {
        "name": name,
        "engines_logged": [logged(log) for _, log in started],
        "gpu": _gpu_summary(samples),
        "seconds": time.monotonic() - began,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def hey_layout(
    name: str, layout: Layout, started: list[tuple[str, Path]], report: dict[str, Any]
) -> None:
    """hey at HEY_C for HEY_S through a gateway in front of `started` (and, for a layout named
    in HEY_DIRECT with one engine, straight at that engine); added to the layout's sweep
    `report` and RESULTS/<name>.json."""
    assert HEY is not None  # noqa: S101 (only called with OCRVL_BENCH_HEY set)
    body = _hey_body()
    with gateway(backends((u for u, _ in started), layout), layout.resize_in_gateway) as gw:
        report["hey"] = hey_load.run(HEY, gw, KEY, body, concurrency=HEY_C, duration=HEY_S)
    print(f"{name} hey c={HEY_C}: {report['hey']['pages_per_s']:.2f} pages/s", flush=True)
    if name in HEY_DIRECT and len(started) == 1:
        direct = hey_load.run(HEY, started[0][0], KEY, body, concurrency=HEY_C, duration=HEY_S)
        report["hey_direct"] = direct
        print(f"{name} hey direct c={HEY_C}: {direct['pages_per_s']:.2f} pages/s", flush=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")


def measure(name: str, layout: Layout, started: list[tuple[str, Path]], sweep: Any) -> None:
    """The sweep, then hey when OCRVL_BENCH_HEY names it."""
    report = sweep_layout(name, layout, started, sweep)
    if HEY:
        hey_layout(name, layout, started, report)


def run(
    names: list[str],
    vllm: list[str],
    levels: list[int],
    duration: float,
    corpus: int = 4000,
    *,
    together: bool = False,
) -> int:
    """Sweep each named layout through the gateway; one JSON per layout in RESULTS.

    `together`: every layout's engines start at once (all need a fixed KV) and stay up; the
    layouts are then swept one after the other, the others idle."""
    from app.bench.load import Shape  # noqa: PLC0415
    from app.bench.sweep import Config, main  # noqa: PLC0415

    def sweep(gateway_url: str, name: str, metrics: list[str]) -> dict[str, Any]:
        return main(
            Config(
                urls=[gateway_url], keys=[KEY], labels=[name], levels=levels,
                duration=duration, corpus=corpus, resized=LAYOUTS[name].resized,
                shape=Shape(max_tokens=256, ignore_eos=True),
                metrics_urls=metrics, max_error_rate=0.05, out=RESULTS, name=name,
                plot=False, command=f"python3 -m bench.gpu.layouts run {name}",
            )
        )  # fmt: skip

    RESULTS.mkdir(parents=True, exist_ok=True)
    if together:
        if problems := together_problems(names):
            print("not started together:\n  " + "\n  ".join(problems), flush=True)
            return 2
        with mps(any(LAYOUTS[name].mps for name in names)):
            return _run_together(names, vllm, sweep)
    for name in names:
        layout = LAYOUTS[name]
        try:
            with mps(layout.mps), engines(name, layout, vllm) as started:
                measure(name, layout, started, sweep)
        except RuntimeError as exc:
            print(f"layout {name} failed: {exc}", flush=True)
            (RESULTS / f"{name}.failed.txt").write_text(str(exc))
    return 0


def together_problems(names: list[str]) -> list[str]:
    """Why the layouts' engines could not all start at once on one GPU, if they could not.

    Each needs a fixed KV (no memory profiling), and vLLM refuses to start an engine unless the
    GPU has `share` of its memory free at that moment: the engine starting last sees what every
    other one already holds (its KV and ENGINE_OVERHEAD_GIB)."""
    problems = [f"{name}: no fixed KV (kv_gib)" for name in names if not LAYOUTS[name].kv_gib]
    if problems:
        return problems
    held = {name: (LAYOUTS[name].kv_gib or 0.0) + ENGINE_OVERHEAD_GIB for name in names}
    every = sum(held[name] * LAYOUTS[name].engines for name in names)
    for name in names:  # a layout's engines are alike: check its one that starts last
        share, free = LAYOUTS[name].share, GPU_GIB - (every - held[name])
        if share * GPU_GIB > free:
            problems.append(
                f"{name}: share {share} asks for {share * GPU_GIB:.1f} GiB free "
                f"at start, {free:.1f} GiB are left once the others hold theirs"
            )
    return problems


def _run_together(names: list[str], vllm: list[str], sweep: Any) -> int:
    """Every named layout's engines up at once, then each swept while the others idle, then
    (with hey) each loaded by hey in the reverse order: A B B A, so drift falls on both."""
    waves = {name: launch(name, LAYOUTS[name], vllm, range(LAYOUTS[name].engines))
             for name in names}  # fmt: skip
    try:
        ready = {name: healthy(wave, name) for name, wave in waves.items()}
        reports = {name: sweep_layout(name, LAYOUTS[name], ready[name], sweep) for name in names}
        for name in reversed(names if HEY else []):
            hey_layout(name, LAYOUTS[name], ready[name], reports[name])
    finally:
        _stop([process for wave in waves.values() for _, _, process in wave])
    return 0


def _knee(levels: list[dict[str, Any]]) -> int | None:
    """The lowest concurrency whose pages/s is within 10 % of the layout's peak."""
    peak = max((level["pages_per_s"] for level in levels), default=0.0)
    return next((lv["concurrency"] for lv in levels if lv["pages_per_s"] >= 0.9 * peak), None)


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Per layout: peak pages/s and where, P99 there, the knee per engine, logged memory."""
    levels = [entry["targets"][report["layout"]["name"]] for entry in report["levels"]]
    best = max(levels, key=lambda level: level["pages_per_s"])
    knee = _knee(levels)
    layout = report["layout"]
    gpus = layout.get("gpus", 1)  # runs before two-GPU layouts existed have no such key
    engines = layout["engines"] * gpus
    return {
        "layout": layout["name"],
        "engines": engines,
        "gpus": gpus,
        "omp_threads": layout.get("omp_threads"),
        "mps": layout.get("mps", False),
        # the fifth pass's encoder CUDA-graphs layouts (their plugin left after 376274d)
        "encoder_graphs": layout.get("encoder_graphs", False),
        "resized": layout.get("resized", False),
        "resize_in_gateway": layout.get("resize_in_gateway", False),
        "memory_share": layout["share"],
        "api_servers": layout["api_servers"],
        "max_num_seqs": layout.get("max_num_seqs"),  # None: the profile's
        "peak_pages_per_s": best["pages_per_s"],
        "peak_at": best["concurrency"],
        "p99_at_peak_s": (best["latency_s"] or {}).get("p99"),
        "knee_concurrency": knee,
        "knee_per_engine": knee / engines if knee else None,
        **_at_knee(levels, knee),
        "engines_logged": layout["engines_logged"],
        "gpu": layout["gpu"],
        "hey": report.get("hey"),  # the same gateway loaded by hey, when the run asked for it
        "hey_direct": report.get("hey_direct"),  # hey at the one engine, without the gateway
    }


def _at_knee(levels: list[dict[str, Any]], knee: int | None) -> dict[str, float | None]:
    """p50 and p99 latency at the knee's level."""
    at = next((lv for lv in levels if lv["concurrency"] == knee), None)
    latency = (at or {}).get("latency_s") or {}
    return {"p50_at_knee_s": latency.get("p50"), "p99_at_knee_s": latency.get("p99")}


def merge(
    out: Path, names: list[str] | None, stem: str | None = None, note: str = "",
    floor_json: Path | None = None,
) -> int:  # fmt: skip
    """One report, plot and table of every layout in RESULTS (default layout first), against
    the floor of the same call (`floor_json`, default RESULTS/floor.json) where there is one."""
    from app.bench import report as reporting  # noqa: PLC0415
    from app.bench.plot import plot  # noqa: PLC0415
    from bench.gpu import floor_report as floor  # noqa: PLC0415

    found = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    order = [n for n in (names or LAYOUTS) if n in found]
    if not order:
        print(f"no layout results in {RESULTS}", file=sys.stderr)
        return 1
    first = found[order[0]]
    merged: dict[str, Any] = {
        **{k: first[k] for k in ("tool", "date", "settings", "machine")},
        "command": "python3 -m bench.gpu.layouts run " + ",".join(order) + " (then merge)",
        "notes": "Layouts ran one after the other on the same GPU (not interleaved); each "
        "row is the gateway in front of that layout's engines." + (f" {note}" if note else ""),
        "targets": [found[n]["targets"][0] | {"label": n} for n in order],
        "levels": [],
        "stopped": next((found[n]["stopped"] for n in order if found[n]["stopped"]), None),
        "interleaved": False,
        "vllm": {
            "version": VLLM_VERSION,
            "profile": f"{PROFILE.relative_to(ROOT)} minus what vLLM {VLLM_VERSION} lacks",
            "flags": profile_for(VLLM_VERSION),
            "per_layout": (
                "gpu-memory-utilization = share, --api-server-count = API servers, "
                "--max-num-seqs = max seqs"
            ),
            "checkpoint": "python -m tests.support.tiny_model DIR --full (random weights)",
        },
        "layouts": [summary(found[n]) for n in order],
        "load_generator": first["load_generator"],
    }
    floor.attach(merged, floor_json or RESULTS / "floor.json")
    every = {level["concurrency"] for name in order for level in found[name]["levels"]}
    for concurrency in sorted(every):  # layouts may have swept different levels
        entry: dict[str, Any] = {"concurrency": concurrency, "order": [], "targets": {}}
        for name in order:
            for level in found[name]["levels"]:
                if level["concurrency"] == concurrency:
                    entry["targets"][name] = level["targets"][name]
                    entry["order"].append(name)
        if entry["targets"]:
            from app.bench.sweep import _ratios  # noqa: PLC0415

            entry["ratios"] = _ratios(entry, order)
            merged["levels"].append(entry)
    stem = stem or f"gpu-h200-{first['date'][:10]}"
    out.mkdir(parents=True, exist_ok=True)
    plot(merged, out / f"{stem}.png")
    merged["plot"] = f"{stem}.png"
    reporting.write(merged, out, stem)
    with (out / f"{stem}.md").open("a") as md:
        md.write("\n" + layouts_table(merged["layouts"]) + "\n")
        if "floor" in merged:
            md.write("\n" + floor.against_table(merged) + "\n")
        scaling = gpus_table(merged["layouts"])
        if scaling:
            md.write("\n" + scaling + "\n")
        flags = " ".join(f"--{k} {v}" for k, v in merged["vllm"]["flags"].items())
        md.write(f"\nvLLM {VLLM_VERSION}, each engine: `vllm serve <full-size checkpoint> {flags}`"
                 f" with {merged['vllm']['per_layout']}.\n")  # fmt: skip
    print((out / f"{stem}.md").read_text())
    return 0


def layouts_table(rows: list[dict[str, Any]]) -> str:
    """Per layout: peak, its P99, the knee and vLLM's logged memory figures."""
    from app.bench.report import table  # noqa: PLC0415

    base = rows[0]["peak_pages_per_s"] or 1.0
    hey_base = (rows[0].get("hey") or {}).get("pages_per_s") or None
    header = ["target", "GPUs", "engines", "share", "API servers", "max seqs", "torch threads",
              "MPS", "encoder graphs", "pages sent", "peak pages/s", "x default",
              "at c", "p99 at peak s", "knee c", "knee per engine", "KV tokens (each)",
              "weights GiB", "graphs GiB", "GPU util avg/max %", "hey pages/s at c",
              "hey x default", "hey direct pages/s"]  # fmt: skip
    body = []
    for r in rows:
        logged_ = r["engines_logged"][0] if r["engines_logged"] else {}
        gpu = r["gpu"] or {}
        body.append([
            r["layout"], str(r["gpus"]), str(r["engines"]), f"{r['memory_share']:.2f}",
            str(r["api_servers"]), str(r.get("max_num_seqs") or "profile's"),
            str(r["omp_threads"] or "vLLM's"),
            "yes" if r["mps"] else "", "yes" if r["encoder_graphs"] else "",
            "resized" if r.get("resized") else
            "gateway resizes" if r.get("resize_in_gateway") else "as drawn",
            f"{r['peak_pages_per_s']:.2f}", f"{r['peak_pages_per_s'] / base:.2f}",
            str(r["peak_at"]), f"{r['p99_at_peak_s']:.2f}" if r["p99_at_peak_s"] else "",
            str(r["knee_concurrency"]),
            f"{r['knee_per_engine']:.0f}" if r["knee_per_engine"] else "",
            f"{logged_.get('kv_cache_tokens', 0):,.0f}", str(logged_.get("weights_gib", "")),
            str(logged_.get("cuda_graphs_gib", "")),
            f"{gpu.get('utilization_avg_pct', 0):.0f}/{gpu.get('utilization_max_pct', 0):.0f}",
            f"{hey['pages_per_s']:.2f} at {hey['concurrency']}" if (hey := r.get("hey")) else "",
            f"{hey['pages_per_s'] / hey_base:.2f}" if hey and hey_base else "",
            f"{direct['pages_per_s']:.2f}" if (direct := r.get("hey_direct")) else "",
        ])  # fmt: skip
    return "Layouts (peak over the levels; knee: lowest level within 10 % of the peak):\n\n" + (
        table(header, body)
    )


def gpus_table(rows: list[dict[str, Any]]) -> str:
    """Two GPUs against one at the same layout (`gpu2-X` beside `X`, `gpu2` beside `default`)."""
    from app.bench.report import table  # noqa: PLC0415

    by_name = {r["layout"]: r for r in rows}
    body = []
    for name, row in by_name.items():
        if not name.startswith("gpu2"):
            continue
        single = by_name.get(name.removeprefix("gpu2").removeprefix("-") or "default")
        if single is None:
            continue
        body.append([
            name, single["layout"], f"{row['peak_pages_per_s']:.2f}",
            f"{single['peak_pages_per_s']:.2f}",
            f"{row['peak_pages_per_s'] / (single['peak_pages_per_s'] or 1.0):.2f}",
            f"{row['p99_at_peak_s']:.2f}" if row["p99_at_peak_s"] else "",
            f"{single['p99_at_peak_s']:.2f}" if single["p99_at_peak_s"] else "",
        ])  # fmt: skip
    if not body:
        return ""
    header = ["two GPUs", "one GPU", "peak pages/s (2)", "peak pages/s (1)", "ratio",
              "p99 at peak s (2)", "p99 at peak s (1)"]  # fmt: skip
    return "Two GPUs against one at the same layout (peaks):\n\n" + table(header, body)


def main_cli(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.layouts")
    parser.add_argument("action", choices=("prepare", "run", "merge"))
    parser.add_argument(
        "layouts", nargs="?", default="", help="comma-separated: " + ", ".join(LAYOUTS)
    )
    parser.add_argument("--vllm", default=f"{sys.executable} -m vllm.entrypoints.cli.main",
                        help="how to call vLLM's CLI")  # fmt: skip
    parser.add_argument("--levels", default="1,8,32,64,128,256")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per level")
    parser.add_argument("--corpus", type=int, default=4000,
                        help="distinct pages; a level that runs out ends early")  # fmt: skip
    parser.add_argument(
        "--together", action="store_true", help="all engines up at once (fixed KV), swept in turn"
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    parser.add_argument("--stem", help="report file name (default: gpu-h200-<date of the run>)")
    parser.add_argument("--note", default="", help="a sentence for the report's notes")
    parser.add_argument("--floor", type=Path, help="floor.json (default: RESULTS/floor.json)")
    args = parser.parse_args(argv)
    vllm = shlex.split(args.vllm)
    names = [n for n in args.layouts.split(",") if n]
    if args.action == "prepare":
        return prepare(vllm)
    if args.action == "run":
        levels = [int(c) for c in args.levels.split(",")]
        return run(names, vllm, levels, args.duration, args.corpus, together=args.together)
    return merge(args.out, names or None, args.stem, args.note, args.floor)


if __name__ == "__main__":
    sys.exit(main_cli())
