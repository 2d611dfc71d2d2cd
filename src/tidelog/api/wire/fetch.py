"""The read family of the wire protocol: FETCH (batches from an offset, long-polling at the tail) and
LIST_OFFSETS (where a reader may start).

A fetch never decodes a record. It asks the log for whole batches from the one holding the requested offset,
bounded by the high watermark (committed isolation: consumers never see more) and by ``max_bytes`` (soft: the
first batch comes whole even if larger). On a plain TCP session the answer is a *file range*
(:meth:`Log.read_range`) that the session sends with ``os.sendfile``, so the bytes go from the page cache to
the socket without entering Python; over TLS the same batches are read into memory (:meth:`Log.read`).

At the tail (nothing committed at the offset yet) the fetch long-polls: it waits on
:meth:`Partition.wait_for_data` for at most ``max_wait_ms`` and answers as soon as a record at the offset is
committed, or empty on timeout, or at once when the connection winds down (the server stopping, the client
gone). ``min_bytes`` above 1 is accepted but treated as 1: the fetch answers as soon as anything is readable,
which is what a tailing consumer wants. ``max_bytes`` is capped at :data:`MAX_FETCH_BYTES`, so a response
always fits the client's frame limit.

An offset outside ``[log_start, log_end]`` is not an error frame but a response carrying OFFSET_OUT_OF_RANGE
*and* the bounds, so the consumer resets without another round trip. An offset in ``(hw, log_end]`` is valid:
it is written but not yet committed, so the fetch waits for it like any tail read.

Damage on disk (:mod:`tidelog.storage.damage`). A fetch starting before a damaged range gets the batches up to
it; one starting inside it gets OFFSET_DAMAGED with the bounds and the range (``damaged_first``,
``damaged_last``: read on from ``damaged_last + 1``), unless an operator confirmed skipping the range (then the
fetch is answered from past it, like a compacted gap). While a replicated partition restores the range from a
replica (:mod:`tidelog.broker.partitions.damage_repair`) the fetch is answered UNAVAILABLE, which clients retry.

Served ranges are CRC-checked once per process, so bytes that rot after that reach the client unchecked: a
client whose own CRC check fails fetches again with ``verify``, and that fetch is read into memory and checked
on the broker, which finds and records the damage.
An encrypted stream's batches are opened on the broker (:mod:`tidelog.storage.encryption`), so they are read
into memory and copied, never sent with ``os.sendfile``; a broker without the stream's keys answers ENCRYPTION.
Read-only partitions (Liftbridge's end of a read-only partition): every answer says whether the partition is
read-only (``readonly``), and a fetch at the end of a read-only partition whose log is all committed is answered
at once instead of long-polling, so the consumer ends there (:mod:`tidelog.client.consumer`). A fetch or
list-offsets of a paused partition resumes it (:mod:`tidelog.broker.pausing`).

A consumer's fetch marked ``isr_read`` (the Spark source's ``readFrom``) reads this broker's copy when it is an
in-sync follower, and the leader's otherwise, like a Liftbridge ``readISRReplica`` subscription: committed records
only, below the high watermark the follower knows (its leader's word, a little behind the leader's own), opened
and from the tiered store as at the leader; a broker that is neither answers NOT_LEADER.

A fetch marked ``replica`` reads this broker's copy when it is an in-sync follower (Liftbridge's
``readISRReplica``): that is how a leader fetches a sound copy of a damaged range from its followers, so it gets
the stored bytes as they are, sealed or not.

A fetch carrying a ``group`` context is a consumer group member's: refused (STALE_GROUP_EPOCH, UNKNOWN_MEMBER,
UNKNOWN_GROUP) unless the member owns the partition at the group's current epoch
(:mod:`tidelog.broker.groups.fencing`), so a member that missed a rebalance stops reading a partition that moved.
Below the local log start, on a broker with a tiered store, the batches come from the object store
(:meth:`~tidelog.broker.partitions.committed_reads.CommittedReads.read_committed_async`), in memory; a remote
segment that is missing or fails its check answers OFFSET_DAMAGED with its offsets.
"""

