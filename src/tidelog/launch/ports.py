"""Free loopback ports for servers started by tests and by ``tidelog serve``.

The kernel picks the port (bind to port 0), so two callers never choose the same one by guessing. A port is only
*free at the moment of asking*: another process may take it before our child binds it. Callers that start a
server on a port from here must therefore treat "address already in use" as retryable with a fresh port, as
:mod:`tidelog.broker.embedded` does.
"""

from __future__ import annotations

import contextlib
import socket

__all__ = ["free_port", "free_ports"]


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that nothing listens on right now."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct free TCP ports on ``host``.

    All the sockets stay bound until every port is chosen, so the kernel cannot hand out the same port twice
    within one call (which separate :func:`free_port` calls may do once a port is released).
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            # No SO_REUSEADDR: the port must be genuinely unused, not merely in TIME_WAIT.
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports
