"""PublishAsync in batches: the requests that arrive together become one log append, behind the per-message API.

A Liftbridge client sends one ``PublishRequest`` per message and expects one ``PublishResponse`` per message
(none for ack policy NONE). Appending each alone costs a write, a flush round (an fsync under the ``always``
policy) and a commit wait per message. Here one task reads the requests into a bounded queue; another takes
everything that has arrived (up to :data:`MAX_GROUP` requests) and cuts it into runs of consecutive requests
for the same partition and the same write acks (ALL, or LEADER for LEADER and NONE); a run becomes one batch,
appended with one :meth:`~tidelog.broker.partitions.partition.Partition.write`. While that write waits for its
flush and commit, the next requests pile up and form the next, larger, batch: the batch size follows the load
without a timer. Runs are written one after another, so messages of one stream are stored in the order they were
sent, and the responses go back in that order too, each with its correlation id, once its run is committed.

What stays per message, exactly as :func:`tidelog.api.rpc.publish.publish` does it: the checks (the ack inbox and
policy first, then the partition, then the headers and the size; a failed check is that message's
``asyncError`` and the run goes on without it), the ack with the message's own offset, the ack published on its
ack inbox, and its copy on the partition's NATS subject. A refused or failed write fails every message of its run,
each with its own ``asyncError`` (nothing of a refused run is stored). A run that cannot be batched goes through
the per-message path: a stream with optimistic concurrency control (every message carries its own expected
offset). A run for a partition this broker does not lead is forwarded to its leader as one wire-protocol produce.

Backpressure: both queues are bounded (:data:`MAX_PENDING` requests, :data:`ANSWERED_RUNS` runs' responses).
When the client stops reading its responses, the response queue fills, the batcher stops, the request queue
fills, the reader stops reading requests, and gRPC's flow control stops the client. Nothing buffers without
bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import NamedTuple, Protocol

from tidelog.api.rpc.publish import ack_to_inbox, build_publish_ack, check_size, copy_run_to_nats, publish
from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.write_path import WriteRefused
from tidelog.broker.translate import as_tidelog_error
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.errors import NotLeaderError, from_error_body
from tidelog.protocol.liftbridge import check_user_headers, record_for_publish
from tidelog.protocol.messages import Acks, ProduceRequest, ProduceResponse
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.protocol.subjects import check_ack

MAX_GROUP = 1024
"""Requests taken together at most: one batch holds at most this many messages."""

MAX_PENDING = 2048
"""Requests read but not yet taken, at most."""

ANSWERED_RUNS = 2
"""Runs whose responses are made but not yet all sent, at most (each run holds up to :data:`MAX_GROUP`)."""

RECORD_OVERHEAD = 64
"""Bytes a record adds to its key, value and headers in a batch, at most (lengths, offsets, Liftbridge headers)."""

Request = api_pb2.PublishRequest
Response = api_pb2.PublishResponse
Place = Request | Response | None
"""A message's place in a run: its request until it is answered, then its response (``None``: it has none)."""


def async_error(request: api_pb2.PublishRequest, exc: BaseException) -> api_pb2.PublishResponse:
    """The in-band error of one message: ``PublishAsync`` goes on after it."""
    err = as_tidelog_error(exc)
    return api_pb2.PublishResponse(
        correlationId=request.correlationId,
        asyncError=api_pb2.PublishAsyncError(code=int(err.spec.async_code), message=err.message),  # type: ignore[arg-type]
    )


def write_acks(request: api_pb2.PublishRequest) -> Acks:
    """The acks a message is written with: ALL for ALL, LEADER for LEADER and NONE (NONE still stores it)."""
    return Acks.ALL if int(request.ackPolicy) == Acks.ALL else Acks.LEADER


