"""Idempotent producing, the client's half: who the producer is, and stamping its batches with sequences.

The broker's half is :mod:`tidelog.replication.idempotence.producer_state`: per partition, a leader remembers the last
:data:`WINDOW` batches of each producer id and answers a retry of one of them with its original offsets instead
of writing it again. For that, every batch this producer sends carries, in its header, the producer's id and
epoch (a :class:`ProducerStamp`, from one ``INIT_PRODUCER`` request) and the sequence of its first record; the
records of one stamp on one partition are numbered 0, 1, 2, … without gaps (wrapping after :data:`MAX_SEQUENCE`).

:class:`ProducerIdentity` holds the stamp and its lifecycle (:class:`IdentityState`):

- ``NEEDED`` → ``INITIALIZING`` → ``READY``: ``INIT_PRODUCER`` is asked of any broker (it is the controller's to
  answer) once before the first batch, and again when the brokers have forgotten an anonymous producer
  (:meth:`ProducerIdentity.renew`);
- ``FAILED`` for good once fenced: a newer instance of a *named* producer took the name (PRODUCER_FENCED), or a
  named producer's sequences and the broker's disagree (see :mod:`tidelog.client.sender` for why that is fatal
  for a named producer only).

:func:`stamp_batch` rewrites the producer fields of a built batch (and its CRC) when a batch must be resent under
a new stamp or sequence: the records are not encoded or compressed again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Callable
from typing import NamedTuple

import crc32c

from tidelog.client.cluster import LEADER_RETRY_DELAYS, Cluster
from tidelog.protocol.connection import ConnectionClosedError
from tidelog.protocol.errors import TidelogError
from tidelog.protocol.messages import InitProducerRequest, InitProducerResponse
from tidelog.protocol.records import CRC_FIELD, CRC_POS, CRC_START
from tidelog.protocol.records.producers import MAX_SEQUENCE, WINDOW

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = WINDOW
"""Requests in flight per partition for an idempotent producer (Kafka's limit, for Kafka's reason): a retry of
any batch still unacknowledged must fall in the broker's window, or it would be refused as too old."""

# producer_id (int64), producer_epoch (int16), base_sequence (int32) at offset 43 of the batch header
# (the layout is drawn in tidelog.protocol.records).
_PRODUCER_FIELDS = struct.Struct(">qhi")
_PRODUCER_FIELDS_POS = 43


class ProducerStamp(NamedTuple):
    """The producer id and epoch that ``INIT_PRODUCER`` gave; every idempotent batch carries both."""

    producer_id: int
    epoch: int


NO_STAMP = ProducerStamp(-1, -1)  # what a batch carries before it is stamped (and a non-idempotent one, always)


def add_sequence(sequence: int, count: int) -> int:
    """The sequence ``count`` records after ``sequence`` (negative ``count`` goes back), wrapping as int32."""
    return (sequence + count) % (MAX_SEQUENCE + 1)


def stamp_batch(payload: bytes, stamp: ProducerStamp, base_sequence: int) -> bytes:
    """``payload`` (one built batch) with new producer fields and the CRC that covers them."""
    data = bytearray(payload)
    _PRODUCER_FIELDS.pack_into(data, _PRODUCER_FIELDS_POS, stamp.producer_id, stamp.epoch, base_sequence)
    CRC_FIELD.pack_into(data, CRC_POS, crc32c.crc32c(memoryview(data)[CRC_START:]))
    return bytes(data)


class IdentityState(enum.Enum):
    NEEDED = "needed"  # no usable stamp: before the first INIT_PRODUCER, or after a renewal failed
    INITIALIZING = "initializing"  # an INIT_PRODUCER is in progress; nothing is sent until it answers
    READY = "ready"
    FAILED = "failed"  # fenced (or otherwise beyond repair): every batch fails with ``failure``


