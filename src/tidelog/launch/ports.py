"""Free loopback ports for servers started by tests and by ``tidelog serve``.

Ports come from *below* the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), chosen at random and
bind-tested. Ports the kernel hands out for port 0 sit inside that range, and so does the source port of every
outgoing connection: a port chosen there could be taken by some client's connect() in the second before our child
binds it (CI lost three test servers that way). Below the range only listeners compete. A port is still only
*free at the moment of asking*, so callers that start a server on a port from here treat "address already in
use" as retryable with a fresh port, as :mod:`tidelog.broker.embedded` does.

A port the operator *gave* that is taken is not retried: :func:`port_is_free` checks it before a server starts,
and :class:`PortInUseError` says in one line which port, which server, and the setting that moves it.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket
from pathlib import Path

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


_LOWEST = 10_000  # below this live well-known services (etcd 2379, NATS 4222, Prometheus 9090, ...)
_TRIES = 200  # random picks per port before falling back to the kernel's choice
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct free TCP ports on ``host``, outside the ephemeral range (see the module docstring).

    All the sockets stay bound until every port is chosen, so one call never hands out the same port twice.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    top = _ephemeral_low()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(_family(host), socket.SOCK_STREAM))
            ports.append(_bind_unused(sock, host, top))
        return ports


def _bind_unused(sock: socket.socket, host: str, top: int) -> int:
    """Bind ``sock`` to a random unused port in ``[_LOWEST, top)``, or where the kernel puts port 0 if none is."""
    # No SO_REUSEADDR: the port must be genuinely unused, not merely in TIME_WAIT.
    for _ in range(_TRIES if top > _LOWEST else 0):
        port = random.randrange(_LOWEST, top)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                continue
            raise
        return port
    sock.bind((host, 0))
    return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port the kernel may hand to an outgoing connection (Linux's default is 32768)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768
