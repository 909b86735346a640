"""A real DNS server for discovery tests: Debian's dnsmasq on a loopback UDP port.

It answers from a hosts file only (no upstream, no /etc/hosts) and is authoritative for
`cluster.local`, so a name without records is NXDOMAIN rather than REFUSED. `publish()` rewrites
the file and sends SIGHUP, dnsmasq's signal to re-read it, then waits until the answer shows.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import dns.exception
import dns.resolver

from tests.support.servers import free_port

DOMAIN = "cluster.local"


class Dnsmasq:
    """dnsmasq serving the records last given to `publish()`; a context manager."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        if not Path(binary).exists():
            raise RuntimeError("dnsmasq is not installed: apt-get install dnsmasq-base (.ci/run)")
        self.binary = binary
        self.hosts = folder / "hosts"
        self.log_path = folder / "dnsmasq.log"
        self.hosts.write_text("")
        self.port = free_port(udp=True)
        self.address = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.records: dict[str, list[str]] = {}

    def __enter__(self) -> Dnsmasq:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start dnsmasq (again) on `self.port`; return once it answers."""
        command = [
            self.binary, "--keep-in-foreground", "--no-resolv", "--no-hosts",
            f"--addn-hosts={self.hosts}", f"--local=/{DOMAIN}/",
            "--listen-address=127.0.0.1", "--bind-interfaces", f"--port={self.port}",
            "--cache-size=0", "--pid-file=", "--log-facility=-",
        ]  # fmt: skip
        if os.geteuid() == 0:
            command.append("--user=root")  # as nobody it could not read the test's private folder
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self._wait(lambda: self._query(f"ready.{DOMAIN}") is not None)

    def stop(self) -> None:
        """Stop dnsmasq: queries then go unanswered (the port is closed)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def publish(self, records: dict[str, list[str]]) -> None:
        """Serve exactly `records` (name -> addresses, IPv4 or IPv6) from now on."""
        self.records = records
        lines = [
            f"{address} {name}" for name, addresses in records.items() for address in addresses
        ]
        self.hosts.write_text("\n".join(lines) + "\n")
        assert self.process is not None
        self.process.send_signal(signal.SIGHUP)
        for name, addresses in records.items():
            self._wait(lambda n=name, a=addresses: sorted(self._query(n) or []) == sorted(a))

    def _query(self, name: str) -> list[str] | None:
        """Every address of `name`; None when dnsmasq does not answer."""
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = ["127.0.0.1"], self.port, 0.5
        found: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                found += [r.to_text() for r in resolver.resolve(name, rdtype)]
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                pass
            except dns.exception.DNSException:
                return None
        return found

    def _wait(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"dnsmasq exited:\n{self.log_path.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq did not serve in time:\n{self.log_path.read_text()}")
            time.sleep(0.01)
