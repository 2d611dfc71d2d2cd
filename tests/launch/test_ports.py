"""Free loopback ports: distinct, and bindable when handed out."""

from __future__ import annotations

import socket

from tidelog.launch.ports import free_port, free_ports


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in [*ports, free_port()]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
