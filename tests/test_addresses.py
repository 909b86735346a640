"""The address rules of remote images and job callbacks: IANA's special-purpose registries as one
explicit table, the same answer on every Python (no test here connects anywhere)."""

from __future__ import annotations

import ipaddress

import pytest

from app.addresses import IPV4_SPECIAL, IPV6_SPECIAL, refusal

REFUSED = [
    # IPv4 special-purpose registry, one address per block (and edges)
    "0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.255",  # noqa: S104
    "127.0.0.1", "127.9.9.9", "169.254.169.254", "172.16.0.1", "172.31.255.255",
    "192.0.0.0", "192.0.0.8", "192.0.0.9", "192.0.0.10", "192.0.0.170", "192.0.0.171",
    "192.0.0.192", "192.0.0.255", "192.0.2.1", "192.31.196.1", "192.52.193.1", "192.88.99.1",
    "192.168.1.1", "192.175.48.1", "198.18.0.1", "198.19.255.255", "198.51.100.7",
    "203.0.113.9", "224.0.0.1", "239.255.255.255", "240.0.0.1", "255.255.255.255",
    # IPv6 special-purpose registry, multicast, and space outside global unicast
    "::", "::1", "::ffff:127.0.0.1", "::ffff:8.8.8.8", "64:ff9b:1::1", "100::1",
    "2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:1::1", "2001:2::1", "2001:3::1",
    "2001:10::1", "2001:20::1", "2001:db8::1", "2001:db8:ffff::1", "2002:7f00:1::1",
    "2620:4f:8000::1", "3fff::1", "5f00::1", "fc00::1", "fd12:3456::1", "fe80::1", "fec0::1",
    "ff02::1", "4000::1", "::8.8.8.8",
    # NAT64 (64:ff9b::/96) with a special-purpose IPv4 address inside
    "64:ff9b::a9fe:a9fe", "64:ff9b::10.0.0.1", "64:ff9b::127.0.0.1", "64:ff9b::192.0.0.192",
]  # fmt: skip
ALLOWED = [
    "8.8.8.8", "1.1.1.1", "9.9.9.9", "100.63.255.255", "100.128.0.0", "172.15.255.255",
    "172.32.0.0", "192.0.1.1", "198.17.255.255", "198.20.0.0", "223.255.255.255",
    "2606:4700:4700::1111", "2a00:1450:4001::1", "2001:4860:4860::8888", "2001:200::1",
    "64:ff9b::8.8.8.8",
]  # fmt: skip


@pytest.mark.parametrize("address", REFUSED)
def test_special_purpose_addresses_are_refused(address: str) -> None:
    """Every block of IANA's special-purpose registries (192.0.0.0/24 whole, CGNAT, benchmarking,
    documentation…), multicast, IPv4-mapped, 6to4, Teredo, NAT64 of a special IPv4 address, and
    IPv6 outside 2000::/3: refused, each with a reason."""
    reason = refusal(ipaddress.ip_address(address))
    assert isinstance(reason, str)
    assert reason


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address: str) -> None:
    """Global unicast addresses next to the blocks, and NAT64 of a public IPv4 address, pass."""
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("address", "allowed"),
    [("127.0.0.1", True), ("127.5.5.5", True), ("::1", True), ("10.0.0.1", False),
     ("::ffff:127.0.0.1", False), ("64:ff9b::127.0.0.1", False)],
)  # fmt: skip
def test_the_test_allowance_opens_loopback_only(address: str, allowed: bool) -> None:
    """OCRVL_MEDIA_ALLOW_LOOPBACK lets tests reach 127.0.0.0/8 and ::1; nothing else changes."""
    assert (refusal(ipaddress.ip_address(address), allow_loopback=True) is None) is allowed


FLAGS = (
    "is_private", "is_global", "is_reserved", "is_link_local", "is_loopback", "is_multicast",
    "is_unspecified", "is_site_local", "ipv4_mapped", "sixtofour", "teredo",
)  # fmt: skip


@pytest.mark.parametrize("lie", [True, False])
def test_the_answers_do_not_come_from_the_interpreters_flags(
    monkeypatch: pytest.MonkeyPatch, lie: bool
) -> None:
    """Python's ipaddress flags changed between releases (3.11.7: 192.0.0.192 is global); with
    every flag made to say the same thing for every address, each answer stays as it was."""
    before = {a: refusal(ipaddress.ip_address(a)) for a in REFUSED + ALLOWED}
    for cls in (ipaddress.IPv4Address, ipaddress.IPv6Address):
        for flag in FLAGS:
            if hasattr(cls, flag):
                said = lie if flag.startswith("is_") else None
                monkeypatch.setattr(cls, flag, property(lambda _, said=said: said))
    after = {a: refusal(ipaddress.ip_address(a)) for a in REFUSED + ALLOWED}
    assert after == before


def test_the_table_holds_valid_distinct_blocks() -> None:
    """Each row is a network in canonical form (no host bits), none listed twice."""
    for rows in (IPV4_SPECIAL, IPV6_SPECIAL):
        blocks = [block for block, _ in rows]
        assert len(set(blocks)) == len(blocks)
        for block in blocks:
            assert str(ipaddress.ip_network(block)) == block
