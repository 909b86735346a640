"""A real nginx running the repository's templates, rendered the way the official image does.

The official image's entrypoint (20-envsubst-on-templates.sh) runs, for each
/etc/nginx/templates/X.template, `envsubst "$defined_envs" < X.template > conf.d/X`, where
`$defined_envs` lists the environment variables whose names match NGINX_ENVSUBST_FILTER; its
nginx.conf includes conf.d/*.conf inside `http {}`. `render` does the same with gettext's
`envsubst`, and `main_conf` is that nginx.conf with every path moved under a scratch folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.compose import ROOT
from tests.support.servers import free_port  # noqa: F401 (its callers import it from here)

TEMPLATES = ROOT / "nginx" / "templates"
SUFFIX = ".template"


def render(env: Mapping[str, str], output_dir: Path) -> list[Path]:
    """Render every template into `output_dir` as the image's entrypoint would with `env`."""
    pattern = env.get("NGINX_ENVSUBST_FILTER", "")
    defined = " ".join(f"${{{name}}}" for name in sorted(env) if re.search(pattern, name))
    rendered = []
    for template in sorted(TEMPLATES.rglob(f"*{SUFFIX}")):
        output = output_dir / str(template.relative_to(TEMPLATES)).removesuffix(SUFFIX)
        output.parent.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["envsubst", defined], input=template.read_bytes(), env=dict(env),
            capture_output=True, check=True,
        )  # fmt: skip
        output.write_bytes(result.stdout)
        rendered.append(output)
    return rendered


def main_conf(root: Path) -> str:
    """The official image's nginx.conf, with pid, logs, temp files and conf.d under `root`."""
    # As root, workers would drop to `nobody`, who cannot enter pytest's private tmp folders.
    user = "user root root;" if os.geteuid() == 0 else ""
    temp = root / "temp"
    return f"""\
{user}
worker_processes auto;
error_log {root}/error.log notice;
pid {root}/nginx.pid;
events {{
    worker_connections 1024;
}}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    sendfile on;
    keepalive_timeout 65;
    include {root}/conf.d/*.conf;
}}
"""


def prepare(root: Path, env: Mapping[str, str]) -> Path:
    """Lay out `root` (conf.d, temp, nginx.conf) for `env`; returns the nginx.conf path."""
    (root / "temp").mkdir(parents=True, exist_ok=True)
    render(env, root / "conf.d")
    conf = root / "nginx.conf"
    conf.write_text(main_conf(root))
    return conf


def nginx_command(root: Path, conf: Path, *extra: str) -> list[str]:
    """nginx with its prefix, error log and config under `root` (never /etc/nginx's)."""
    return ["nginx", "-p", str(root), "-e", str(root / "error.log"), "-c", str(conf), *extra]


@dataclass
class Nginx:
    """A running nginx: `url` is its loopback base URL; `access_log` holds its JSON lines."""

    url: str
    root: Path
    env: dict[str, str]
    access_log: Path
    error_log: Path
    process: subprocess.Popen[bytes]

    def log_lines(self, at_least: int = 1, timeout: float = 5.0) -> list[str]:
        """The access log's lines, once it has `at_least` (nginx logs a request after its
        last byte went out, so a fast client can look before the line is written)."""
        deadline = time.monotonic() + timeout
        lines = self.access_log.read_text().splitlines()
        while len(lines) < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
            lines = self.access_log.read_text().splitlines()
        return lines


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # nginx's fast shutdown
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running(root: Path, env: Mapping[str, str]) -> Iterator[Nginx]:
    """nginx in the foreground (a child of the test) on `env["NGINX_LISTEN"]`, stopped by PID."""
    listen = env["NGINX_LISTEN"]
    if not listen.startswith("127.0.0.1:"):
        raise ValueError(f"tests listen on loopback only; got NGINX_LISTEN={listen!r}")
    conf = prepare(root, env)
    access_log = root / "access.log"
    with access_log.open("wb") as stdout:
        process = subprocess.Popen(
            nginx_command(root, conf, "-g", "daemon off;"),
            stdout=stdout, stderr=subprocess.STDOUT,
        )  # fmt: skip
    host, _, port = listen.rpartition(":")
    try:
        _wait_for_port(host, int(port), process, root / "error.log")
        yield Nginx(
            url=f"http://{listen}",
            root=root,
            env=dict(env),
            access_log=access_log,
            error_log=root / "error.log",
            process=process,
        )
    finally:
        _stop(process)


def _wait_for_port(host: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"nginx exited with {process.returncode}:\n{_read(log)}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    _stop(process)
    pytest.fail(f"nginx did not listen on {host}:{port} within 10 s:\n{_read(log)}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
