"""free_port(): a block of loopback ports per xdist worker, below the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from tests.support.servers import PORT_BASE, PORT_BLOCK, free_port


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