from __future__ import annotations

import asyncio

from tidelog.api.wire.cursors import groups_of
from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, batches_reply, route
from tidelog.broker.partitions.followed import FollowedPartition
from tidelog.broker.partitions.partition import Partition
from tidelog.protocol.errors import (
    NotLeaderError,
    OffsetDamagedError,
    OffsetOutOfRangeError,
    PartitionPausedError,
    UnavailableError,
)
from tidelog.protocol.frames import DEFAULT_MAX_FRAME_BYTES, Op
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.messages import FetchRequest, FetchResponse, Isolation, ListOffsetsRequest, ListOffsetsResponse
from tidelog.storage import errors as storage_errors
from tidelog.storage.remote_read import RemoteSegmentError

Replica = Partition | FollowedPartition
MAX_FETCH_BYTES = DEFAULT_MAX_FRAME_BYTES // 4
"""Batches beyond this are left for the next fetch (one batch larger than it still comes whole)."""


async def fetch(env: HandlerEnv, correlation_id: int, request: FetchRequest, _payload: memoryview) -> Reply:
    """Whole batches from ``request.offset``; see the module docstring for the rules."""
    manager = env.broker.manager
    if request.group is not None:
        await groups_of(env.broker).check_read(request.group, request.stream, request.partition)
    partition: Replica
    if request.replica:
        partition = manager.reader_of(request.stream, request.partition, isr_replica=True)
    else:
        try:
            partition = (
                manager.reader_of(request.stream, request.partition, isr_replica=True)
                if request.isr_read
                else manager.leader_of(request.stream, request.partition)
            )
        except (PartitionPausedError, NotLeaderError):  # a consumer's read resumes a paused partition
            partition = await env.broker.readable(request.stream, request.partition, isr_replica=request.isr_read)
        if env.broker.pauses is not None:
            env.broker.pauses.fetched(request.stream, request.partition)
    if isinstance(partition, Partition):
        await partition.tail_visible()
    offset = request.offset
    max_bytes = min(request.max_bytes, MAX_FETCH_BYTES)
    committed = request.isolation is Isolation.COMMITTED
    if not partition.log_start <= offset <= partition.log_end:
        return _out_of_range(correlation_id, partition, offset)
    if committed and offset >= partition.high_watermark and request.max_wait_ms and not partition.at_readonly_end:
        await _long_poll(env, partition, offset, request.max_wait_ms / 1000)
    limit = partition.high_watermark if committed else partition.log_end
    if offset >= limit:
        return Reply(encode_message(correlation_id, _bounds(partition)))
    try:
        if not request.replica and partition.is_remote(offset):  # below the local log start: from the tiered store
            data = await partition.read_committed_async(offset, max_bytes)
            partition.bytes_out += len(data)
            return Reply(encode_message(correlation_id, _bounds(partition), data))
        if partition.stream.config.encryption and not request.replica:  # opened: copied, never sent from the file
            data = partition.readable(partition.log.read(offset, max_bytes, max_offset=limit))
            return Reply(encode_message(correlation_id, _bounds(partition), data))
        if request.verify:
            data = partition.log.read(offset, max_bytes, max_offset=limit)
            return Reply(encode_message(correlation_id, _bounds(partition), data))
        reply = batches_reply(
            env, Op.FETCH, correlation_id, _bounds(partition), partition.log, offset, max_bytes, limit
        )
        if (file := reply.file) is not None:  # for the metrics (read at scrape time)
            partition.bytes_out += file.length
            partition.records_out += file.next_offset - offset
        else:  # in memory (TLS): the bytes, with the small response header
            partition.bytes_out += len(reply.buffers[-1])
        return reply
    except storage_errors.OffsetDamagedError as exc:
        return _damaged(correlation_id, partition, exc)
    except RemoteSegmentError as exc:
        return _remote_failed(correlation_id, partition, exc)


