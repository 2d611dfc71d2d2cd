"""How many wire connections a broker keeps open, in all and per client address, and for how long idle ones stay.

A client that opens thousands of connections and sends nothing on them costs the broker a file descriptor and a
session each; with no bound it ends in ``EMFILE``, and then the broker can open neither a segment file nor a
connection for anyone else. :class:`ConnectionLimits` counts the open connections, in all
(``wire_max_connections``) and per peer address (``wire_max_connections_per_ip``, so one host cannot take every
connection). The server answers one over either limit with a single UNAVAILABLE error frame (correlation id 0,
the message naming the setting) and closes it before any request of it is read.

Both are off (0) by default, as Kafka's and Redpanda's are: replication counts too (a follower opens one
connection per partition it follows from a leader, and the brokers of a development cluster share 127.0.0.1),
so a right value depends on the cluster's size and on who can connect.

:func:`ensure_descriptors` makes a set limit honest: at start it raises the process's soft ``RLIMIT_NOFILE`` to
fit the wire connections plus a reserve for the broker's own files, and refuses to start (one clear line) when the
hard limit does not allow it, rather than failing later with ``EMFILE`` under load.

Idle connections (``wire_idle_timeout_ms``) are closed by the server's sweep (:meth:`WireServer._sweep_idle`):
a connection with nothing in flight that has sent no request for that long is told to stop reading, which closes
it once nothing is owed (Kafka's ``connections.max.idle.ms``).
"""

from __future__ import annotations

import resource
from collections import Counter

from tidelog.broker.config_values import ConfigError

__all__ = ["DESCRIPTOR_RESERVE", "ConnectionLimits", "ensure_descriptors"]

DESCRIPTOR_RESERVE = 1024
"""Descriptors kept for everything but client connections: segment and index files, the fetch replies' file ranges,
etcd and NATS links, the HTTP port, the embedded servers' pipes."""


class ConnectionLimits:
    """Open connections in all and by peer address, against their limits."""

    __slots__ = ("_by_address", "_open", "max_connections", "max_per_address")

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        """A limit of 0 is no limit."""
        if max_connections < 0 or max_per_address < 0:
            raise ValueError(f"connection limits are 0 (none) or more, not {max_connections} and {max_per_address}")
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._open = 0
        self._by_address: Counter[str] = Counter()

    @property
    def open(self) -> int:
        return self._open

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address`` and return None, or return why it is refused (then it is not
        counted): one line naming the limit and its setting."""
        if self.max_connections and self._open >= self.max_connections:
            return (
                f"this broker serves at most {self.max_connections} wire connections at once (wire_max_connections) "
                "and has that many open: try again later or another broker"
            )
        if self.max_per_address and self._by_address[address] >= self.max_per_address:
            return (
                f"this broker serves at most {self.max_per_address} wire connections at once from one address "
                f"(wire_max_connections_per_ip), and {address} has that many open"
            )
        self._open += 1
        self._by_address[address] += 1
        return None

    def release(self, address: str) -> None:
        """A connection :meth:`admit` counted has closed."""
        self._open -= 1
        left = self._by_address[address] - 1
        if left > 0:
            self._by_address[address] = left
        else:
            del self._by_address[address]


def ensure_descriptors(connections: int, reserve: int = DESCRIPTOR_RESERVE) -> int:
    """Make sure this process may open ``connections`` sockets plus ``reserve`` other files: raise the soft
    ``RLIMIT_NOFILE`` as far as needed (never lower it); raise :class:`ConfigError` when the hard limit is too
    low. ``connections`` 0 (no limit) changes nothing. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if not connections:
        return soft
    needed = connections + reserve
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed if soft == resource.RLIM_INFINITY else soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ConfigError(
            f"wire_max_connections allows {connections} connections, which with {reserve} descriptors for the "
            f"broker's own files needs an open-file limit of {needed}; this process "
            f"may open at most {hard} (ulimit -Hn): raise that limit or lower wire_max_connections"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed
