"""Which addresses the gateway never connects to for a client: one explicit table, every Python.

Remote images (app/media.py) and job callbacks (app/jobs/webhook.py) connect where a client
says. Both refuse every address in a block of IANA's special-purpose address registries
(iana-ipv4-special-registry, iana-ipv6-special-registry, as of 2025), multicast, and IPv6
outside global unicast (2000::/3). The table is written out here rather than read from
`ipaddress`'s `is_private` / `is_global`, whose answers changed between Python releases
(3.11.7 counts 192.0.0.192 as global): the rules must not depend on the interpreter. Anycast
services inside a block (192.0.0.9, 2001:1::1…) are refused with it: no callback receiver or
image host lives there. 64:ff9b::/96 (NAT64, RFC 6052) embeds an IPv4 address, which is judged
by the IPv4 rules; IPv4-mapped IPv6 addresses are refused outright (no resolver answers them).
"""

from __future__ import annotations

import ipaddress

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

IPV4_SPECIAL = (
    ("0.0.0.0/8", "'this network'"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol assignment"),  # .0/29, .8, .9, .10, .170, .171 in it
    ("192.0.2.0/24", "a documentation address"),
    ("192.31.196.0/24", "an AS112 address"),
    ("192.52.193.0/24", "an AMT address"),
    ("192.88.99.0/24", "a 6to4 relay anycast address"),
    ("192.168.0.0/16", "a private address"),
    ("192.175.48.0/24", "an AS112 address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),  # the IPv4 address space registry, not the special
    ("240.0.0.0/4", "a reserved address"),
    ("255.255.255.255/32", "the broadcast address"),
)
IPV6_SPECIAL = (
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("::ffff:0:0/96", "an IPv4-mapped IPv6 address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("100:0:0:1::/64", "a dummy IPv6 address"),
    ("2001::/32", "an IPv6 tunnel address (Teredo)"),
    ("2001::/23", "an IETF protocol assignment"),  # PCP, TURN, DNS-SD anycast, AMT, ORCHID…
    ("2001:db8::/32", "a documentation address"),
    ("2002::/16", "an IPv6 tunnel address (6to4)"),
    ("2620:4f:8000::/48", "an AS112 address"),
    ("3fff::/20", "a documentation address"),
    ("5f00::/16", "a segment routing (SRv6) address"),
    ("fc00::/7", "a unique-local (private) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),  # deprecated (RFC 3879), outside 2000::/3 anyway
    ("ff00::/8", "a multicast address"),
)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
LOOPBACK = (ipaddress.IPv4Network("127.0.0.0/8"), ipaddress.IPv6Network("::1/128"))


def _table(rows: tuple[tuple[str, str], ...]) -> tuple[tuple[Network, str], ...]:
    return tuple((ipaddress.ip_network(block), why) for block, why in rows)


TABLE_V4 = _table(IPV4_SPECIAL)
TABLE_V6 = _table(IPV6_SPECIAL)


def refusal(address: Address, allow_loopback: bool = False) -> str | None:
    """Why the gateway must not connect to `address` for a client, or None when it may."""
    if allow_loopback and any(address in net for net in LOOPBACK):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64:  # the IPv4 address it stands for decides
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
            why = refusal(embedded)
            return None if why is None else f"a NAT64 address of {embedded}, {why}"
        for net, why in TABLE_V6:
            if address in net:
                return why
        return None if address in GLOBAL_UNICAST else "not a global unicast address"
    for net, why in TABLE_V4:
        if address in net:
            return why
    return None
