"""The producer's sender: takes batches from the accumulator and keeps several produce requests in flight.

No task per request and no loop polling queues: :meth:`Sender.wake` runs synchronously whenever a partition
buffer may have something to send (a batch sealed or lingered, a response freed an in-flight slot, a retry
came due). It takes batches in order while the partition has fewer than ``max_in_flight`` requests
outstanding, builds each one (join, compression, CRC: once per batch), and writes it on the leader's
connection at once with :meth:`Connection.send`. Because the broker starts appends in arrival order and
answers in request order, records of a partition land in the order they were sent, and each response
resolves its batch's record futures in a done-callback.

Retries without idempotence. Only refusals where the broker stored nothing are retried (up to ``retries``
times, after ``retry_backoff_ms``): NOT_LEADER (metadata is refreshed and the new leader asked) and
NOT_ENOUGH_REPLICAS. A retried batch waits until every request sent before it has come back, then goes first,
so order holds. Anything else fails the batch's records: in particular a lost connection or a TIMEOUT after the
write, where the batch may be stored — resending it could store it twice.

Retries of an idempotent producer (``identity`` given; :mod:`tidelog.client.idempotence`). Each batch is
stamped with the producer id, epoch and the partition's next sequence when it is first taken, and keeps them
(and its bytes) across retries, so a resent batch the leader already wrote is answered with its original
offsets. That makes every retriable error safe to retry — a lost connection, TIMEOUT after the write,
NOT_LEADER, NOT_ENOUGH_REPLICAS, DUPLICATE_IN_FLIGHT — up to ``retries`` times each. The broker refuses a
sequence gap, so a failure puts the partition in *draining*: nothing more goes out until every request in
flight has come back (those behind the failed one are refused with OUT_OF_ORDER_SEQUENCE, which here is no
disagreement, only the gap, and costs them no attempt); then, after the backoff, every unacknowledged batch
goes again in sequence order, pipelined, before any new one. At most :data:`MAX_IN_FLIGHT` (5) requests are in
flight per partition, the batches a broker remembers per producer, so any retry falls in its window. A batch
refused for good (MESSAGE_TOO_LARGE, …: nothing stored) leaves a hole the batches after it move down into.

Disagreements, and what this side does about them:

- PRODUCER_FENCED: a newer instance of this named producer exists. Fatal: every pending record fails with it
  and further sends raise it.
- OUT_OF_ORDER_SEQUENCE or UNKNOWN_PRODUCER on a partition's first unacknowledged batch: the broker's sequence
  state and ours differ (the producer expired, a batch given up on was not stored, an acknowledged batch was
  lost by an unclean failover). An *anonymous* producer re-initializes (a new id, sequences from 0) and resends
  its unacknowledged batches under it, except a batch *in doubt* (sent, its outcome lost): it may be stored
  under the old stamp, and resent under a new one it would be stored twice. So on every partition the batches
  in doubt go first, again under the stamp they were written with, where the broker answers a stored one as
  a duplicate; a batch in doubt refused there (the broker forgot that stamp too, as on the partition whose
  refusal started it all) fails with its first error: its outcome cannot be known (resent under the new
  stamp, such batches were stored twice: the nemesis found it). A *named* producer does
  not re-initialize: that takes the name's next epoch, which would fence a newer instance that may have
  replaced this one (a zombie would win), so the error is fatal as fencing is — a new instance, started by the
  application, takes over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from tidelog.client.accumulator import PartitionBuffer, ProducerBatch
from tidelog.client.cluster import Cluster
from tidelog.client.idempotence import (
    MAX_IN_FLIGHT,
    IdentityState,
    ProducerIdentity,
    add_sequence,
    stamp_batch,
)
from tidelog.protocol.connection import Connection, ConnectionClosedError, Response
from tidelog.protocol.errors import (
    FencedLeaderEpochError,
    InternalError,
    NotEnoughReplicasError,
    NotLeaderError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TidelogError,
    UnavailableError,
    UnknownProducerError,
    from_error_body,
)
from tidelog.protocol.messages import Acks, ProduceRequest, ProduceResponse
from tidelog.protocol.records import Codec

log = logging.getLogger(__name__)

_RETRIABLE = (NotLeaderError, NotEnoughReplicasError)  # refused before anything was appended
_NOTHING_STORED = (*_RETRIABLE, OutOfOrderSequenceError, UnknownProducerError)  # refused, not in doubt
_STALE_ROUTE = (NotLeaderError, FencedLeaderEpochError, UnavailableError)  # ask for the leader again
_SEQUENCE_REFUSALS = (OutOfOrderSequenceError, UnknownProducerError)


def _maybe_stored(exc: BaseException) -> bool:
    """Whether a failed produce may have been written all the same: a lost answer, not a refusal."""
    if not isinstance(exc, TidelogError) or isinstance(exc, InternalError):
        return True
    return exc.retriable and not isinstance(exc, _NOTHING_STORED)


def _in_doubt_first(buffer: PartitionBuffer) -> bool:
    """Whether the partition's next batch to resend may already be stored under the partition's current stamp:
    it must be resent under that stamp, so that the broker can answer it as a duplicate."""
    return bool(buffer.retry) and buffer.retry[0].doubt is not None and buffer.retry[0].stamp == buffer.stamp


def _give_up(batch: ProducerBatch, exc: BaseException) -> None:
    """Fail a batch. One that may have been written by an earlier attempt fails with that attempt's error
    (e.g. a lost connection: outcome unknown), not with a later refusal that would claim nothing was stored."""
    doubt = batch.doubt
    if doubt is None or _maybe_stored(exc):
        batch.fail(exc)
    elif isinstance(doubt, TidelogError):
        message = f"{doubt.message} (may be written; the last retry got: {exc})"
        batch.fail(type(doubt)(message, retriable=doubt.retriable))
    else:
        batch.fail(doubt)


class Sender:
    """Moves batches from partition buffers to the brokers (see the module docstring).

    ``identity`` makes it an idempotent producer's sender; ``on_fatal`` is then called once the producer can
    send no more (fenced): the producer fails every record still pending.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        acks: Acks,
        ack_timeout_ms: int,
        codec: Codec,
        max_in_flight: int,
        retries: int,
        retry_backoff_ms: int,
        identity: ProducerIdentity | None = None,
        on_fatal: Callable[[TidelogError], None] | None = None,
    ) -> None:
        self._cluster = cluster
        self._acks = acks
        self._ack_timeout_ms = ack_timeout_ms
        self._codec = codec
        self._max_in_flight = max_in_flight if identity is None else min(max_in_flight, MAX_IN_FLIGHT)
        self._retries = retries
        self._backoff = retry_backoff_ms / 1000
        self._identity = identity
        self._on_fatal = on_fatal
        self._waiting: set[PartitionBuffer] = set()  # buffers that wait for the identity to be (re)initialized
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def wake(self, buffer: PartitionBuffer) -> None:
        """Send what ``buffer`` may send now; look up its leader first if it has no live connection."""
        if self._identity is not None:
            self._wake_in_order(buffer, self._identity)
            return
        connection = self._connection(buffer)
        if connection is None:
            return
        stream, partition = buffer.key
        while buffer.in_flight < self._max_in_flight:
            batch = buffer.take()
            if batch is None:
                return
            if batch.payload is None:
                batch.payload = batch.builder.build(codec=self._codec)
            batch.attempts += 1
            request = ProduceRequest(stream, partition, self._acks, self._ack_timeout_ms)
            try:
                future = connection.send(request, batch.payload)
            except ConnectionClosedError as exc:
                batch.fail(exc)
                buffer.connection = None
                continue
            buffer.in_flight += 1
            future.add_done_callback(functools.partial(self._on_response, buffer, batch))

    def _connection(self, buffer: PartitionBuffer) -> Connection | None:
        """The leader's live connection, or ``None`` after starting to look it up."""
        connection = buffer.connection
        if connection is not None and not connection.closed:
            return connection
        if connection is not None:  # the leader went away: its metadata is stale too
            self._cluster.forget(buffer.key[0])
        buffer.connection = None
        if not buffer.resolving and (buffer.ready or buffer.retry or buffer.open is not None):
            buffer.resolving = True
            task = self._loop.create_task(self._resolve(buffer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return None

    async def _resolve(self, buffer: PartitionBuffer) -> None:
        stream, partition = buffer.key
        try:
            buffer.connection = await self._cluster.leader_connection(stream, partition)
        except TidelogError as exc:
            log.debug("cannot reach the leader of %s/%d: %s", stream, partition, exc)
            self._fail_queued(buffer, exc)
        finally:
            buffer.resolving = False
        if buffer.connection is not None:
            self.wake(buffer)

    def _on_response(self, buffer: PartitionBuffer, batch: ProducerBatch, future: asyncio.Future[Response]) -> None:
        buffer.in_flight -= 1
        stream, partition = buffer.key
        if future.cancelled():
            batch.fail(ConnectionClosedError("the produce request was cancelled"))
        elif (exc := future.exception()) is not None:
            if isinstance(exc, _RETRIABLE) and batch.attempts <= self._retries:
                log.debug("retrying a batch for %s/%d after %s", stream, partition, exc)
                buffer.retry.append(batch)
                if isinstance(exc, NotLeaderError):
                    buffer.connection = None
                    self._cluster.forget(stream)
                self._loop.call_later(self._backoff, self.wake, buffer)
                return
            batch.fail(exc)
        else:
            response = future.result().header
            assert isinstance(response, ProduceResponse)
            if response.error is not None:
                batch.fail(from_error_body(response.error))
            else:
                batch.complete(stream, partition, response.base_offset)
        self.wake(buffer)

    # -- idempotent producing ------------------------------------------------------------------------------------

    def _wake_in_order(self, buffer: PartitionBuffer, identity: ProducerIdentity) -> None:
        """:meth:`wake` for an idempotent producer: stamps batches, keeps sequences gapless (module docstring)."""
        if identity.state is not IdentityState.READY:
            if identity.state is IdentityState.FAILED:
                assert identity.failure is not None
                self._fail_queued(buffer, identity.failure)
                return
            self._waiting.add(buffer)
            identity.renew(identity.stamp)  # NEEDED: start; INITIALIZING: already on its way
            return
        if buffer.paused:
            return
        connection = self._connection(buffer)
        if connection is None:
            return
        if buffer.draining:
            if buffer.in_flight:
                return
            self._end_draining(buffer)
        if buffer.stamp != identity.stamp:
            if buffer.in_flight:
                return  # requests under the old stamp are out: the new sequence line starts after them
            if not _in_doubt_first(buffer):
                buffer.stamp, buffer.next_sequence, buffer.refused = identity.stamp, 0, []
        stream, partition = buffer.key
        while buffer.in_flight < self._max_in_flight:
            if buffer.stamp != identity.stamp and not _in_doubt_first(buffer):
                return  # the old stamp's batches in doubt are out; the rest go under the new one after them
            batch = buffer.take_in_order()
            if batch is None:
                return
            self._stamp(buffer, batch)
            assert batch.payload is not None
            batch.attempts += 1
            request = ProduceRequest(stream, partition, self._acks, self._ack_timeout_ms)
            try:
                future = connection.send(request, batch.payload)
            except ConnectionClosedError as exc:
                buffer.connection = None
                self._on_failure(buffer, batch, exc)
                return
            buffer.in_flight += 1
            future.add_done_callback(functools.partial(self._on_response_in_order, buffer, batch))

    def _stamp(self, buffer: PartitionBuffer, batch: ProducerBatch) -> None:
        """Give a batch the partition's stamp and next sequence, unless it has them (a retry: same bytes)."""
        if batch.stamp != buffer.stamp:
            batch.stamp, batch.sequence = buffer.stamp, buffer.next_sequence
            batch.order = buffer.stamped
            buffer.stamped += 1
            buffer.next_sequence = add_sequence(buffer.next_sequence, len(batch.futures))
            if batch.payload is not None:  # resent under a new stamp: only the header changes
                batch.payload = stamp_batch(batch.payload, batch.stamp, batch.sequence)
        if batch.payload is None:
            stamp = batch.stamp
            batch.payload = batch.builder.build(
                codec=self._codec,
                producer_id=stamp.producer_id,
                producer_epoch=stamp.epoch,
                base_sequence=batch.sequence,
            )

    def _end_draining(self, buffer: PartitionBuffer) -> None:
        """Nothing is in flight any more: ``retry`` holds every unacknowledged batch, in order. Batches refused
        for good left holes in the sequence line; the batches after each hole move down to close it."""
        buffer.draining = False
        refused, buffer.refused = buffer.refused, []
        if not refused:
            return
        for batch in buffer.retry:
            shift = sum(count for order, count in refused if order < batch.order)
            if shift and batch.stamp == buffer.stamp and batch.payload is not None:
                batch.sequence = add_sequence(batch.sequence, -shift)
                batch.payload = stamp_batch(batch.payload, batch.stamp, batch.sequence)
        buffer.next_sequence = add_sequence(buffer.next_sequence, -sum(count for _, count in refused))

    def _on_response_in_order(
        self, buffer: PartitionBuffer, batch: ProducerBatch, future: asyncio.Future[Response]
    ) -> None:
        buffer.in_flight -= 1
        if batch.done.done():  # failed already: the producer was fenced
            self.wake(buffer)
            return
        failure: BaseException | None
        if future.cancelled():
            failure = ConnectionClosedError("the produce request was cancelled")
        elif (failure := future.exception()) is None:
            response = future.result().header
            assert isinstance(response, ProduceResponse)
            if response.error is not None:
                failure = from_error_body(response.error)
            else:
                if buffer.refused:  # stored after them: the holes they seemed to leave are not there
                    buffer.refused = [r for r in buffer.refused if r[0] > batch.order]
                batch.complete(buffer.key[0], buffer.key[1], response.base_offset)
        if failure is not None:
            self._on_failure(buffer, batch, failure)
        self.wake(buffer)

    def _on_failure(self, buffer: PartitionBuffer, batch: ProducerBatch, exc: BaseException) -> None:
        """Decide a failed send's fate: resend (in order, after draining), re-initialize, or fail."""
        identity = self._identity
        assert identity is not None
        stream, partition = buffer.key
        explained = buffer.draining  # an earlier batch failed in this round: its gap explains a refusal
        buffer.draining = True
        if batch.doubt is None and _maybe_stored(exc):
            batch.doubt = exc
        if isinstance(exc, ProducerFencedError):
            self._fatal(exc)
            return
        if isinstance(exc, _SEQUENCE_REFUSALS):
            if batch.doubt is not None and batch.stamp != identity.stamp:
                _give_up(batch, exc)  # the broker no longer knows the stamp it may be stored under: unknowable
                return
            if explained or batch.stamp != identity.stamp:
                batch.attempts -= 1  # refused for the gap, or for an old stamp: no attempt of its own
                self._retry(buffer, batch, exc)
                return
            if identity.named:
                self._fatal(exc)
                return
            if batch.attempts <= self._retries:
                log.warning("%s/%d: %s; re-initializing the producer", stream, partition, exc)
                identity.renew(batch.stamp)
                if batch.doubt is not None:  # maybe stored under the stamp this broker just forgot
                    _give_up(batch, exc)
                else:
                    self._retry(buffer, batch, exc)
                return
        elif isinstance(exc, TidelogError) and exc.retriable and batch.attempts <= self._retries:
            if isinstance(exc, _STALE_ROUTE):
                buffer.connection = None
                self._cluster.forget(stream)
            self._retry(buffer, batch, exc)
            return
        if batch.doubt is None and not isinstance(exc, _SEQUENCE_REFUSALS) and batch.stamp == buffer.stamp:
            buffer.refused.append((batch.order, len(batch.futures)))
        _give_up(batch, exc)

    def _retry(self, buffer: PartitionBuffer, batch: ProducerBatch, exc: BaseException) -> None:
        log.debug("resending from a batch for %s/%d after %s", buffer.key[0], buffer.key[1], exc)
        buffer.requeue(batch)
        if not buffer.paused:
            buffer.paused = True
            self._loop.call_later(self._backoff, self._resume, buffer)

    def _resume(self, buffer: PartitionBuffer) -> None:
        buffer.paused = False
        self.wake(buffer)

    def _fatal(self, exc: TidelogError) -> None:
        """The producer can send no more: fail what waits on it (the producer fails what is in flight)."""
        assert self._identity is not None
        self._identity.fail(exc)
        log.error("the producer stops: %s", exc)
        waiting, self._waiting = self._waiting, set()
        for buffer in waiting:
            self._fail_queued(buffer, exc)
        if self._on_fatal is not None:
            self._on_fatal(exc)

    def identity_ready(self) -> None:
        """The identity was (re)initialized: wake the partitions that waited for it."""
        waiting, self._waiting = self._waiting, set()
        for buffer in waiting:
            self.wake(buffer)

    def identity_failed(self, exc: TidelogError) -> None:
        """(Re)initializing failed: fail what waited for it (the next send tries again)."""
        waiting, self._waiting = self._waiting, set()
        for buffer in waiting:
            self._fail_queued(buffer, exc)

    # -- both ---------------------------------------------------------------------------------------------------

    def _fail_queued(self, buffer: PartitionBuffer, exc: BaseException) -> None:
        """Fail every batch of ``buffer`` not yet sent (its stream is gone, or no leader is reachable)."""
        while buffer.retry:
            _give_up(buffer.retry.popleft(), exc)
        while buffer.ready:
            buffer.ready.popleft().fail(exc)
        if buffer.open is not None:
            batch, buffer.open = buffer.open, None
            if buffer.linger is not None:
                buffer.linger.cancel()
                buffer.linger = None
            batch.fail(exc)

    async def close(self) -> None:
        """Wait for leader look-ups in progress (they end in a send or a failure)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