def runs(group: Sequence[api_pb2.PublishRequest]) -> list[list[api_pb2.PublishRequest]]:
    """``group`` cut into runs of consecutive requests for one partition with the same write acks, in order."""
    cut: list[list[api_pb2.PublishRequest]] = []
    key: tuple[str, int, Acks] | None = None
    for request in group:
        this = (request.stream, request.partition, write_acks(request))
        if this != key:
            cut.append([])
            key = this
        cut[-1].append(request)
    return cut


class PublishBatches:
    """One ``PublishAsync`` call: its requests in, its responses out (see the module docstring)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._requests: asyncio.Queue[Request | None] = asyncio.Queue(MAX_PENDING)
        self._responses: asyncio.Queue[list[Response] | None] = asyncio.Queue(ANSWERED_RUNS)

    async def serve(self, requests: AsyncIterator[api_pb2.PublishRequest]) -> AsyncIterator[api_pb2.PublishResponse]:
        """Every response in request order; ends once the client has closed its side and every request is answered."""
        reader = asyncio.create_task(self._read(requests))
        batcher = asyncio.create_task(self._batch())
        try:
            while (answered := await self._responses.get()) is not None:
                for response in answered:
                    yield response
            await batcher  # done: its last put was the end; raises what failed it
            await reader
        finally:
            for task in (reader, batcher):
                task.cancel()
            for task in (reader, batcher):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([task])  # ended; what it raised is raised above, or the call is over
                if not task.cancelled():
                    task.exception()  # retrieved: no "never retrieved" warning for a call that ended first

    def saturated(self) -> bool:
        """Both queues are full: no request is read until the client takes answers."""
        return self._requests.full() and self._responses.full()

    async def _read(self, requests: AsyncIterator[api_pb2.PublishRequest]) -> None:
        """Every request into the queue, then the end; a failure reading (the client's stream broke, or the
        authorization interceptor refused a message) ends the queue too and is raised by :meth:`serve` once every
        request before it is answered. Cancelled, it puts nothing: the call is over."""
        try:
            async for request in requests:
                await self._requests.put(request)
        except asyncio.CancelledError:
            raise
        except BaseException:
            await self._requests.put(None)
            raise
        await self._requests.put(None)

    async def _batch(self) -> None:
        """Groups of what has arrived, run by run, each run's responses in order, then the end (also after an
        unexpected failure, which :meth:`serve` then raises)."""
        try:
            await self._answer_all()
        except asyncio.CancelledError:
            raise
        except BaseException:
            await self._responses.put(None)
            raise
        await self._responses.put(None)

    async def _answer_all(self) -> None:
        ended = False
        while not ended:
            first = await self._requests.get()
            if first is None:
                break
            group = [first]
            while len(group) < MAX_GROUP and not self._requests.empty():
                item = self._requests.get_nowait()
                if item is None:
                    ended = True
                    break
                group.append(item)
            for run in runs(group):
                answered = await self._run(run)
                if answered:
                    await self._responses.put(answered)

    async def _run(self, run: list[Request]) -> list[Response]:
        """The responses of one run (for one partition, one write acks), in its order."""
        places: list[Place] = []
        for request in run:
            try:
                check_ack(request.ackInbox, int(request.ackPolicy))
                places.append(request)
            except Exception as exc:
                places.append(async_error(request, exc))
        waiting = [index for index, each in enumerate(places) if isinstance(each, Request)]
        if not waiting:
            return [each for each in places if isinstance(each, Response)]
        first = run[waiting[0]]
        try:
            target = await self._target(first, places)
        except Exception as exc:
            for index in waiting:
                places[index] = async_error(run[index], exc)
            return [each for each in places if isinstance(each, Response)]
        if target is None:  # every message alone: each carries its own expected offset
            answers = await asyncio.gather(*(self._one(run[index]) for index in waiting))
            for index, answer in zip(waiting, answers, strict=True):
                places[index] = answer
        else:
            await self._append(target, places)
        return [each for each in places if isinstance(each, Response)]

    async def _target(self, first: Request, places: list[Place]) -> Target | None:
        """Where a run goes: the partition this broker leads, or its leader (:meth:`_forwarding`); ``None``: every
        message alone, each carrying its own expected offset (a stream with optimistic concurrency control). A
        subclass answers otherwise (:mod:`tidelog.api.front.publish`)."""
        try:
            partition = await self._ctx.writable(first.stream, first.partition)
        except NotLeaderError as exc:
            return self._forwarding(first, exc, places)
        if partition.stream.config.optimistic_concurrency_control:
            return None
        return LocalTarget(partition, self._ctx.ack_timeout)

    def _forwarding(self, first: Request, refused: NotLeaderError, places: list[Place]) -> Target:
        """Where a run for a partition this broker does not lead goes: its leader, over the wire protocol, in one
        produce. As :func:`~tidelog.api.rpc.publish.publish` does, a message expecting an offset is not forwarded
        (its check belongs with the leader's log): it answers NOT_LEADER."""
        ctx = self._ctx
        snap = ctx.mirror.snapshot
        stream = snap.stream(first.stream)
        meta = snap.partition(first.stream, first.partition)
        for index, each in enumerate(places):
            if not isinstance(each, Request):
                continue
            if ctx.peers is None or each.expectedOffset not in (-1, 0):
                places[index] = async_error(each, refused)
            elif stream is None or meta is None or not meta.leader:
                places[index] = async_error(each, NotLeaderError(f"{first.stream}/{first.partition} has no leader"))
        leader = meta.leader if meta is not None else ""
        subject = stream.partition_subject(first.partition) if stream is not None else first.stream
        group = stream.group if stream is not None else ""
        return ForwardTarget(ctx, first.stream, first.partition, group, subject, leader)

    async def _one(self, request: api_pb2.PublishRequest) -> api_pb2.PublishResponse | None:
        """One message through the per-message path; ``None`` for ack policy NONE (no response)."""
        try:
            response = await publish(self._ctx, request, self._ctx.ack_timeout)
        except Exception as exc:
            return async_error(request, exc)
        return None if int(request.ackPolicy) == Acks.NONE else response

    async def _append(self, target: Target, places: list[Place]) -> None:
        """The run's messages that pass their checks, as whole batches in one write; each one's answer in its
        place."""
        ctx = self._ctx
        now = time.time_ns()
        batches: list[bytes] = []
        records: list[NewRecord] = []
        size = 0
        for index, each in enumerate(places):
            if not isinstance(each, Request):
                continue
            try:
                check_user_headers(each.headers.keys())
                length = check_size(ctx, each.key, each.value, each.headers) + _overhead(each)
            except Exception as exc:
                places[index] = async_error(each, exc)
                continue
            if records and size + length > target.max_batch_bytes:
                batches.append(build_batch(records, timestamp=now))
                records, size = [], 0
            records.append(_record(each, now))
            size += length
        if records:
            batches.append(build_batch(records, timestamp=now))
            await self._write(target, places, b"".join(batches))

    async def _write(self, target: Target, places: list[Place], data: bytes) -> None:
        """Write ``data`` (the records of the requests still in ``places``, in order) and answer each of them."""
        ctx = self._ctx
        waiting = [index for index, each in enumerate(places) if isinstance(each, Request)]
        try:
            written = await target.write(data, write_acks(places[waiting[0]]))  # type: ignore[arg-type]
        except Exception as exc:
            for index in waiting:
                places[index] = async_error(places[index], exc)  # type: ignore[arg-type]
            return
        stored = [each for each in places if isinstance(each, Request)]  # one partition: the run's
        await copy_run_to_nats(ctx, target.stream, target.group, stored[0].partition, target.subject, stored)
        for offset, index in enumerate(waiting, written.base_offset):
            request = places[index]
            assert isinstance(request, Request)
            if int(request.ackPolicy) == Acks.NONE:
                places[index] = None
                continue
            ack = build_publish_ack(
                target.stream, target.subject, request, offset, written.received_ns, written.committed_ns
            )
            if request.ackInbox:
                await ack_to_inbox(ctx, request.ackInbox, ack)
            places[index] = Response(ack=ack, correlationId=request.correlationId)


class Written(NamedTuple):
    """Where a run's batches landed, and when they were received and committed (ns)."""

    base_offset: int
    received_ns: int
    committed_ns: int


class Target(Protocol):
    """Where a run's batches are written, and what its acks and NATS copies name."""

    stream: str
    group: str
    subject: str
    max_batch_bytes: int

    async def write(self, data: bytes, acks: Acks) -> Written: ...


class LocalTarget:
    """A partition this broker leads: one :meth:`~tidelog.broker.partitions.partition.Partition.write`."""

    def __init__(self, partition: Partition, timeout: float) -> None:
        self.partition = partition
        self.stream = partition.stream.name
        self.group = partition.stream.group
        self.subject = partition.subject
        self.max_batch_bytes = partition.log.config.max_batch_bytes
        self.timeout = timeout

    async def write(self, data: bytes, acks: Acks) -> Written:
        # Shielded: a client that goes away mid-write cancels this call, not the write (it may be placed in the
        # log already, and a write stopped between its states would leave the partition's bookkeeping behind).
        appended = await asyncio.shield(self.partition.write(data, acks, self.timeout))
        if isinstance(appended, WriteRefused):
            raise appended.error()
        return Written(appended.base_offset, appended.received_ns, appended.committed_ns)


class ForwardTarget:
    """A partition led by another broker: one wire-protocol produce to its leader (as a Liftbridge client talking
    to one seed broker expects its publishes to work through failovers). Batches stay under twice
    ``max_message_bytes``, which every log's ``max_batch_bytes`` is at least."""

    def __init__(self, ctx: BrokerContext, stream: str, partition: int, group: str, subject: str, leader: str) -> None:
        self.ctx = ctx
        self.stream = stream
        self.partition = partition
        self.group = group
        self.subject = subject
        self.leader = leader
        self.max_batch_bytes = 2 * ctx.config.max_message_bytes

    async def write(self, data: bytes, acks: Acks) -> Written:
        timeout = self.ctx.ack_timeout
        received = time.time_ns()
        produce = ProduceRequest(self.stream, self.partition, acks, max(1, int(timeout * 1000)))
        assert self.ctx.peers is not None
        response = await self.ctx.peers.request(self.leader, produce, data, timeout=timeout)
        header = response.header
        assert isinstance(header, ProduceResponse)
        if header.error is not None:
            raise from_error_body(header.error)
        return Written(header.base_offset, received, time.time_ns())


def _record(request: api_pb2.PublishRequest, now: int) -> NewRecord:
    return record_for_publish(
        key=request.key,
        value=request.value,
        headers=request.headers,
        timestamp=now,
        ack_inbox=request.ackInbox,
        correlation_id=request.correlationId,
        ack_policy=int(request.ackPolicy),
    )


def _overhead(request: api_pb2.PublishRequest) -> int:
    """Bytes a message's record holds beyond its key, value and headers, at most."""
    return len(request.ackInbox) + len(request.correlationId) + RECORD_OVERHEAD


async def publish_async(
    ctx: BrokerContext, requests: AsyncIterator[api_pb2.PublishRequest]
) -> AsyncIterator[api_pb2.PublishResponse]:
    """``PublishAsync``: pipelined publishes, batched (see the module docstring)."""
    async for response in PublishBatches(ctx).serve(requests):
        yield response


__all__ = [
    "ANSWERED_RUNS",
    "MAX_GROUP",
    "MAX_PENDING",
    "ForwardTarget",
    "PublishBatches",
    "Target",
    "async_error",
    "publish_async",
    "runs",
]
