"""Free loopback ports for servers started by tests and by ``tidelog serve``.

The kernel picks the port (bind to port 0), so two callers never choose the same one by guessing. A port is only
*free at the moment of asking*: another process may take it before our child binds it. Callers that start a
server on a port from here must therefore treat "address already in use" as retryable with a fresh port, as
:mod:`tidelog.broker.embedded` does.

A port the operator *gave* that is taken is not retried: :func:`port_is_free` checks it before a server starts,
and :class:`PortInUseError` says in one line which port, which server, and the setting that moves it.
"""

from __future__ import annotations

import contextlib
import errno
import socket

__all__ = ["PortInUseError", "free_port", "free_ports", "moved_by", "port_is_free"]


class PortInUseError(OSError):
    """A server cannot listen on the port it was given: another process holds it."""

    def __init__(self, what: str, host: str, port: int, remedy: str) -> None:
        self.what = what
        self.port = port
        self.remedy = remedy
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        super().__init__(f"{what} cannot listen on {address}: the port is in use by another process; {remedy}")


def moved_by(key: str) -> str:
    """The remedy for a taken port set by the broker setting ``key``: its flag, setting and variable."""
    flag = "--" + key.replace("_", "-")
    return f"choose another with {flag} PORT (setting {key}, TIDELOG_{key.upper()}; 0 picks a free port)"


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` right now (a bind test, as servers bind: with SO_REUSEADDR, so a
    port in TIME_WAIT counts as free). Any failure other than "address in use" (a host that is not local, say)
    counts as free here: the server's own start reports it."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


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
