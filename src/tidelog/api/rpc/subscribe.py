"""Subscribe: Liftbridge's server-streaming read of one partition.

The server first sends one empty ``Message`` (the handshake: the subscription is established), then committed
messages from the start position, then waits at the tail for more. A stop position ends the stream with
``RESOURCE_EXHAUSTED`` once reached. Reads move whole batches out of the log and decode records only here, at
the edge, because this API sends one gRPC message per record; a batch's records are decoded at once by the
consumer's row decoder (:func:`tidelog.protocol.records.rows.parse_records`, runs of alike records without a
Python step per record), not one record at a time.

Damage on disk (bit rot, :mod:`tidelog.storage.damage`): the subscription delivers every record before a damaged
range, then ends once with ``DATA_LOSS`` whose message names the range and the offset to resubscribe from
(``startPosition=OFFSET``). It is not UNAVAILABLE on purpose: Liftbridge clients resubscribe by themselves on
UNAVAILABLE, from the offset after the last one they got, which is inside the range; on any other status they
hand the error to the application. A subscription starting inside the range ends the same way at once; once an
operator has confirmed skipping the range (``tidelog partition skip-damaged``) subscriptions pass over it
silently, as over a compacted gap. While a replicated partition restores the range from a replica, the
subscription ends with UNAVAILABLE instead, so that Liftbridge clients resubscribe and get the restored records.

Read-only partitions: a subscription that has sent everything a read-only partition holds ends with
``RESOURCE_EXHAUSTED`` "End of readonly partition", as Liftbridge's does, whether the partition was read-only
when it started or became so while it waited at the tail (Liftbridge answers "Stop offset reached" in the first
case; the status code, which clients act on, is the same). An empty read-only partition ends it at once.

Paused partitions (:mod:`tidelog.broker.pausing`): a subscribe with ``resume`` set resumes the partition; without
it, the subscribe fails with PARTITION_PAUSED (``FAILED_PRECONDITION``), and so does an open subscription when
the partition is paused under it. Open subscriptions are counted for ``autoPauseDisableIfSubscribers``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.followed import FollowedPartition
from tidelog.broker.partitions.partition import Partition
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.errors import (
    InvalidArgumentError,
    OffsetDamagedError,
    PartitionPausedError,
    StopReachedError,
    UnavailableError,
    UnsupportedError,
)
from tidelog.protocol.liftbridge import message_from_record
from tidelog.protocol.records import iter_batches, record_section
from tidelog.protocol.records.rows import parse_records
from tidelog.storage import errors as storage_errors
from tidelog.storage.remote_read import RemoteSegmentError

READ_BYTES = 1024 * 1024
READONLY_END = "End of readonly partition"
"""The status message ending a subscription at the end of a read-only partition (Liftbridge's words)."""
_IDLE_WAIT = 30.0  # seconds between re-checks while waiting at the tail

_Start = api_pb2.StartPosition
_Stop = api_pb2.StopPosition


@dataclass(frozen=True, slots=True)
class Stop:
    """Where a subscription ends: the last offset to send, or the last timestamp (inclusive)."""

    offset: int | None = None
    timestamp: int | None = None

    def reached_before(self, offset: int, timestamp: int) -> bool:
        """True when a record at ``offset``/``timestamp`` lies past the stop."""
        if self.offset is not None and offset > self.offset:
            return True
        return self.timestamp is not None and timestamp > self.timestamp


def start_offset(partition: Partition | FollowedPartition, request: api_pb2.SubscribeRequest) -> int:
    """Resolve the start position to the first offset to send."""
    hw = partition.high_watermark
    start = partition.log_start
    position = request.startPosition
    if position == _Start.NEW_ONLY:
        return hw
    if position == _Start.EARLIEST:
        return start
    if position == _Start.LATEST:
        return max(start, hw - 1)
    if position == _Start.OFFSET:
        if request.startOffset < 0:
            raise InvalidArgumentError(f"startOffset must not be negative, got {request.startOffset}")
        return min(max(request.startOffset, start), hw)
    if position == _Start.TIMESTAMP:
        return max(start, partition.offset_for_timestamp(request.startTimestamp))
    raise InvalidArgumentError(f"unknown startPosition {position}")


async def _wait_for_data(partition: Partition | FollowedPartition, offset: int, ended: asyncio.Event | None) -> None:
    """Wait at the tail for a record at ``offset``, a change of the partition's metadata (set read-only, paused),
    or until ``ended`` is set."""
    data = asyncio.ensure_future(partition.wait_for_data(offset, _IDLE_WAIT))
    waits = {data, asyncio.ensure_future(partition.next_change().wait())}
    if ended is not None:
        waits.add(asyncio.ensure_future(ended.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if data.done() and not data.cancelled():
        data.result()  # the partition closing (UNAVAILABLE)


def _check_open(partition: Partition | FollowedPartition) -> None:
    """PARTITION_PAUSED once the partition is being paused: its log closes (Liftbridge ends the subscription with
    FAILED_PRECONDITION too)."""
    if partition.record.paused:
        raise PartitionPausedError(f"partition {partition.name} was paused; subscribe with resume set to resume it")


async def check_group_consumer(ctx: BrokerContext, request: api_pb2.SubscribeRequest) -> None:
    """A subscription as a consumer group member reads only a partition assigned to it at the group's current
    epoch (:meth:`~tidelog.broker.groups.service.GroupService.check_subscribe`)."""
    consumer = request.consumer
    if not consumer.groupId:
        raise InvalidArgumentError("a consumer id was given without a group id")
    if ctx.groups is None:
        raise UnsupportedError(f"broker {ctx.broker_id} runs without consumer groups")
    await ctx.groups.check_subscribe(
        consumer.groupId,
        consumer.consumerId,
        consumer.groupEpoch,
        request.stream,
        request.partition,
        request.readISRReplica,
    )


def stop_of(partition: Partition | FollowedPartition, request: api_pb2.SubscribeRequest) -> Stop:
    position = request.stopPosition
    if position == _Stop.STOP_ON_CANCEL:
        return Stop()
    if position == _Stop.STOP_OFFSET:
        return Stop(offset=request.stopOffset)
    if position == _Stop.STOP_LATEST:
        return Stop(offset=partition.high_watermark - 1)
    if position == _Stop.STOP_TIMESTAMP:
        return Stop(timestamp=request.stopTimestamp)
    raise InvalidArgumentError(f"unknown stopPosition {position}")


async def subscribe(ctx: BrokerContext, request: api_pb2.SubscribeRequest) -> AsyncIterator[api_pb2.Message]:
    if request.resume:  # Liftbridge's resume: a paused partition is resumed first (tidelog.broker.pausing)
        partition = await ctx.readable(request.stream, request.partition, isr_replica=request.readISRReplica)
    else:
        partition = ctx.manager.reader_of(request.stream, request.partition, isr_replica=request.readISRReplica)
    with contextlib.ExitStack() as counted:
        if ctx.pauses is not None:  # a subscriber keeps autoPauseDisableIfSubscribers partitions from pausing
            counted.enter_context(ctx.pauses.subscribed(request.stream, request.partition))
        consumer = request.consumer
        if not request.HasField("consumer") or not (consumer.groupId or consumer.consumerId):
            async for message in _read(partition, request, None):
                yield message
            return
        await check_group_consumer(ctx, request)
        assert ctx.groups is not None
        group, member = consumer.groupId, consumer.consumerId
        with ctx.groups.readers.reading(group, member, request.stream, request.partition) as ended:
            async for message in _read(partition, request, ended):
                yield message


async def _read(
    partition: Partition | FollowedPartition, request: api_pb2.SubscribeRequest, ended: asyncio.Event | None
) -> AsyncIterator[api_pb2.Message]:
    """The subscription proper; it finishes early (cleanly) once ``ended`` is set: a group consumer that lost the
    partition (:mod:`tidelog.broker.groups.readers`)."""
    if isinstance(partition, Partition):
        await partition.tail_visible()
    offset = start_offset(partition, request)
    stop = stop_of(partition, request)
    stream, pid, psubject = partition.stream.name, partition.record.id, partition.subject
    yield api_pb2.Message()  # handshake
    if stop.offset is not None and offset > stop.offset:
        raise StopReachedError(f"stop offset {stop.offset} is before the start offset {offset}")
    while ended is None or not ended.is_set():
        try:
            data = await partition.read_committed_async(offset, READ_BYTES)
        except RemoteSegmentError as exc:
            raise OffsetDamagedError(
                f"{partition.name}: {exc}; resubscribe from offset {exc.last + 1} to read on",
                first=exc.first,
                last=exc.last,
            ) from None
        except storage_errors.OffsetDamagedError as exc:
            if exc.repairing:
                raise UnavailableError(
                    f"{partition.name}: offsets {exc.first}..{exc.last} are being restored from a replica"
                ) from None
            raise OffsetDamagedError(
                f"{partition.name}: offsets {exc.first}..{exc.last} are damaged on disk ({exc.reason}); "
                f"resubscribe from offset {exc.next_offset} to read on",
                first=exc.first,
                last=exc.last,
            ) from None
        if not data:
            _check_open(partition)
            if partition.at_readonly_end and offset >= partition.high_watermark:
                raise StopReachedError(READONLY_END)
            try:
                await _wait_for_data(partition, offset, ended)
            except UnavailableError:
                _check_open(partition)
                raise
            continue
        for pos, header in iter_batches(data):
            if header.last_offset < offset:
                continue
            section = record_section(data, pos, header=header)
            records = parse_records(section if isinstance(section, bytes) else bytes(section), header, stream, pid)
            for record in records:
                if record.offset < offset:
                    continue
                if stop.reached_before(record.offset, record.timestamp):
                    raise StopReachedError(f"reached the stop position at offset {record.offset}")
                yield message_from_record(record, stream, pid, psubject)
                if stop.offset is not None and record.offset >= stop.offset:
                    raise StopReachedError(f"reached stop offset {stop.offset}")
            offset = header.next_offset