async def _long_poll(env: HandlerEnv, partition: Replica, offset: int, timeout: float) -> None:
    """Wait until a record at ``offset`` is committed, ``timeout`` passes, or the session winds down (the server
    stops, or the client closed its side: nobody would wait for a long answer).

    Only reached when the reader is at the tail, so the extra task per wait costs nothing on the busy path.
    """
    if env.winding_down.done():
        return
    waiter = asyncio.ensure_future(partition.wait_for_data(offset, timeout))
    try:
        await asyncio.wait((waiter, env.winding_down), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not waiter.done():
            waiter.cancel()
    if waiter.done() and not waiter.cancelled():
        waiter.result()  # re-raise a failure (the partition closing: UNAVAILABLE)


def _bounds(partition: Replica) -> FetchResponse:
    return FetchResponse(
        partition.high_watermark, partition.log_start, partition.log_end, readonly=partition.record.readonly
    )


def _out_of_range(correlation_id: int, partition: Replica, offset: int) -> Reply:
    start, end = partition.log_start, partition.log_end
    error = OffsetOutOfRangeError(f"offset {offset} of {partition.name} is outside the log's [{start}, {end}]")
    response = FetchResponse(partition.high_watermark, start, end, error.to_error_body())
    return Reply(encode_message(correlation_id, response))


def _damaged(correlation_id: int, partition: Replica, exc: storage_errors.OffsetDamagedError) -> Reply:
    if exc.repairing:
        raise UnavailableError(f"{partition.name}: offsets {exc.first}..{exc.last} are being restored from a replica")
    message = f"{partition.name}: {exc}; fetch from there to read on"
    error = OffsetDamagedError(message, first=exc.first, last=exc.last).to_error_body()
    bounds = _bounds(partition)
    response = FetchResponse(
        bounds.high_watermark, bounds.log_start, bounds.log_end, error, damaged_first=exc.first, damaged_last=exc.last
    )
    return Reply(encode_message(correlation_id, response))


def _remote_failed(correlation_id: int, partition: Replica, exc: RemoteSegmentError) -> Reply:
    """A remote segment that is missing or fails its check: OFFSET_DAMAGED naming its offsets (never its bytes)."""
    message = f"{partition.name}: {exc}; fetch from {exc.last + 1} to read on"
    error = OffsetDamagedError(message, first=exc.first, last=exc.last).to_error_body()
    bounds = _bounds(partition)
    response = FetchResponse(
        bounds.high_watermark, bounds.log_start, bounds.log_end, error, damaged_first=exc.first, damaged_last=exc.last
    )
    return Reply(encode_message(correlation_id, response))


async def list_offsets(
    env: HandlerEnv, correlation_id: int, request: ListOffsetsRequest, _payload: memoryview
) -> Reply:
    """The partition's bounds, and the first committed offset at or after ``request.timestamp`` when asked."""
    partition = await env.broker.writable(request.stream, request.partition)  # a reader's first step: resumes
    await partition.tail_visible()
    offset = -1
    if request.timestamp >= 0:
        offset = max(partition.log_start, partition.offset_for_timestamp(request.timestamp))
    remote_start, remote_end = partition.remote_range or (-1, -1)
    response = ListOffsetsResponse(
        partition.log_start,
        partition.high_watermark,
        partition.log_end,
        offset,
        partition.record.leader_epoch,
        partition.safety.reason,
        partition.local_log_start,
        remote_start,
        remote_end,
    )
    return Reply(encode_message(correlation_id, response))


ROUTES: dict[int, Route] = {
    Op.FETCH: route(FetchRequest, fetch),
    Op.LIST_OFFSETS: route(ListOffsetsRequest, list_offsets),
}
