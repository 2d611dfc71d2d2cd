"""The producer's accumulator: records become per-partition batches, encoded as they arrive.

Each partition being produced to has a :class:`PartitionBuffer`: at most one *open* batch that records are
appended to, then a FIFO of *ready* batches waiting for an in-flight slot. A batch is sealed (moved to ready)
when it reaches ``batch_size`` bytes or ``max_records`` records; an open batch is also *due* once it has
lingered ``linger_ms``, or when the producer is flushing. The sender (:mod:`tidelog.client.sender`) takes
ready and due batches in order, so records of one partition are sent, and land, in the order of ``send()``.

A record is encoded into its batch's :class:`~tidelog.protocol.records.BatchBuilder` inside ``append``: the
per-record work of the producer is that call plus one future, and building the batch (join, compression,
CRC) happens once per batch when the sender takes it.

An idempotent producer's batches also carry a :class:`~tidelog.client.idempotence.ProducerStamp` and a base
sequence, given by the sender when it first takes the batch (so in the order the batches go out) and kept
across retries; :meth:`PartitionBuffer.take_in_order` is the stricter ``take`` that keeping sequences without
gaps needs.

Everything here runs on the event loop thread and is synchronous; memory is accounted in encoded bytes so
that the producer can make ``send()`` wait when ``buffer_memory`` is used up.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from tidelog.client.idempotence import NO_STAMP
from tidelog.protocol.records import HEADER_SIZE, BatchBuilder

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tidelog.protocol.connection import Connection


class RecordMetadata(NamedTuple):
    """Where a produced record landed. ``offset`` is -1 under ``Acks.NONE`` (the broker does not say).

    A NamedTuple, not a dataclass: one is made per record acknowledged, and tuples are the cheapest to build.
    """

    stream: str
    partition: int
    offset: int
    timestamp: int  # ns since the Unix epoch, as stored


class ProducerBatch:
    """One batch on its way: the builder, and one future per record, resolved when the broker answers."""

    __slots__ = (
        "accounted",
        "attempts",
        "builder",
        "done",
        "doubt",
        "due",
        "futures",
        "order",
        "payload",
        "sequence",
        "stamp",
        "timestamps",
    )

    def __init__(self, first_timestamp: int, loop: asyncio.AbstractEventLoop) -> None:
        self.builder = BatchBuilder(first_timestamp)
        self.futures: list[asyncio.Future[RecordMetadata]] = []
        self.timestamps: list[int] = []
        self.due = False  # lingered long enough (or flushing): send even if not full
        self.done: asyncio.Future[None] = loop.create_future()  # resolved when every record has its outcome
        self.payload: bytes | None = None  # the built batch, kept for a retry
        self.attempts = 0
        self.accounted = 0  # bytes of the record section counted in the accumulator's ``buffered``
        # Idempotent producers only (set by the sender when it stamps the batch; ``payload`` carries them):
        self.stamp = NO_STAMP
        self.sequence = -1  # base sequence
        self.order = -1  # position among the partition's stamped batches: retries are queued by it
        # The first failure of a send that may have stored it all the same (lost connection, TIMEOUT): if the
        # batch is given up, its records fail with this — "maybe written" — whatever the last attempt said.
        self.doubt: BaseException | None = None

    @property
    def nbytes(self) -> int:
        return self.accounted + HEADER_SIZE

    def complete(self, stream: str, partition: int, base_offset: int) -> None:
        """Resolve every record's future with its offset (base + position; -1 when ``base_offset`` is -1)."""
        new, cls = tuple.__new__, RecordMetadata  # RecordMetadata._make, minus a Python-level call per record
        offset = base_offset
        step = 1 if base_offset >= 0 else 0
        for future, stamp in zip(self.futures, self.timestamps, strict=True):
            if not future.done():
                future.set_result(new(cls, (stream, partition, offset, stamp)))
            offset += step
        self._finish()

    def fail(self, exc: BaseException) -> None:
        """Fail every record's future with ``exc``, and report the failure once for the batch.

        A caller may send without ever awaiting a record's future (fire and forget, then ``flush``, which never
        raises): the producer's own warning is then what tells of records that were not acknowledged, once per
        batch, when it happens. The futures are marked as looked at, so asyncio does not add a "Future exception
        was never retrieved" with a traceback for each record when they are collected; awaiting one still
        raises ``exc``.
        """
        failed = 0
        for future in self.futures:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: reported below, once
                failed += 1
        if failed:
            log.warning("%d produced record(s) failed, not acknowledged: %s", failed, exc)
        self._finish()

    def _finish(self) -> None:
        self.payload = None
        if not self.done.done():
            self.done.set_result(None)


