"""What every client object needs from the cluster: bootstrap, connections to brokers, and cached metadata.

A :class:`Cluster` starts from bootstrap addresses (``"host:port"`` of any brokers' wire ports), learns the live
brokers and the streams' partitions and leaders from a METADATA request, and keeps one shared connection per
broker for requests that pipeline well together (produce, admin). Consumers ask for *dedicated* connections,
one per partition, because a long-polling fetch holds up every later reply on its connection (replies come back
in request order) and a tailing consumer must not delay its neighbours.

Metadata is cached per stream and refreshed on demand: the producer and the consumer call
:meth:`Cluster.stream` with ``refresh=True`` after a NOT_LEADER or a lost connection. A dead shared connection
is replaced on next use; nothing reconnects in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_
from collections.abc import Collection, Sequence

from tidelog.protocol.connection import Connection, ConnectionClosedError, Response
from tidelog.protocol.errors import (
    TidelogError,
    UnavailableError,
    UnknownPartitionError,
    UnknownStreamError,
    from_error_body,
)
from tidelog.protocol.frames import DEFAULT_MAX_RESPONSE_BYTES
from tidelog.protocol.messages import BrokerInfo, Header, MetadataRequest, MetadataResponse, PartitionInfo, StreamInfo
from tidelog.protocol.scram_login import scram_login

DEFAULT_BOOTSTRAP = "127.0.0.1:9293"


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:9293"`` for IPv6) → ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


LEADER_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4)
"""Seconds between attempts to find and reach a partition's leader (about 0.75 s in all: a failover)."""


