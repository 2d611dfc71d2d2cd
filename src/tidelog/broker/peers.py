"""Wire-protocol connections from this broker to the others: for forwarding and for control requests.

A request that reaches a broker which cannot serve it alone — a Publish for a partition led elsewhere, a stream
change while another broker is the controller, a leader's ISR change — is sent on over the tidelog wire
protocol to the broker that can. Brokers are found by id in the metadata mirror (their registration carries the
wire address), and one pipelined connection per peer is kept and reused.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from tidelog.metadata.records import BrokerRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.connection import Connection, Response
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.frames import BytesLike
from tidelog.protocol.messages import Header
from tidelog.protocol.tls import SslSource

PEER_CONNECT_TIMEOUT = 2.0


class Peers:
    """One shared connection per other broker, opened on first use and replaced when it breaks."""

    def __init__(self, snapshot: Callable[[], MetadataSnapshot], *, ssl: SslSource | None = None) -> None:
        """``ssl``: the TLS context for each new connection (None: plaintext)."""
        self._snapshot = snapshot
        self._ssl = ssl
        self._connections: dict[str, tuple[str, Connection]] = {}
        self._opening: dict[str, asyncio.Future[Connection]] = {}

    def broker_record(self, broker_id: str) -> BrokerRecord | None:
        return self._snapshot().brokers.get(broker_id)

    def address_of(self, broker_id: str) -> str:
        broker = self._snapshot().brokers.get(broker_id)
        if broker is None:
            raise UnavailableError(f"broker {broker_id!r} is not alive in the cluster metadata")
        return f"{broker.host}:{broker.wire_port}"

    async def connection(self, broker_id: str) -> Connection:
        address = self.address_of(broker_id)
        known = self._connections.get(broker_id)
        if known is not None and known[0] == address and not known[1].closed:
            return known[1]
        pending = self._opening.get(broker_id)
        if pending is None:
            host, _, port = address.rpartition(":")
            ssl = self._ssl() if self._ssl is not None else None
            opening = Connection.open(host.strip("[]"), int(port), ssl=ssl, connect_timeout=PEER_CONNECT_TIMEOUT)
            pending = asyncio.ensure_future(opening)
            self._opening[broker_id] = pending
            try:
                connection = await pending
            finally:
                self._opening.pop(broker_id, None)
            if known is not None:
                with contextlib.suppress(Exception):
                    await known[1].close()
            self._connections[broker_id] = (address, connection)
            return connection
        return await asyncio.shield(pending)

    async def request(
        self,
        broker_id: str,
        header: Header,
        payload: BytesLike | Sequence[BytesLike] = b"",
        *,
        timeout: float,
    ) -> Response:
        """Send ``header`` to ``broker_id`` and await the answer (its errors raise as the broker sent them)."""
        connection = await self.connection(broker_id)
        return await connection.request(header, payload, timeout=timeout)

    async def close(self) -> None:
        connections, self._connections = self._connections, {}
        for _, connection in connections.values():
            with contextlib.suppress(Exception):
                await connection.close()
