"""The asyncio producer: ``send()`` returns at once with a future; batching and sending happen behind it.

A thin facade (aiokafka's shape) over two parts:

- the :class:`~tidelog.client.accumulator.Accumulator` encodes each record into its partition's open batch
  (per-partition batches bounded by ``batch_size`` bytes, ``max_records`` records and ``linger_ms``);
- the :class:`~tidelog.client.sender.Sender` keeps up to ``max_in_flight`` produce requests in flight per
  partition on the leader's connection and resolves each record's future from the response.

::

    async with Producer("127.0.0.1:9293") as producer:
        future = await producer.send("orders", b"payload", key=b"customer-7")
        metadata = await future               # RecordMetadata(stream, partition, offset, timestamp)
        await producer.send_and_wait("orders", b"another")

Partitioning: an explicit ``partition`` wins; otherwise a keyed record goes to ``crc32(key) % partitions``
(Liftbridge's rule, so keys land where Liftbridge clients put them) and keyless records go round robin
(:class:`~tidelog.client.partitioner.DefaultPartitioner`).

Choosing settings. ``acks=Acks.ALL`` (the default) resolves a record's future once it is committed;
``Acks.NONE`` resolves it once the broker has the request, with offset -1. ``compression`` defaults to zstd
level 1 as ARCHITECTURE says; on loopback or a fast LAN ``Codec.NONE`` is faster because the CPU, not the
network, is the limit (see docs/performance.md). Throughput comes from large batches and several
requests in flight: with flush ``always`` every request waits for an fsync, and those of one partition share
one (group commit) only when several are in flight.

``send()`` waits when ``buffer_memory`` bytes are already waiting for acknowledgement: that is the producer's
backpressure. Apart from that and the first metadata lookup of a stream, it suspends only for one turn of the
event loop, when the record filled a batch that cannot go yet because ``max_in_flight`` requests are out. An
asyncio producer has no I/O thread: a loop of ``await send()`` that never yields would queue every batch behind
the first ``max_in_flight`` until it ends, and only then read their responses and send the rest. Yielding there
lets the responses in and the next batches out while the application is still sending (see
docs/performance.md).

Idempotence (the default, with ``Acks.ALL`` or ``Acks.LEADER``). On start the producer asks a broker for a
producer id and epoch (``INIT_PRODUCER``); every batch carries them and a per-partition sequence, so a batch
resent after a lost connection, a TIMEOUT or a leader failover is stored once and acknowledged with its
original offsets. Retries of every retriable error are then safe, and at most 5 requests are in flight per
partition (the batches a broker remembers per producer). ``producer_name`` makes it a *named* producer: a new
instance with the same name fences the older one, whose pending and later sends fail with
:class:`~tidelog.protocol.errors.ProducerFencedError`. The rules, and what happens when the broker and the producer
disagree about sequences, are in :mod:`tidelog.client.sender`. ``idempotent=False`` stamps nothing and retries
only refusals where nothing was stored; ``Acks.NONE`` is never idempotent (no answer, nothing to retry).
"""

from __future__ import annotations

import asyncio
import ssl as ssl_
import time
from collections.abc import Sequence
from types import TracebackType

from tidelog.client.accumulator import Accumulator, RecordMetadata
from tidelog.client.cluster import DEFAULT_BOOTSTRAP, Cluster
from tidelog.client.idempotence import ProducerIdentity, ProducerStamp
from tidelog.client.partitioner import DefaultPartitioner, Partitioner
from tidelog.client.sender import Sender
from tidelog.protocol.errors import MessageTooLargeError, TidelogError
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import Codec

Headers = Sequence[tuple[str, bytes]]