class PartitionBuffer:
    """The batches of one partition: the open one, the ready ones, and how many requests are in flight."""

    __slots__ = (
        "connection",
        "draining",
        "in_flight",
        "key",
        "linger",
        "next_sequence",
        "open",
        "paused",
        "ready",
        "refused",
        "resolving",
        "retry",
        "stamp",
        "stamped",
    )

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.open: ProducerBatch | None = None
        self.ready: deque[ProducerBatch] = deque()
        self.retry: deque[ProducerBatch] = deque()  # refused by the broker with nothing stored: resent first
        self.in_flight = 0
        self.linger: asyncio.Handle | None = None
        self.connection: Connection | None = None  # the leader's connection; set and reset by the sender
        self.resolving = False  # the sender is looking up the leader's connection
        # Idempotent producers only: the stamp and next sequence of this partition's batches; ``draining`` while
        # a failure waits for every request in flight to come back; ``refused`` lists the (order, records) of
        # batches refused for good while draining, whose sequences the batches after them take over.
        self.stamp = NO_STAMP
        self.next_sequence = 0
        self.stamped = 0  # batches stamped so far: the next one's ``order``
        self.draining = False
        self.paused = False  # backing off before a retry
        self.refused: list[tuple[int, int]] = []

    def take(self) -> ProducerBatch | None:
        """The next batch to send, if one may go: retries first, then ready ones, then the open one if due.

        While retries wait, nothing is sent until every earlier request has come back, so a resent batch
        cannot land after one that was sent behind it.
        """
        if self.retry:
            return None if self.in_flight else self.retry.popleft()
        return self._take_new()

    def take_in_order(self) -> ProducerBatch | None:
        """:meth:`take` for an idempotent producer: nothing while draining, then every retry (pipelined) first.

        The broker refuses a sequence gap, so after a failure every unacknowledged batch goes again, in order —
        the sender ends draining once nothing is in flight, when ``retry`` holds all of them.
        """
        if self.draining:
            return None
        if self.retry:
            return self.retry.popleft()
        return self._take_new()

    def requeue(self, batch: ProducerBatch) -> None:
        """Queue a batch to be resent, before every later one (by ``order``), whatever order it came back in."""
        retry = self.retry
        if not retry or retry[-1].order < batch.order:
            retry.append(batch)
            return
        index = next(i for i, queued in enumerate(retry) if queued.order > batch.order)
        retry.insert(index, batch)

    def _take_new(self) -> ProducerBatch | None:
        if self.ready:
            return self.ready.popleft()
        batch = self.open
        if batch is not None and batch.due:
            self.open = None
            if self.linger is not None:
                self.linger.cancel()
                self.linger = None
            return batch
        return None


class Accumulator:
    """Per-partition batching with size, count and linger limits (see the module docstring).

    ``wake(buffer)`` is called whenever ``buffer`` gets something to send: a batch sealed (synchronously, from
    :meth:`append`) or an open batch due (from a loop callback). With ``linger_ms=0`` an open batch is due at
    the next turn of the event loop rather than at once, so records sent in one burst still share a batch.
    """

    def __init__(
        self, *, batch_size: int, max_records: int, linger_ms: float, wake: Callable[[PartitionBuffer], None]
    ) -> None:
        self.batch_size = batch_size
        self.max_records = max_records
        self.linger = linger_ms / 1000
        self.buffers: dict[tuple[str, int], PartitionBuffer] = {}
        self.buffered = 0  # encoded bytes of batches not yet completed: what buffer_memory limits
        self.incomplete: set[ProducerBatch] = set()
        self.last = PartitionBuffer(("", 0))  # the buffer of the latest append (send_and_wait expedites it)
        self._wake = wake
        self._loop = asyncio.get_running_loop()

    def append(
        self,
        stream: str,
        partition: int,
        value: bytes | None,
        key: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        timestamp: int,
    ) -> asyncio.Future[RecordMetadata]:
        """Encode one record into its partition's open batch; return the record's future."""
        buffer = self.buffers.get((stream, partition))
        if buffer is None:
            buffer = self.buffers[(stream, partition)] = PartitionBuffer((stream, partition))
        self.last = buffer
        batch = buffer.open
        if batch is None:
            batch = self._open(buffer, timestamp)
        size = batch.builder.append(value, key, headers, timestamp)
        self.buffered += size - batch.accounted
        batch.accounted = size
        future: asyncio.Future[RecordMetadata] = self._loop.create_future()
        futures = batch.futures
        futures.append(future)
        batch.timestamps.append(timestamp)
        if size >= self.batch_size or len(futures) >= self.max_records:
            self.seal(buffer)
            self._wake(buffer)
        return future

    def _open(self, buffer: PartitionBuffer, timestamp: int) -> ProducerBatch:
        """Start the open batch of ``buffer``, due after ``linger_ms`` (or on the next loop turn)."""
        batch = buffer.open = ProducerBatch(timestamp, self._loop)
        self.incomplete.add(batch)
        self.buffered += HEADER_SIZE
        batch.done.add_done_callback(functools.partial(self._release, batch))
        if self.linger > 0:
            buffer.linger = self._loop.call_later(self.linger, self._lingered, buffer, batch)
        else:
            buffer.linger = self._loop.call_soon(self._lingered, buffer, batch)
        return batch

    def seal(self, buffer: PartitionBuffer) -> None:
        """Move the open batch, due from now on, to the ready queue."""
        batch = buffer.open
        if batch is None:
            return
        buffer.open = None
        if buffer.linger is not None:
            buffer.linger.cancel()
            buffer.linger = None
        batch.due = True
        buffer.ready.append(batch)

    def make_all_due(self) -> list[PartitionBuffer]:
        """Flushing: every open batch may go now. Returns the buffers that have something to send."""
        waiting = []
        for buffer in self.buffers.values():
            if buffer.open is not None:
                self.seal(buffer)
            if buffer.ready:
                waiting.append(buffer)
        return waiting

    def _lingered(self, buffer: PartitionBuffer, batch: ProducerBatch) -> None:
        if buffer.open is batch:
            buffer.linger = None
            batch.due = True
            self._wake(buffer)

    def _release(self, batch: ProducerBatch, _done: asyncio.Future[None]) -> None:
        self.incomplete.discard(batch)
        self.buffered -= batch.nbytes
