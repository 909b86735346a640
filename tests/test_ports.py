"""free_port(): a block of loopback ports per xdist worker, below the kernel's ephemeral range,
none given twice while the block has others."""

from __future__ import annotations

import socket

import pytest

from tests.support.servers import PORT_BASE, PORT_BLOCK, free_port, free_ports


@pytest.mark.parametrize(("worker", "block"), [("", 0), ("gw0", 1), ("gw1", 2)])
def test_each_worker_draws_from_a_block_of_its_own(
    monkeypatch: pytest.MonkeyPatch, worker: str, block: int
) -> None:
    """The main process and each worker get disjoint blocks, all under 32768, where the kernel
    never hands a port to an outgoing connection."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    low = PORT_BASE + block * PORT_BLOCK
    ports = [free_port() for _ in range(50)]
    assert all(low <= port < low + PORT_BLOCK for port in ports)
    assert low + PORT_BLOCK <= 32768
    assert len(set(ports)) > 1  # drawn, not one fixed port


def test_a_port_in_use_is_never_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every port of the block but one taken, that one is what comes back."""
    monkeypatch.setattr("tests.support.servers.PORT_BLOCK", 8)
    monkeypatch.setattr("tests.support.servers._given", set())
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "")
    taken = []
    try:
        for port in range(PORT_BASE, PORT_BASE + 7):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # already someone's: taken all the same
                sock.close()
                continue
            sock.listen()
            taken.append(sock)
        assert free_port() == PORT_BASE + 7
    finally:
        for sock in taken:
            sock.close()


def test_no_port_is_given_twice_while_the_block_has_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of two for `make serve`'s engines, then six single ports from a block of eight:
    eight different ports, the whole block (CI once drew one port for a gateway and the layout
    service beside it, both asked for before either listened)."""
    monkeypatch.setattr("tests.support.servers.PORT_BLOCK", 8)
    monkeypatch.setattr("tests.support.servers._given", set())
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "")
    first = free_ports(2)
    ports = [first, first + 1, *(free_port() for _ in range(6))]
    assert sorted(ports) == list(range(PORT_BASE, PORT_BASE + 8))
    assert PORT_BASE <= free_port() < PORT_BASE + 8  # the block spent: its ports again


def test_many_draws_from_the_real_block_are_all_different(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 ports from a block of 3,000: drawn at random alone, two would match almost surely."""
    monkeypatch.setattr("tests.support.servers._given", set())
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == 200
