"""Instructions per request of one `ocrvl serve`, counted by valgrind's callgrind.

CPU time on a shared machine moves by tens of per cent from one batch to the next (other
processes take the caches and the cores); the instructions a request executes do not. The
gateway runs under `valgrind --tool=callgrind --instr-atstart=no`: started, warmed up with a
few requests uncounted, then counting is switched on (`callgrind_control -i on`) for exactly
`requests` requests one at a time and off again; the total Ir it reports, divided by the
requests, is the instructions one request costs the gateway's process (every thread).

`policy_alone` counts `app.policy.apply` by itself, which whole requests cannot resolve (their
counts move by a per cent or two between runs of the same code): a Python process applies it
to the body `calls` times and once not at all, under callgrind; the difference over `calls`.
Run as `python -m bench.overhead.instructions BODY CALLS`, it is that process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

from bench.overhead import CLIENT_KEY, ROOT, ROUTE
from bench.overhead.pair import gateway

WARM_UP = 20
# No probes or /metrics reads while counting: the background work would be counted too
QUIET = {"OCRVL_HEALTH_INTERVAL": "3600", "OCRVL_METRICS_INTERVAL": "3600"}
COLLECTED = re.compile(rb"Collected : (\d+)")


def instructions_per_request(
    workdir: Path, code: tuple[str, Path], backend: str, body: bytes, *, requests: int
) -> float:
    """Ir per chat request of the gateway running `code` (name, folder): one run under
    callgrind, `requests` counted."""
    name, folder = code
    out = workdir / f"{name}.callgrind"
    wrapper = (
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
    )  # fmt: skip
    headers = {"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"}
    log = workdir / f"{name}.log"
    with (
        gateway(workdir, name, folder, backend, wrapper, **QUIET) as (url, process),
        httpx.Client(timeout=120, trust_env=False) as client,
    ):
        for _ in range(WARM_UP):
            _send(client, f"{url}{ROUTE}", body, headers)
        _control(process.pid, "on")
        for _ in range(requests):
            _send(client, f"{url}{ROUTE}", body, headers)
        _control(process.pid, "off")
    counted = COLLECTED.findall(log.read_bytes())  # valgrind's summary, written as it exits
    if not counted:
        raise RuntimeError(f"callgrind reported no total; see {log}")
    return int(counted[-1]) / requests


def _send(client: httpx.Client, url: str, body: bytes, headers: dict[str, str]) -> None:
    response = client.post(url, content=body, headers=headers)
    if response.status_code != 200:
        raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:300]}")


def _control(pid: int, state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(pid)], check=True, capture_output=True)


def policy_alone(workdir: Path, body: bytes, calls: int) -> float:
    """Ir of one `policy.apply` on `body` (a parsed request, the default settings)."""
    path = workdir / "policy-body.json"
    path.write_bytes(body)
    totals = []
    for count in (0, calls):
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir}/apply.out"]
        command += [sys.executable, "-m", "bench.overhead.instructions", str(path), str(count)]
        done = subprocess.run(command, capture_output=True, check=True, cwd=ROOT)
        totals.append(int(COLLECTED.findall(done.stderr)[-1]))
    return (totals[1] - totals[0]) / calls


def _apply(path: Path, calls: int) -> None:
    """`policy.apply` `calls` times on the request in `path` (the process policy_alone counts)."""
    from app import chat, policy  # noqa: PLC0415 (imported in both runs alike)
    from app.settings import BackendSpec, Settings  # noqa: PLC0415

    settings = Settings(backends=[BackendSpec("http://127.0.0.1:9")], auth="off")
    request = chat.parse(path.read_bytes())
    model = {"id": "m", "max_model_len": 4096}
    for _ in range(calls):
        policy.apply(request, settings, model)


if __name__ == "__main__":
    _apply(Path(sys.argv[1]), int(sys.argv[2]))
