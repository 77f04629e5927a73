import socket
import subprocess
import sys
from pathlib import Path

import pytest

from crmstack.ports import free_port, port_is_free, release_port


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_picked_port_lies_below_the_range_outbound_connections_take_their_ports_from() -> None:
    ports = [free_port() for _ in range(20)]
    try:
        assert all(port < _ephemeral_low() for port in ports)
        assert len(set(ports)) == len(ports)
        assert all(port_is_free(port) for port in ports)
    finally:
        for port in ports:
            release_port(port)


def test_a_port_this_process_picked_is_never_handed_to_another_launcher() -> None:
    mine = [free_port() for _ in range(5)]
    # The other launcher is offered this process's ports first, then one nobody holds.
    spare = free_port()
    release_port(spare)
    offered = [*mine, spare]
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import random\nfrom crmstack.ports import free_port\n"
            f"offered = iter({offered!r})\n"
            "random.choice = lambda _candidates: next(offered)\n"
            "print(free_port())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for port in mine:
        release_port(port)
    assert int(other) == spare


def test_a_port_in_use_is_skipped_and_a_released_one_can_be_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    busy, spare = free_port(), free_port()
    release_port(busy)
    release_port(spare)
    offered = iter([busy, spare, busy])
    monkeypatch.setattr("crmstack.ports.random.choice", lambda _candidates: next(offered))
    with socket.socket() as server:
        server.bind(("127.0.0.1", busy))
        server.listen()
        assert free_port() == spare
    release_port(spare)
    assert free_port() == busy
    release_port(busy)
