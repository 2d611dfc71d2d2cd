"""The producer's sender: takes batches from the accumulator and keeps several produce requests in flight.

No task per request and no loop polling queues: :meth:`Sender.wake` runs synchronously whenever a partition
buffer may have something to send (a batch sealed or lingered, a response freed an in-flight slot, a retry
came due). It takes batches in order while the partition has fewer than ``max_in_flight`` requests
outstanding, builds each one (join, compression, CRC: once per batch), and writes it on the leader's
connection at once with :meth:`Connection.send`. Because the broker starts appends in arrival order and
answers in request order, records of a partition land in the order they were sent, and each response
resolves its batch's record futures in a done-callback.

Retries. Only refusals where the broker stored nothing are retried (up to ``retries`` times, after
``retry_backoff_ms``): NOT_LEADER (metadata is refreshed and the new leader asked) and NOT_ENOUGH_REPLICAS.
A retried batch waits until every request sent before it has come back, then goes first, so order holds.
Anything else fails the batch's records: in particular a lost connection or a TIMEOUT after the write, where
the batch may be stored — resending it could store it twice, which only an idempotent producer may do.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from tidelog.api.errors import NotEnoughReplicasError, NotLeaderError, TidelogError, from_error_body
from tidelog.api.wire.messages import Acks, ProduceRequest, ProduceResponse
from tidelog.client.accumulator import PartitionBuffer, ProducerBatch
from tidelog.client.cluster import Cluster
from tidelog.client.connection import ConnectionClosedError, Response
from tidelog.storage.batch import Codec

log = logging.getLogger(__name__)

_RETRIABLE = (NotLeaderError, NotEnoughReplicasError)  # refused before anything was appended


class Sender:
    """Moves batches from partition buffers to the brokers (see the module docstring)."""

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
    ) -> None:
        self._cluster = cluster
        self._acks = acks
        self._ack_timeout_ms = ack_timeout_ms
        self._codec = codec
        self._max_in_flight = max_in_flight
        self._retries = retries
        self._backoff = retry_backoff_ms / 1000
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()

    def wake(self, buffer: PartitionBuffer) -> None:
        """Send what ``buffer`` may send now; look up its leader first if it has no live connection."""
        connection = buffer.connection
        if connection is None or connection.closed:
            if connection is not None:  # the leader went away: its metadata is stale too
                self._cluster.forget(buffer.key[0])
            buffer.connection = None
            if not buffer.resolving and (buffer.ready or buffer.retry or buffer.open is not None):
                buffer.resolving = True
                task = self._loop.create_task(self._resolve(buffer))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
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

    def _fail_queued(self, buffer: PartitionBuffer, exc: BaseException) -> None:
        """Fail every batch of ``buffer`` not yet sent (its stream is gone, or no leader is reachable)."""
        while buffer.retry:
            buffer.retry.popleft().fail(exc)
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