class Producer:
    """Produces records to tidelog streams over the wire protocol (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        cluster: Cluster | None = None,
        ssl: ssl_.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        acks: Acks = Acks.ALL,
        compression: Codec = Codec.ZSTD,
        batch_size: int = 512 * 1024,
        max_records: int = 65_536,
        linger_ms: float = 0.0,
        max_in_flight: int = 8,
        buffer_memory: int = 64 * 1024 * 1024,
        ack_timeout_ms: int = 0,
        retries: int = 3,
        retry_backoff_ms: int = 100,
        partitioner: Partitioner | None = None,
        idempotent: bool = True,
        producer_name: str | None = None,
        max_message_bytes: int = 1024 * 1024,
    ) -> None:
        """``cluster`` shares connections and metadata with other client objects (then ``bootstrap`` is
        unused and :meth:`close` leaves the cluster open). ``ack_timeout_ms`` 0 uses the broker's default.
        ``linger_ms`` 0 still batches the records sent within one turn of the event loop. ``idempotent`` and
        ``producer_name``: see the module docstring (a name needs idempotence, and acks other than NONE).
        ``max_message_bytes``: the largest record (key, value, header names and values) :meth:`send` accepts;
        set it as the brokers' setting of the same name (1 MiB by default)."""
        if batch_size < 1 or max_records < 1 or max_in_flight < 1 or buffer_memory < 1 or max_message_bytes < 1:
            raise ValueError(
                "batch_size, max_records, max_in_flight, buffer_memory and max_message_bytes must be positive"
            )
        if producer_name is not None and (not idempotent or Acks(acks) is Acks.NONE or not producer_name):
            raise ValueError("producer_name needs a non-empty name, idempotent=True and acks other than NONE")
        self._owns_cluster = cluster is None
        self._cluster = Cluster(bootstrap, ssl=ssl, credentials=credentials) if cluster is None else cluster
        self._acks = Acks(acks)
        self._codec = Codec(compression)
        self._batch_size = batch_size
        self._max_records = max_records
        self._linger_ms = linger_ms
        self._max_in_flight = max_in_flight
        self._buffer_memory = buffer_memory
        self._ack_timeout_ms = ack_timeout_ms
        self._retries = retries
        self._retry_backoff_ms = retry_backoff_ms
        self._partitioner: Partitioner = DefaultPartitioner() if partitioner is None else partitioner
        self._idempotent = idempotent and self._acks is not Acks.NONE
        self._producer_name = producer_name
        self._max_message_bytes = max_message_bytes
        self._identity: ProducerIdentity | None = None
        self._accumulator: Accumulator | None = None
        self._sender: Sender | None = None
        self._closed = False

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    @property
    def idempotent(self) -> bool:
        return self._idempotent

    @property
    def stamp(self) -> ProducerStamp | None:
        """The producer id and epoch its batches carry now (``None`` unless idempotent and started)."""
        return None if self._identity is None else self._identity.stamp

    async def start(self) -> None:
        """Set up on the running loop and reach a broker (fails fast when none is reachable); an idempotent
        producer also gets its id and epoch here, so a fenced or unsupported one fails before any send."""
        if self._sender is not None:
            return
        if self._closed:
            raise RuntimeError("the producer is closed")
        identity = None
        if self._idempotent:
            identity = ProducerIdentity(
                self._cluster,
                self._producer_name,
                on_ready=lambda: self._sender.identity_ready() if self._sender is not None else None,
                on_failed=lambda exc: self._sender.identity_failed(exc) if self._sender is not None else None,
            )
            await identity.initialize()
        if self._sender is not None:  # another start() finished first while this one waited
            return
        self._identity = identity
        self._sender = Sender(
            self._cluster,
            acks=self._acks,
            ack_timeout_ms=self._ack_timeout_ms,
            codec=self._codec,
            max_in_flight=self._max_in_flight,
            retries=self._retries,
            retry_backoff_ms=self._retry_backoff_ms,
            identity=identity,
            on_fatal=self._fail_pending,
        )
        self._accumulator = Accumulator(
            batch_size=self._batch_size,
            max_records=self._max_records,
            linger_ms=self._linger_ms,
            wake=self._sender.wake,
        )
        await self._cluster.any_connection()

    def _fail_pending(self, exc: TidelogError) -> None:
        """The producer is fenced: every record not yet acknowledged fails with ``exc`` now."""
        if self._accumulator is not None:
            for batch in list(self._accumulator.incomplete):
                batch.fail(exc)

    async def send(
        self,
        stream: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; return the future of its :class:`RecordMetadata` without waiting for the broker.

        ``timestamp`` is ns since the Unix epoch (now, when omitted). The future fails with the broker's
        :class:`~tidelog.protocol.errors.TidelogError` (e.g. ``UnknownStreamError``) if the record is refused.
        A record above ``max_message_bytes`` raises :class:`~tidelog.protocol.errors.MessageTooLargeError` here and
        joins no batch, so the records sent around it are not affected; a negative ``timestamp`` raises
        ``ValueError`` (brokers refuse timestamps before the Unix epoch, and those more than their
        ``max_timestamp_ahead_ms`` ahead of their clock).
        Suspends only for backpressure, a stream's first metadata lookup, or one loop turn after filling a
        batch the sender cannot take yet (module docstring).
        """
        future = await self._append(stream, value, key, headers, partition, timestamp)
        assert self._accumulator is not None
        buffer = self._accumulator.last  # nothing ran since the append
        if buffer.open is None and buffer.ready:  # this record sealed a batch, and it has to wait for a slot
            await asyncio.sleep(0)  # let responses in (they free slots) before the next records are encoded
        return future

    async def _append(
        self,
        stream: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        partition: int | None,
        timestamp: int | None,
    ) -> asyncio.Future[RecordMetadata]:
        """Encode the record into its partition's open batch (``send()`` without its yield)."""
        if (value is not None and len(value) > self._max_message_bytes) or key is not None or headers:
            self._check_record(value, key, headers)
        if timestamp is not None and timestamp < 0:
            raise ValueError(f"timestamp {timestamp} is negative: record timestamps are ns since the Unix epoch")
        accumulator = self._accumulator
        if accumulator is None:
            await self.start()
            accumulator = self._accumulator
            assert accumulator is not None
        if self._identity is not None:
            self._identity.raise_if_failed()
        if partition is None:
            info = self._cluster.cached_stream(stream) or await self._cluster.stream(stream)
            count = len(info.partitions)
            partition = self._partitioner.partition(stream, key, count) if count > 1 else 0
        if accumulator.buffered >= self._buffer_memory:
            await self._wait_for_memory(accumulator)
        return accumulator.append(
            stream, partition, value, key, headers or (), time.time_ns() if timestamp is None else timestamp
        )

    def _check_record(self, value: bytes | None, key: bytes | None, headers: Headers | None) -> None:
        """Refuse a record above ``max_message_bytes`` before it joins a batch: the broker would refuse the whole
        batch, and with it every other record in it."""
        size = len(value or b"") + len(key or b"") + sum(len(name.encode()) + len(data) for name, data in headers or ())
        if size > self._max_message_bytes:
            raise MessageTooLargeError(
                f"record of {size} bytes (key, value and headers) is above max_message_bytes "
                f"({self._max_message_bytes}); nothing was sent"
            )

    async def send_and_wait(
        self,
        stream: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> RecordMetadata:
        """:meth:`send` one record and wait for its acknowledgement; its batch goes at once (no linger), the
        batches of other partitions are left to fill up."""
        future = await self._append(stream, value, key, headers, partition, timestamp)
        accumulator, sender = self._accumulator, self._sender
        assert accumulator is not None and sender is not None
        buffer = accumulator.last  # nothing ran between the append and here
        accumulator.seal(buffer)
        sender.wake(buffer)
        return await future

    async def _wait_for_memory(self, accumulator: Accumulator) -> None:
        """Wait until batches complete and release enough of ``buffer_memory`` (open batches still linger or
        fill up: sealing them early would only make smaller batches)."""
        while accumulator.buffered >= self._buffer_memory and accumulator.incomplete:
            await asyncio.wait([b.done for b in accumulator.incomplete], return_when=asyncio.FIRST_COMPLETED)

    async def flush(self) -> None:
        """Send every queued record now and wait until each one has its outcome (none raises here)."""
        accumulator = self._accumulator
        if accumulator is None:
            return
        assert self._sender is not None
        pending = [batch.done for batch in accumulator.incomplete]
        for buffer in accumulator.make_all_due():
            self._sender.wake(buffer)
        if pending:
            await asyncio.gather(*pending)

    async def close(self) -> None:
        """Flush, then release connections (the cluster's too, unless it was passed in)."""
        if self._closed:
            return
        try:
            await self.flush()
            if self._sender is not None:
                await self._sender.close()
        finally:
            if self._identity is not None:
                await self._identity.close()
            self._closed = True
            if self._owns_cluster:
                await self._cluster.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
