"""A method-2 pass from its plan: `python3 -m bench.gpu.run PLAN.json --call N` (or STAGE ...).

A plan (bench/gpu/plans/*.json, data; bench/gpu/README.md says what each key means) names the
host, the corpus, the window rules, the variants and the device calls, each a list of stages:

    receive K     wheel part K (carried as .gpu-wheels-032s/chunkK)
    install       vLLM 0.32, the plugin and the layout service into /tmp/site032 (host/install.sh),
                  the gateway's wheels (.whl) beside them, VLLM_BIN `WRAPPER` (BENCH_VLLM_ARGS*)
    install-layout the layout service alone on the host's own torch (no vLLM, no wheel parts),
                  its web stack and the load client in .whl (bench/gpu/wheels_layout.txt)
    prepare       the full-size random-weight checkpoints the host names (`model`, `layout_model`),
                  written in the background: every stage but `floor` waits for them
    floor         the corpus's requests (bench.gpu.corpus work) and each variant's floor (bench.
                  gpu.floor: `whole` layout off, `blocks` on), GPU idle, its clocks in floor.gpu.csv
    up, ready     `make serve`'s scripts/serve.sh with the plan's profile, the layout service on;
                  once ready, the stand-in layout service (bench.gpu.layout_standin: the corpus's
                  boxes, each page forwarded to the real service first) and a second gateway in
                  front of the same engines whose layout service is that stand-in (and one more
                  for each variant that names an `env`, with those settings)
    window I      the I-th window of the variants' A B B A ... order (bench.gpu.load; with the
                  call's next `window I+1` of the same variant, one load), the /metrics and every
                  process's CPU seconds around it (NN-VARIANT.cpu.json), the GPU's clocks beside
                  it (.gpu.csv): fails (the call stops) when the engines did not read it (reads.py)
    vit           the vision tower's attention (issue 50 item 3): bench.gpu.encoder_check, the
                  plan's `vit` options, timed and checked on the idle GPU: RES/vit-attention.json
    spy           past the windows, py-spy's samples of the `spy.variant` load's processes (`up`'s,
                  the layout variant's gateway, stand-in) for `spy.seconds`: RES/spy-VARIANT.*
    alone I       the I-th window of the layout service alone (/v1/layout) in its settings'
                  A B B A order (`alone.services`, each on its own port from the first on), its
                  /metrics before and after and `top -H` of its threads beside it
    report        RES's windows, floors and the layout service's into OUT/STEM.json (issue 50's
                  summary, bench.gpu.method.summary) and OUT/STEM.md
    down          everything `up` and `alone` started, by process group

After every stage the results so far and every log go to OUT/STEM-raw.tar.gz, so a call cut
short returns what it measured; a window that cannot end before the call's `limit_s` is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.gpu import WORK, method, reads

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-gpu-bench"
BACKEND_KEY = "sk-backend-pass"


def gone(pid: int) -> bool:
    """Whether `pid` ended: no such process, or a zombie (a child not waited for yet, which
    `kill(pid, 0)` and /proc still find: `ready` waited out its deadline on an exited one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class Pass:
    """A plan, where its results go, and the call's clock."""

    def __init__(self, plan: dict[str, Any], out: Path) -> None:
        self.plan, self.out = plan, out
        self.host = plan["host"]
        self.res = Path(self.host.get("results", "/tmp/gpu-results")) / plan["stem"]  # noqa: S108
        self.began = time.monotonic()
        self.ports = {name: self.host["ports"] + port for name, port in
                      {"engine": 8118, "gateway": 8000, "layout": 8300, "standin": 8320,
                       "layout_gateway": 8020}.items()}  # fmt: skip
        self.res.mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        """Seconds this call has before its limit."""
        return self.plan["limit_s"] - (time.monotonic() - self.began)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def path(self, text: str) -> str:
        return text.replace("{work}", str(WORK))

    def run(self, command: list[str], **env: str) -> int:
        """A command in the checkout, its output in this call's log; its exit status."""
        print("$", " ".join(command), flush=True)
        return subprocess.run(command, cwd=ROOT, env=os.environ | env, check=False).returncode

    def start(self, name: str, command: list[str], **env: str) -> None:
        """A process group of its own (it outlives the call while the host is held); its pid in
        WORK/NAME.pid, its output in WORK/NAME.log."""
        WORK.mkdir(parents=True, exist_ok=True)
        with (WORK / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(command, cwd=ROOT, env=os.environ | env, stdout=log,
                                       stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip
        (WORK / f"{name}.pid").write_text(str(process.pid))
        print(f"up: {name} (pid {process.pid})", flush=True)

    def wait_ready(self, name: str, url: str, seconds: float) -> None:
        """Until `url` answers 200 (a start takes minutes: a look every 2 s is the harness's
        pace, not a test's); RuntimeError with the log's tail if the process ended first."""
        pid = int((WORK / f"{name}.pid").read_text())
        began = time.monotonic()
        deadline = began + min(seconds, self.left() - 10)
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2):  # noqa: S310 (loopback)
                    print(f"ready: {name} (waited {time.monotonic() - began:.0f} s)", flush=True)
                    return
            except OSError:
                pass
            if gone(pid):
                break
            time.sleep(2)
        tail = (WORK / f"{name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name} did not come up at {url}:\n{tail}")

    def collect(self) -> None:
        """Results and logs so far into OUT/STEM-raw.tar.gz."""
        with tarfile.open(self.out / f"{self.plan['stem']}-raw.tar.gz", "w:gz") as tar:
            tar.add(self.res, arcname=self.plan["stem"])
            for log in sorted(WORK.glob("*.log")) + sorted(WORK.glob("serve-logs/*.log")):
                data = log.read_bytes()  # a snapshot: a log cut short by a restart mid-tar
                info = tar.gettarinfo(log, arcname=f"logs/{log.name}")  # raised OSError
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


# pip into the host's /tmp/site032 (env.sh puts it first on PYTHONPATH), offline, no deps
PIP = ["python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
       "--no-build-isolation", "--target", "/tmp/site032"]  # fmt: skip  # noqa: S108
# py-spy into a folder of its own: pip --target keeps a bin/ it finds (vLLM's install made one)
PY_SPY = "/tmp/pyspy/bin/py-spy"  # noqa: S108
TICKS = os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these
GPU_QUERY = "name,timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,pstate"
SMI = [shutil.which("nvidia-smi") or "true", "--format=csv", "-l", "5", f"--query-gpu={GPU_QUERY}"]
WRAPPER = ('#!/bin/sh\nset -f\nfor a; do [ "$b" = --port ] && port=$a; b=$a; done\neval '
           '"more=\\${BENCH_VLLM_ARGS_${port:-0}:-}"\nexec python3 -m vllm.entrypoints.cli.main '
           '"$@" ${BENCH_VLLM_ARGS:-} $more\n')  # fmt: skip


def install(p: Pass) -> None:
    if p.run(["bash", "bench/gpu/host/install.sh"]):
        raise RuntimeError("install failed")
    p.run([*PIP, *map(str, sorted(ROOT.glob(".whl/*.whl")))])
    p.run([*PIP[:-1], str(Path(PY_SPY).parents[1]), *map(str, ROOT.glob(".whl/py_spy-*.whl"))])
    vllm = Path("/tmp/bin/vllm")  # noqa: S108 (serve.sh's VLLM_BIN: the GPU build)
    vllm.parent.mkdir(exist_ok=True)
    vllm.write_text(WRAPPER)
    vllm.chmod(0o755)


def install_layout(p: Pass) -> None:
    if p.run([*PIP, *map(str, sorted(ROOT.glob(".whl/*.whl")))]) or p.run([*PIP, "engine/layout"]):
        raise RuntimeError("install-layout failed")
    p.run(["python3", "-c", "import torch, transformers as t, fastapi as f, uvicorn as u, "
           "ocrvl_layout; print(torch.__version__, torch.cuda.is_available(), t.__version__, "
           "f.__version__, u.__version__)"])  # fmt: skip


def prepare(p: Pass) -> None:
    """The host's full-size checkpoints, in the background: every stage but `floor` waits."""
    engine, layout, steps = p.host["engine_python"], p.path(p.host["layout_model"]), []
    if "model" in p.host and not (Path(p.path(p.host["model"])) / "config.json").exists():
        steps.append([engine, "-m", "tests.support.tiny_model", p.path(p.host["model"]), "--full"])
    if not (Path(layout) / "config.json").exists():
        steps.append([engine, "-m", "bench.gpu.layout_checkpoint", layout])
    p.start("prepare", ["sh", "-c", " && ".join([*map(shlex.join, steps), "echo prepared"])])


def prepared() -> None:
    """Until `prepare` has ended (its log then in this call's); RuntimeError if it failed."""
    pid = WORK / "prepare.pid"
    while pid.exists() and not gone(int(pid.read_text())):
        time.sleep(1)
    if pid.exists():
        pid.unlink()
        print(log := (WORK / "prepare.log").read_text(errors="replace"), end="", flush=True)
        if not log.endswith("prepared\n"):
            raise RuntimeError("prepare failed")


def floor(p: Pass) -> None:
    """Each variant's floor, from the same corpus's requests, on the idle GPU."""
    corpus, host, work = p.plan["corpus"], p.host, p.res / "work.json"
    p.run([host["python"], "-m", "bench.gpu.corpus", "work", "--pages", str(corpus["floor_pages"]),
           "--median", str(corpus["median"]), "--sigma", str(corpus["sigma"]),
           "--out", str(work)])  # fmt: skip
    with beside(SMI, p.res / "floor.gpu.csv"):  # the GPU's clocks, as beside a load
        for variant in ("whole", "blocks"):
            p.run([host["engine_python"], "-m", "bench.gpu.floor", "--work", str(work), "--variant",
                   variant, "--out", str(p.res), *host.get("floor_args", [])])  # fmt: skip


def vit(p: Pass) -> None:
    """bench.gpu.encoder_check, GPU idle (a batch out of bounds: in the JSON and the log, and the
    stages go on); the plugin's rotary is the call's (the JSON's `fused_rotary`)."""
    p.run([p.host["engine_python"], "-m", "bench.gpu.encoder_check", *p.plan.get("vit", []),
           "--out", str(p.res / "vit-attention.json")])  # fmt: skip


def up(p: Pass) -> None:
    """make serve as the plan gives it (scripts/serve.sh, its logs in WORK/serve-logs)."""
    (WORK / "serve-logs").mkdir(parents=True, exist_ok=True)
    env = {"MODEL": p.path(p.host["model"]), "PROFILE": p.host["profile"], "LAYOUT": "on",
           "VLLM_PORT": str(p.ports["engine"]), "PORT": str(p.ports["gateway"]),
           "LAYOUT_PORT": str(p.ports["layout"]), "ENGINE_LOG_DIR": str(WORK / "serve-logs"),
           "OCRVL_API_KEYS": KEY, "OCRVL_BACKEND_API_KEY": BACKEND_KEY,
           "OCRVL_LOG_LEVEL": "warning", **p.host.get("serve_env", {})}  # fmt: skip
    if p.host["model"] != "tiny":
        env["LAYOUT_MODEL"] = p.path(p.host["layout_model"])
    p.start("serve", ["bash", "scripts/serve.sh"], **env)


def ready(p: Pass) -> None:
    """The stack, then the stand-in and the layout variant's gateway in front of its engines
    (and each variant's own, `own_gateways`)."""
    p.wait_ready("serve", p.url("gateway") + "/ready", p.host.get("ready_s", 600))
    backends = served_backends()
    python = p.host["python"]
    p.start("standin", [python, "-m", "bench.gpu.layout_standin", "--port",
                        str(p.ports["standin"]), "--forward", p.url("layout")])  # fmt: skip
    gateways = {"layout-gateway": (p.ports["layout_gateway"], {}), **own_gateways(p)}
    for name, (port, env) in gateways.items():
        p.start(name, [python, "-m", "app.cli", "serve", "--port", str(port)],
                **{"OCRVL_BACKENDS": backends, **env}, OCRVL_BACKEND_API_KEY=BACKEND_KEY,
                OCRVL_API_KEYS=KEY, OCRVL_LAYOUT_URL=p.url("standin"), OCRVL_LOG_LEVEL="warning",
                OCRVL_DATA_DIR=str(WORK / f"{name}-data"))  # fmt: skip
    p.wait_ready("standin", p.url("standin") + "/ready", 60)
    for name, (port, _) in gateways.items():
        p.wait_ready(name, f"http://127.0.0.1:{port}/ready", 120)


def own_gateways(p: Pass) -> dict[str, tuple[int, dict[str, str]]]:
    """A variant that names an `env` (its gateway's settings, OCRVL_BACKENDS among them to pick
    engines) has a gateway of its own before the stand-in: its port and env, `gateway-VARIANT`."""
    named = [v for v in p.plan["variants"] if "env" in v]
    return {f"gateway-{v['name']}": (p.ports["layout_gateway"] + 1 + n, v["env"])
            for n, v in enumerate(named)}  # fmt: skip


def gateway(p: Pass, variant: dict[str, Any]) -> str:
    """The URL a variant's load goes to."""
    if own := own_gateways(p).get(f"gateway-{variant['name']}"):
        return f"http://127.0.0.1:{own[0]}"
    return p.url("gateway" if variant["layout"] == "off" else "layout_gateway")


def served_backends() -> str:
    """The `OCRVL_BACKENDS` make serve gave its gateway (its log says so at start)."""
    log = (WORK / "serve.log").read_text(errors="replace")
    return log.split("gateway: OCRVL_BACKENDS=")[-1].split()[0]


def room(p: Pass, names: list[str]) -> int | None:
    """The cap of a load whose windows can end before the call's limit; None (said) when not."""
    rules = p.plan["window"]
    cap = min(rules["max_seconds"] * len(names), p.left() - 30)
    if cap < rules["seconds"] * len(names) + rules["ramp_s"] + 10:
        print(f"window {','.join(names)} skipped: {p.left():.0f} s left in this call", flush=True)
        return None
    return int(cap)


def load(p: Pass, name: str, url: str, cap: int, concurrency: int, *options: str) -> list[str]:
    """bench.gpu.load's command line for one load (its windows: `name`, by commas), `cap` s."""
    rules, corpus = p.plan["window"], p.plan["corpus"]
    return [p.host["python"], "-m", "bench.gpu.load", url, "--name", name, "--out", str(p.res),
            "--concurrency", str(concurrency), "--ramp", str(rules["ramp_s"]),
            "--window", str(rules["seconds"]), "--latencies", str(rules["latencies"]),
            "--bin", str(rules["bin_s"]), "--max-seconds", str(cap),
            "--pages", str(corpus["pages"]), "--median", str(corpus["median"]),
            "--sigma", str(corpus["sigma"]), "--key", KEY, *options]  # fmt: skip


def turn(p: Pass, index: int) -> dict[str, Any]:
    """The variant of the I-th window of the variants' A B B A ... order."""
    variants = {v["name"]: v for v in p.plan["variants"]}
    return variants[method.order(list(variants), p.plan["windows"])[index]]


def window(p: Pass, indices: list[int]) -> None:
    """Windows I, I+1 ... of one variant as one load (the next starts where one ended), the
    /metrics of the gateway, engines and layout service around it (bench.gpu.reads): a
    RuntimeError, which ends the call, when the engines did not read it."""
    variant = turn(p, indices[0])
    url = gateway(p, variant)
    names = [f"{index:02d}-{variant['name']}" for index in indices]
    engines = reads.engines(served_backends())
    if (cap := room(p, names)) is None:
        return
    before, cpu = reads.snapshot(url, engines, p.url("layout")), cpu_seconds()
    with beside(SMI, p.res / f"{names[0]}.gpu.csv"):  # the GPU's clocks, power and use
        p.run(load(p, ",".join(names), url, cap, variant["concurrency"], "--api", "ocr",
                   "--layout", variant["layout"]))  # fmt: skip
    after, spent = reads.snapshot(url, engines, p.url("layout")), cpu_seconds()
    made = reads.engines_moved(before, after, "vllm:generation_tokens")  # what the CPU bought
    used = {"generated_tokens": made, "cpu_s": sorted(
        ((round(spent[k] - cpu.get(k, 0), 2), k) for k in spent), reverse=True)[:16]}  # fmt: skip
    found = reads.check(before, after, p.res / f"{names[0]}.requests.csv")
    for name in names:  # a load's figures, beside each of its windows
        (p.res / f"{name}.cpu.json").write_text(json.dumps(used, indent=1) + "\n")
        (p.res / f"{name}.metrics.json").write_text(json.dumps({"before": before, "after": after}))
        report = p.res / f"{name}.json"  # the report reads them beside the window's figures
        if report.exists():  # not a window the cap came before
            report.write_text(json.dumps(json.loads(report.read_text()) | {"engine_reads": found},
                                         indent=1) + "\n")  # fmt: skip
    print(f"{','.join(names)}: {found}", flush=True)
    if found["fault"]:
        raise RuntimeError(f"{','.join(names)} did not measure the engines: {found['fault']}")


@contextlib.contextmanager
def beside(sampler: list[str], path: Path, **popen: Any) -> Iterator[None]:
    """`sampler` (SMI, top) writing to `path` while the block runs, stopped however it ends."""
    with path.open("wb") as out, subprocess.Popen(sampler, stdout=out, **popen) as running:
        try:
            yield
        finally:
            running.terminate()


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) each process of the host has used, by `PID COMMAND LINE`:
    beside a window, what else kept the cores busy (the engine's own process among them)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            line = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")[:120].decode()
        except (OSError, IndexError, UnicodeDecodeError):
            continue  # ended meanwhile
        found[f"{stat.parent.name} {line}"] = (int(fields[11]) + int(fields[12])) / TICKS
    return found


def alone(p: Pass, index: int) -> None:
    given, model = p.plan["alone"], p.path(p.host["layout_model"])
    if model == "tiny":
        model = os.environ.get("TINY_LAYOUT_DIR", ".cache/tiny-layout")
    ports = {name: p.ports["layout"] + 1 + n for n, name in enumerate(given["services"])}
    if not (p.res / "machine.json").exists():  # the report's GPU where no floor ran
        p.run([p.host["engine_python"], "-m", "bench.gpu.machine", str(p.res / "machine.json")])
    for name, port in ports.items():
        if not (WORK / f"layout-{name}.pid").exists():
            p.start(f"layout-{name}", [p.host["engine_python"], "-m", "ocrvl_layout", "--model",
                    model, "--port", str(port), *given["services"][name]])  # fmt: skip
    for name, port in ports.items():
        p.wait_ready(f"layout-{name}", f"http://127.0.0.1:{port}/ready", p.host.get("ready_s", 600))
    name = method.order(list(ports), given["windows"])[index]
    stem, url = f"alone-{index:02d}-{name}", f"http://127.0.0.1:{ports[name]}"
    pid = (WORK / f"layout-{name}.pid").read_text().strip()
    (p.res / f"{stem}.metrics-before.txt").write_text(reads.fetch(url + "/metrics"))
    top = ["top", "-b", "-H", "-d", "5", "-w", "200", "-p", pid]  # the service's threads
    with beside(top, p.res / f"{stem}.top.txt", stderr=subprocess.DEVNULL):
        if (cap := room(p, [stem])) is not None:
            p.run(load(p, stem, url, cap, given["concurrency"], "--api", "layout",
                       "--seed", str(index)))  # fmt: skip
    (p.res / f"{stem}.metrics-after.txt").write_text(reads.fetch(url + "/metrics"))


def spy(p: Pass) -> None:
    """py-spy's samples of the load's processes (`make serve`'s, a layout-first load's gateway
    and stand-in) for `spy.seconds` of the `spy.variant` load once ramped: RES/spy-VARIANT.*;
    with `--profiler-config` in serve_env's BENCH_VLLM_ARGS, vLLM's torch profiler's tables."""
    given, ramp = p.plan["spy"], p.plan["window"]["ramp_s"]
    variant = {v["name"]: v for v in p.plan["variants"]}[given["variant"]]
    seconds, rate, raw = given["seconds"], given["rate"], p.res / f"spy-{given['variant']}.txt"
    if p.left() < seconds + ramp + 60:  # as a window, skipped: the call's next stages run
        print(f"spy skipped: {p.left():.0f} s left in this call", flush=True)
        return
    url, cap, own = gateway(p, variant), int(ramp + seconds + 20), "gateway-" + variant["name"]
    command = load(p, f"{raw.stem}-load", url, cap, variant["concurrency"], "--api", "ocr",
                   "--layout", variant["layout"], "--window", str(cap), "--latencies", "1e9"
                   )  # fmt: skip
    front = own if own in own_gateways(p) else "layout-gateway"  # the gateway the load goes to
    names = ["serve", *([front, "standin"] if variant["layout"] == "on" else [])]
    parts = [WORK / f"spy.{(WORK / f'{name}.pid').read_text().strip()}" for name in names]
    args = p.host.get("serve_env", {}).get("BENCH_VLLM_ARGS", "")  # the engines' extra flags
    profiler = re.search(r'"torch_profiler_dir": *"([^"]+)"', args)
    engines = reads.engines(served_backends()) if profiler else []
    with subprocess.Popen(command, cwd=ROOT):
        time.sleep(ramp + 10)  # the harness's pace: the load's clients all started, and busy
        for url in engines:  # it stops itself after its max_iterations, writing its table
            name = {"profile_prefix": "engine-" + url.rpartition(":")[2]}  # one table an engine
            reads.fetch(url + "/start_profile", json.dumps(name).encode())
        for spy_ in [subprocess.Popen([shutil.which("py-spy") or PY_SPY, "record", "--nonblocking",
                     "--subprocesses", "--threads", "--format", "raw", "--rate", str(rate),
                     "--duration", str(seconds), "--pid", part.suffix[1:], "--output", str(part)])
                     for part in parts]:  # fmt: skip
            spy_.wait()
        for url in engines:  # answered once a table being written is
            reads.fetch(url + "/stop_profile", b"{}")
    for table in Path(profiler[1]).glob("*.txt") if profiler else []:
        shutil.copy(table, p.res / f"profile-{table.name}")
    if written := [part for part in parts if part.exists()]:  # else py-spy said why it failed
        raw.write_text("".join(part.read_text(errors="replace") for part in written))
        found = busiest(raw.read_text(errors="replace"), rate * seconds)
        raw.with_suffix(".json").write_text(json.dumps(found, indent=1) + "\n")
        for row in found:
            print(f"{row['cores']:.2f} {row['process'][:90]}", *row["self"][:6], sep="\n  ")


def busiest(raw: str, whole: float) -> list[dict[str, Any]]:
    """py-spy's raw stacks (`process PID:"CMD";...;thread (TID): NAME;frame;... COUNT`, the last
    `process` the line's own) per process, busiest first: the cores it and each thread kept busy
    (samples of a running thread over `whole`, rate x seconds) and its costliest frames."""
    threads: dict[str, Counter[str]] = defaultdict(Counter)
    frames: dict[str, Counter[str]] = defaultdict(Counter)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        names = stack.split(";")
        own = max((i for i, name in enumerate(names) if name.startswith("process ")), default=-9)
        if count.isdigit() and 0 <= own < len(names) - 1:
            process = names[own].removeprefix("process ")
            threads[process][names[own + 1]] += int(count)
            frames[process][re.sub(r":\d+\)$", ")", names[-1])] += int(count)
    ranked = sorted(threads.items(), key=lambda kv: -kv[1].total())
    return [{"process": process, "cores": round(counts.total() / whole, 3),
             "threads": {name: round(n / whole, 3) for name, n in counts.most_common()},
             "self": frames[process].most_common(20)} for process, counts in ranked]  # fmt: skip


def down(p: Pass) -> None:
    """SIGTERM to each group `up`, `ready` and `alone` started (serve.sh stops what it
    started), then SIGKILL to what is left of the group 20 s later."""
    for name in ("layout-gateway", *own_gateways(p), "standin", "serve",
                 *(f"layout-{name}" for name in p.plan["alone"]["services"])):  # fmt: skip
        if not (pid_file := WORK / f"{name}.pid").exists():
            continue
        pid = int(pid_file.read_text())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            for _ in range(20):
                if gone(pid):  # the group's leader
                    break
                time.sleep(1)
        pid_file.unlink()
        print(f"down: {name}", flush=True)


def report(p: Pass) -> None:
    """OUT/STEM.json (issue 50's summary) and OUT/STEM.md from RES."""
    from bench.gpu import report as writer  # noqa: PLC0415

    writer.write(p.plan, p.res, p.out)


STAGES = {"install": install, "install-layout": install_layout, "prepare": prepare,
          "floor": floor, "vit": vit, "up": up, "ready": ready, "spy": spy,
          "report": report, "down": down}  # fmt: skip


def stages(p: Pass, words: list[str]) -> int:
    """Run `words` (stages and their arguments) in order; 1 after the first that fails."""
    while words:
        word = words.pop(0)
        print(f"=== {word} {time.strftime('%H:%M:%S', time.gmtime())}", flush=True)
        try:
            if word not in ("floor", "receive"):
                prepared()
            if word == "receive":
                p.run(["bash", "bench/gpu/host/receive.sh", ".gpu-wheels-032s", words.pop(0)])
            elif word == "window":  # with the call's next windows of the same variant
                at = [int(words.pop(0))]
                while words[:2] == ["window", str(at[-1] + 1)] and turn(p, at[-1] + 1) is turn(
                        p, at[0]):  # fmt: skip
                    at.append(int(words[1]))
                    del words[:2]
                window(p, at)
            elif word == "alone":
                alone(p, int(words.pop(0)))
            else:
                STAGES[word](p)
        except (RuntimeError, KeyError, OSError) as exc:
            print(f"stage {word} failed: {exc}", file=sys.stderr, flush=True)
            p.collect()
            return 1
        p.collect()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.run")
    parser.add_argument("plan", type=Path)
    parser.add_argument("--call", type=int, help="the plan's call N (0-based)")
    parser.add_argument("stages", nargs="*", help="stages to run instead of a call's")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    out = Path(os.environ.get("OUT") or plan["host"].get("out", "/tmp/gpu-out"))  # noqa: S108
    words = " ".join(args.stages or plan["calls"][args.call]).split()  # "window 0" quoted too
    return stages(Pass(plan, out), words)


if __name__ == "__main__":
    sys.exit(main())
