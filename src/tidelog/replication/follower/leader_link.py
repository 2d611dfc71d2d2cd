"""A fetcher's wire connection to its leader: one pipelined connection, and requests answered within a deadline.

The connection is dedicated to one fetcher (its fetches long-poll at the leader's log end, so sharing it would put
other requests behind them) and is opened again after every failure: the fetcher decides when
(:mod:`tidelog.replication.follower.fetcher`). A request that is not answered in time raises :class:`TimeoutError`,
and a lost connection :class:`~tidelog.protocol.connection.ConnectionClosedError`: both mean the leader is out
of reach.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

from tidelog.deadline import within
from tidelog.protocol.connection import Connection, ConnectionClosedError, Response
from tidelog.protocol.frames import DEFAULT_MAX_RESPONSE_BYTES, ProtocolError
from tidelog.protocol.messages import Header
from tidelog.protocol.tls import SslSource

H = TypeVar("H", bound=Header)


class LeaderLink:
    """The connection to one leader, opened and closed by the fetcher that owns it."""

    def __init__(
        self, leader_id: str, leader_address: str, connect_timeout: float, *, ssl: SslSource | None = None
    ) -> None:
        """``ssl``: the TLS context for each new connection (None: plaintext)."""
        self._ssl = ssl
        self._leader_id = leader_id
        self._address = leader_address
        self._host, self._port = split_address(leader_address)
        self._connect_timeout = connect_timeout
        self._connection: Connection | None = None

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def open(self) -> None:
        self._connection = await Connection.open(
            self._host,
            self._port,
            ssl=self._ssl() if self._ssl is not None else None,
            connect_timeout=self._connect_timeout,
            max_frame_bytes=DEFAULT_MAX_RESPONSE_BYTES,
            max_in_flight=4,
        )

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()

    def request(self, request: Header) -> asyncio.Future[Response]:
        """Write ``request`` to the leader now; the future of its response."""
        connection = self._connection
        if connection is None:
            raise ConnectionClosedError(f"not connected to leader {self._leader_id} at {self._address}")
        return connection.send(request)

    async def send(self, request: Header, timeout: float) -> tuple[Header, memoryview]:
        """Send ``request`` and wait at most ``timeout`` seconds for its response."""
        return await response_of(self.request(request), timeout)


async def response_of(pending: asyncio.Future[Response], timeout: float) -> tuple[Header, memoryview]:
    """The header and payload of a response already asked for, within ``timeout`` seconds."""
    response = await within(pending, timeout)  # not asyncio.timeout: see tidelog.deadline
    return response.header, response.payload


def expect(header: Header, cls: type[H]) -> H:
    """``header`` as the response type asked for; any other is a protocol error."""
    if not isinstance(header, cls):
        raise ProtocolError(f"expected a {cls.__name__}, the leader answered a {type(header).__name__}")
    return header


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) as ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"leader address {address!r} is not host:port")
    return host.strip("[]"), int(port)
