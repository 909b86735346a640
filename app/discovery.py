"""DNS discovery: a `dns+http://NAME:PORT` backend entry stands for every address of NAME.

Each probe round asks `Discovery.members()` for the backends as they are now: plain entries as
written, each `dns+` entry expanded to one `http://ADDR:PORT` per A and AAAA record (IPv6 in
brackets). A Kubernetes headless Service publishes one record per ready pod, so pods that start
join the pool and pods that stop leave it. Three outcomes per name:

    records          the members are exactly those addresses
    no records       NXDOMAIN or no A/AAAA: the name has no members now (all pods gone)
    no answer        timeout, SERVFAIL, REFUSED, unreachable server: keep the last known
                     members, since a DNS outage says nothing about the backends
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.resolver

from app.settings import BackendSpec, split_host_port

log = logging.getLogger("ocrvl.discovery")


class Discovery:
    """Expands `OCRVL_BACKENDS` into concrete backends, re-resolving the `dns+` entries."""

    def __init__(
        self, specs: list[BackendSpec], nameserver: str | None = None, timeout: float = 5.0
    ) -> None:
        """`nameserver` is `HOST[:PORT]` (OCRVL_DNS_SERVER); None reads /etc/resolv.conf."""
        self._specs = specs
        self._resolver = _resolver(nameserver, timeout)
        self._known: dict[BackendSpec, list[BackendSpec]] = {}
        self._failing: set[BackendSpec] = set()  # entries whose last resolution failed

    async def members(self) -> list[BackendSpec]:
        """Every backend now, each once, in the order of the entries."""
        expanded = await asyncio.gather(*(self._expand(spec) for spec in self._specs))
        unique = {member.url: member for group in expanded for member in group}
        return list(unique.values())

    async def _expand(self, spec: BackendSpec) -> list[BackendSpec]:
        if not spec.discover:
            return [spec]
        parts = urlsplit(spec.url)
        name = parts.hostname or ""
        try:
            addresses = await self._addresses(name)
        except (dns.exception.DNSException, OSError) as exc:
            known = self._known.get(spec, [])
            if spec not in self._failing:
                shown = ", ".join(member.url for member in known) or "none"
                log.warning(
                    "resolving %s failed (%s); keeping its %d last known backend(s): %s",
                    *(name, _reason(exc), len(known), shown),
                )
            self._failing.add(spec)
            return known
        if spec in self._failing:
            self._failing.discard(spec)
            log.info("resolving %s works again", name)
        port = f":{parts.port}" if parts.port is not None else ""
        members = [
            BackendSpec(f"{parts.scheme}://{_host(address)}{port}{parts.path}", spec.capacity)
            for address in addresses
        ]
        if members != self._known.get(spec):
            log.info("%s resolves to %s", name, ", ".join(addresses) or "no address")
        self._known[spec] = members
        return members

    async def _addresses(self, name: str) -> list[str]:
        """Every A and AAAA address of `name`, IPv4 first, sorted; [] if it has none."""
        try:
            return [str(ipaddress.ip_address(name))]  # an address needs no lookup
        except ValueError:
            pass
        found = await asyncio.gather(self._query(name, "A"), self._query(name, "AAAA"))
        addresses = {ipaddress.ip_address(text) for group in found for text in group}
        return [str(a) for a in sorted(addresses, key=lambda a: (a.version, a))]

    async def _query(self, name: str, rdtype: str) -> list[str]:
        try:
            # search=True: a short name ("vllm-headless") gets the resolv.conf search domains,
            # as libc would give it (dnspython's default is the absolute name only).
            answer = await self._resolver.resolve(name, rdtype, search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        return [record.to_text() for record in answer]


def _resolver(nameserver: str | None, timeout: float) -> dns.asyncresolver.Resolver:
    if nameserver is None:
        resolver = dns.asyncresolver.Resolver()  # /etc/resolv.conf, as the pod's DNS policy sets
    else:
        host, port = split_host_port(nameserver, default_port=53)
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [host]
        resolver.port = port
    resolver.lifetime = timeout  # per query, retries included
    resolver.cache = None  # every round asks again: TTLs of headless Services are short anyway
    return resolver


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _reason(exc: Exception) -> str:
    return str(exc).strip() or type(exc).__name__
