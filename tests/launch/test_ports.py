"""Free loopback ports: distinct, and bindable when handed out."""

from __future__ import annotations

import socket
from pathlib import Path

from tidelog.launch.ports import free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in [*ports, free_port()]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_ports_stay_below_the_ephemeral_range() -> None:
    """Outgoing connections take their source port from the ephemeral range; a port handed out there can be
    taken by some client before the server it was chosen for binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(port < low for port in free_ports(20))