class ProducerIdentity:
    """The stamp of one idempotent producer and its lifecycle (see the module docstring).

    ``name`` is ``None`` for an anonymous producer (a fresh id each time) and a stable string for a named one
    (the same id, and an epoch that fences every older instance). ``on_ready`` is called after each successful
    (re)initialization started by :meth:`renew`, ``on_failed`` after one that failed: the sender wakes, or
    fails, the partitions that waited.
    """

    def __init__(
        self,
        cluster: Cluster,
        name: str | None,
        *,
        on_ready: Callable[[], None],
        on_failed: Callable[[TidelogError], None],
    ) -> None:
        self.name = name
        self.stamp = NO_STAMP
        self.state = IdentityState.NEEDED
        self.failure: TidelogError | None = None  # set with FAILED
        self._cluster = cluster
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._task: asyncio.Task[None] | None = None

    @property
    def named(self) -> bool:
        return self.name is not None

    async def initialize(self) -> None:
        """Get a stamp now (the producer's start); raises what the last attempt raised."""
        if self.state is IdentityState.READY:
            return
        self._must_not_fail()
        self.state = IdentityState.INITIALIZING
        try:
            self.stamp = await self._init_producer()
        except BaseException:
            if self.state is IdentityState.INITIALIZING:
                self.state = IdentityState.NEEDED
            raise
        if self.state is IdentityState.INITIALIZING:
            self.state = IdentityState.READY

    def renew(self, stale: ProducerStamp) -> None:
        """Start getting a new stamp in the background, unless ``stale`` is already replaced (or being)."""
        if self.state is IdentityState.FAILED or self._task is not None:
            return
        if self.state is IdentityState.READY and stale != self.stamp:
            return
        self.state = IdentityState.INITIALIZING
        self._task = asyncio.get_running_loop().create_task(self._renew())

    def fail(self, failure: TidelogError) -> None:
        """Fail for good: the producer is fenced (the first failure is kept)."""
        if self.state is not IdentityState.FAILED:
            self.state = IdentityState.FAILED
            self.failure = failure

    def raise_if_failed(self) -> None:
        """Raise (a copy of) the failure once FAILED: a fenced producer sends nothing more."""
        self._must_not_fail()

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _must_not_fail(self) -> None:
        failure = self.failure
        if failure is not None:
            raise type(failure)(failure.message, retriable=False)

    async def _renew(self) -> None:
        try:
            stamp = await self._init_producer()
        except TidelogError as exc:
            log.warning("producer re-initialization failed: %s", exc)
            if self.state is IdentityState.INITIALIZING:
                self.state = IdentityState.NEEDED
            self._on_failed(exc)
        else:
            log.info("producer re-initialized: %s → %s", self.stamp, stamp)
            if self.state is IdentityState.INITIALIZING:
                self.stamp, self.state = stamp, IdentityState.READY
                self._on_ready()
        finally:
            self._task = None

    async def _init_producer(self) -> ProducerStamp:
        """``INIT_PRODUCER`` on any broker, retried through a controller failover (retriable errors only). A broker
        that failed is asked last next time: one that clients reach but that lost etcd answers nothing in time,
        and asking it again would never succeed."""
        request = InitProducerRequest(name=self.name or "")
        failure: TidelogError | None = None
        failed: set[tuple[str, int]] = set()
        for delay in (*LEADER_RETRY_DELAYS, None):
            connection = None
            try:
                connection = await self._cluster.any_connection(avoid=failed)
                response = await connection.request(request, timeout=self._cluster.request_timeout)
            except TidelogError as exc:
                if not exc.retriable and not isinstance(exc, ConnectionClosedError):
                    raise
                failure = exc
                address = self._cluster.address_of(connection) if connection is not None else None
                if address is not None:
                    failed.add(address)
            else:
                header = response.header
                assert isinstance(header, InitProducerResponse)
                return ProducerStamp(header.producer_id, header.producer_epoch)
            if delay is None:
                break
            await asyncio.sleep(delay)
        assert failure is not None
        raise failure