class Cluster:
    """Connections and metadata shared by one client's producer, consumer and admin objects."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        ssl: ssl_.SSLContext | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        max_frame_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_in_flight: int = 1024,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        """``credentials`` (user, password): every connection logs in with SCRAM-SHA-256 once opened (brokers
        answer only over TLS, so give ``ssl`` too), for clients without a certificate."""
        addresses = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
        if not addresses:
            raise ValueError("at least one bootstrap address is needed")
        self._bootstrap = [parse_address(a) for a in addresses]
        self._ssl = ssl
        self._credentials = credentials
        self._connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._max_frame_bytes = max_frame_bytes
        self._max_in_flight = max_in_flight
        self._brokers: dict[str, BrokerInfo] = {}
        self._streams: dict[str, StreamInfo] = {}
        self._shared: dict[tuple[str, int], Connection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Future[Connection]] = {}
        self._dedicated: set[Connection] = set()

    # -- connections -------------------------------------------------------------------------------------------

    async def _open(self, host: str, port: int) -> Connection:
        connection = await Connection.open(
            host,
            port,
            ssl=self._ssl,
            connect_timeout=self._connect_timeout,
            max_frame_bytes=self._max_frame_bytes,
            max_in_flight=self._max_in_flight,
        )
        if self._credentials is not None:
            try:
                await scram_login(connection, *self._credentials, timeout=self.request_timeout)
            except BaseException:
                await connection.close()
                raise
        return connection

    async def connection(self, host: str, port: int) -> Connection:
        """The shared connection to ``host:port``, opened (once, even under concurrent callers) if needed."""
        key = (host, port)
        found = self._shared.get(key)
        if found is not None and not found.closed:
            return found
        pending = self._connecting.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._open(host, port))
            self._connecting[key] = pending
            try:
                self._shared[key] = await pending
            finally:
                del self._connecting[key]
            return self._shared[key]
        return await asyncio.shield(pending)

    async def any_connection(self, avoid: Collection[tuple[str, int]] = ()) -> Connection:
        """A connection to some broker: a known live one, else the bootstrap addresses in turn. Addresses in
        ``avoid`` (brokers that just failed a request: reachable, but perhaps cut off from etcd) are tried last."""
        candidates = list(dict.fromkeys([(b.host, b.port) for b in self._brokers.values()] + self._bootstrap))
        candidates.sort(key=lambda address: address in avoid)  # stable: the order is kept within each group
        failure: Exception | None = None
        for host, port in candidates:
            try:
                return await self.connection(host, port)
            except ConnectionClosedError as exc:
                failure = exc
        raise ConnectionClosedError(f"no tidelog broker reachable (tried {len(candidates)}): {failure}")

    def address_of(self, connection: Connection) -> tuple[str, int] | None:
        """The ``(host, port)`` of a shared connection this cluster opened (None for any other)."""
        return next((key for key, shared in self._shared.items() if shared is connection), None)

    def broker(self, broker_id: str) -> BrokerInfo:
        info = self._brokers.get(broker_id)
        if info is None:
            raise UnavailableError(f"broker {broker_id!r} is not in the cluster metadata")
        return info

    async def broker_connection(self, broker_id: str) -> Connection:
        """A new, unshared connection to broker ``broker_id`` of the metadata (``UnavailableError`` when the
        metadata does not know it); :meth:`release` closes it."""
        broker = self.broker(broker_id)
        connection = await self._open(broker.host, broker.port)
        self._dedicated.add(connection)
        return connection

    async def leader_connection(self, stream: str, partition: int, *, dedicated: bool = False) -> Connection:
        """A connection to the leader of ``stream``/``partition``; a new, unshared one when ``dedicated``.

        A leader that cannot be reached, or no leader at all, is usually a failover in progress: the cached
        metadata is dropped and asked for again, a few times with a short backoff, before giving up.
        """
        failure: TidelogError | None = None
        for attempt, delay in enumerate((*LEADER_RETRY_DELAYS, None)):
            info = await self.partition(stream, partition, refresh=attempt > 0)
            if info.leader is None:
                failure = UnavailableError(f"{stream}/{partition} has no leader right now")
            else:
                try:
                    broker = self.broker(info.leader)
                    if not dedicated:
                        return await self.connection(broker.host, broker.port)
                    connection = await self._open(broker.host, broker.port)
                    self._dedicated.add(connection)
                    return connection
                except (ConnectionClosedError, UnavailableError) as exc:
                    failure = exc
            self.forget(stream)
            if delay is None:
                break
            await asyncio.sleep(delay)
        assert failure is not None
        raise failure

    async def leader_request(self, stream: str, partition: int, request: Header) -> Response:
        """Send ``request`` to the leader of ``stream``/``partition`` and return its answer; a retriable error (a
        failover in progress) drops the cached metadata and tries again a few times with a short backoff."""
        for delay in (*LEADER_RETRY_DELAYS, None):
            try:
                connection = await self.leader_connection(stream, partition)
                return await connection.request(request, timeout=self.request_timeout)
            except TidelogError as exc:
                if not exc.retriable or delay is None:
                    raise
                self.forget(stream)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def release(self, connection: Connection) -> None:
        """Close a dedicated connection."""
        self._dedicated.discard(connection)
        await connection.close()

    # -- metadata ---------------------------------------------------------------------------------------------

    async def metadata(self, streams: Sequence[str] = ()) -> MetadataResponse:
        """Ask any broker for metadata (every stream when ``streams`` is empty) and update the cache."""
        connection = await self.any_connection()
        response = await connection.request(MetadataRequest(tuple(streams)), timeout=self.request_timeout)
        assert isinstance(response.header, MetadataResponse)
        meta = response.header
        if meta.brokers:
            self._brokers = {b.id: b for b in meta.brokers}
        for info in meta.streams:
            if info.error is None:
                self._streams[info.name] = info
            else:
                self._streams.pop(info.name, None)
        if not streams:
            listed = {s.name for s in meta.streams}
            for name in [n for n in self._streams if n not in listed]:
                del self._streams[name]
        return meta

    async def stream(self, name: str, *, refresh: bool = False) -> StreamInfo:
        """The stream's metadata, from the cache unless ``refresh``; UNKNOWN_STREAM if it does not exist."""
        info = None if refresh else self._streams.get(name)
        if info is None:
            meta = await self.metadata([name])
            for candidate in meta.streams:
                if candidate.name == name:
                    if candidate.error is not None:
                        raise from_error_body(candidate.error)
                    return candidate
            raise UnknownStreamError(f"no stream named {name!r}")
        return info

    def cached_stream(self, name: str) -> StreamInfo | None:
        """The cached metadata of ``name`` without any I/O (the producer's per-record fast path)."""
        return self._streams.get(name)

    async def partition(self, stream: str, partition: int, *, refresh: bool = False) -> PartitionInfo:
        info = await self.stream(stream, refresh=refresh)
        for p in info.partitions:
            if p.id == partition:
                return p
        raise UnknownPartitionError(f"stream {stream!r} has {len(info.partitions)} partitions, not {partition}")

    def forget(self, stream: str) -> None:
        """Drop a stream from the cache (after NOT_LEADER, deletion, …): the next use refreshes it."""
        self._streams.pop(stream, None)

    async def close(self) -> None:
        connections = [*self._shared.values(), *self._dedicated]
        self._shared.clear()
        self._dedicated.clear()
        for connection in connections:
            with contextlib.suppress(Exception):
                await connection.close()
