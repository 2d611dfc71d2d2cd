"""The replication family of the wire protocol, leader side: REPLICA_FETCH and EPOCH_END_OFFSET.

Followers pull. A follower's REPLICA_FETCH names the offset it wants next, which is its log end: that is its
acknowledgement of everything below (with flush ``always``, fsynced before it asked), and the leader records it
with :meth:`Partition.replica_fetched` as the session reads the request (:func:`acknowledge`, the route's
``admit`` hook), before the handler even runs, so the high watermark moves as soon as the request arrives,
not when the next batch does. The answer carries batches from that offset up to the log
*end* (followers copy uncommitted batches too: that is what lets them acknowledge them), exactly as stored,
plus the leader's high watermark, bounds and epoch. At the tail the fetch long-polls on
:meth:`Partition.wait_for_log_end`, which is woken when a write reaches the file, before its fsync: the
leader's fsync and the followers' copy overlap instead of adding up. The long-poll is one future awaited by
the handler (no task of its own). The write that ends it answers it itself, from inside the append, with the
batches it just wrote (:class:`_TailPush`, through the session's ``reply_now``): both followers have their
copy before the leader's fsync round even starts. When it cannot (a write over the fetch's ``max_bytes``, one
copied from a spool file, a session busy writing), the woken handler reads the batches from the log and its
reply goes out from the handler task (the session's fast path).

What is refused, and how (errors inside the response, so the follower also learns the leader's epoch and
bounds without another round trip; a broker that does not lead at all answers with an error frame, from
:meth:`~tidelog.broker.manager.PartitionManager.leader_of`):

- an older ``leader_epoch`` than the partition's: FENCED_LEADER_EPOCH (the follower's metadata is stale);
- a newer one: NOT_LEADER (this leader is the stale one: a successor was elected and it has not heard yet);
- a broker that is no replica of the partition: NOT_LEADER (Kafka's NOT_LEADER_OR_FOLLOWER: the two views of
  the assignment disagree, and the one to refresh is whichever is older);
- an offset outside ``[log_start, log_end]``: OFFSET_OUT_OF_RANGE with the bounds. Below the log start means
  far-horizon catch-up. Above the log end, after the follower's epoch truncation, the follower holds offsets the
  leader lacks: evidence that consistency is lost (:mod:`tidelog.broker.safety`), which suspends appends, and
  the answer is PARTITION_SUSPENDED, so that the follower keeps its copy instead of cutting it to the leader's
  end. Only where an operator confirmed the head for this leadership is it OFFSET_OUT_OF_RANGE: the follower
  cuts what the operator gave up.

None of these record the follower's offset: a refused fetch acknowledges nothing.

SEGMENT_LIST and SEGMENT_FETCH serve far-horizon catch-up (:mod:`tidelog.replication.catch_up`): a follower
that is behind the log start, or too many bytes behind, lists the sealed segments from its log end and copies
them as whole files, in chunks. Only sealed segments: the active one changes under the reader and fetching
covers it. A chunk is the segment file's raw bytes, sent with ``os.sendfile`` on plain TCP like a fetch,
unchecked here (the follower checks every batch of the whole file). A segment that is no longer there
(retention deleted it meanwhile) or whose file was replaced since the first chunk (compaction) is refused with
OFFSET_OUT_OF_RANGE, and the follower starts its round again. Both are fenced like REPLICA_FETCH and record
nothing: copying files is no acknowledgement.

EPOCH_END_OFFSET answers KIP-279's question "where does my latest epoch end on your log?" from the leader's
epoch cache (:meth:`Log.end_offset_for_epoch`); the follower truncates there before fetching (see
:mod:`tidelog.replication.truncation`). It is fenced like a fetch when the follower names the leadership it
believes in, so a follower never truncates on the word of a deposed leader — nor on the word of a suspended
one, whose log is known to lack committed records: that is PARTITION_SUSPENDED too. After a confirmed head, an
epoch this leader does not know ends at its log start (:func:`~tidelog.broker.safety.epoch_end_after_reset`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from tidelog.api.errors import FencedLeaderEpochError, NotLeaderError, OffsetOutOfRangeError, TidelogError
from tidelog.api.wire.fetch import MAX_FETCH_BYTES
from tidelog.api.wire.frames import Op
from tidelog.api.wire.handlers import (
    SENT,
    EarlyReply,
    HandlerEnv,
    Reply,
    Route,
    batches_reply,
    frame_with_file,
    route,
)
from tidelog.api.wire.messages import (
    EpochEndOffsetRequest,
    EpochEndOffsetResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    SegmentFetchRequest,
    SegmentFetchResponse,
    SegmentListRequest,
    SegmentListResponse,
    SegmentSummary,
    encode_message,
)
from tidelog.broker.partition import Partition
from tidelog.broker.safety import epoch_end_after_reset
from tidelog.storage.segment import Buffer


async def replica_fetch(
    env: HandlerEnv, correlation_id: int, request: ReplicaFetchRequest, _payload: memoryview
) -> Reply:
    """Batches from ``request.offset`` up to the log end, long-polling at the tail; see the module docstring."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    refusal = _check_follower(partition, request.replica_id, request.leader_epoch)
    if refusal is not None:
        return _refuse(correlation_id, partition, refusal)
    offset = request.offset
    if not partition.log_start <= offset <= partition.log_end:
        return _refuse(correlation_id, partition, _out_of_range(partition, request.replica_id, offset))
    partition.replica_fetched(request.replica_id, offset)  # its acknowledgement: feeds the HW at once
    max_bytes = min(request.max_bytes, MAX_FETCH_BYTES)
    if offset >= partition.log_end and request.max_wait_ms and not env.winding_down.done():
        # Until the log holds more, the wait times out, or the session winds down (server stopping or follower
        # gone), as fetch._long_poll does for the high watermark; a partition closing raises UNAVAILABLE.
        # The write that ends the wait usually answers it itself (_TailPush).
        push = _TailPush(env, correlation_id, partition, max_bytes)
        await partition.wait_for_log_end(offset, request.max_wait_ms / 1000, env.winding_down, push=push)
        if push.sent:
            return SENT
    end = partition.log_end
    if offset >= end:
        return Reply(encode_message(correlation_id, _bounds(partition)))
    header = _bounds(partition)
    return batches_reply(env, Op.REPLICA_FETCH, correlation_id, header, partition.log, offset, max_bytes, end)


class _TailPush(EarlyReply):
    """Answers a replica fetch long-polling at the log end from inside the write that ends the wait, with the
    batches as written (:meth:`Partition.wait_for_log_end`) and the partition's bounds at that moment: what the
    woken handler would have read back from the file and sent a turn of the loop later, behind the appender's
    fsync round and the other followers' answers. Not when the write is over the fetch's ``max_bytes``."""

    __slots__ = ("_max_bytes", "_partition")

    def __init__(self, env: HandlerEnv, correlation_id: int, partition: Partition, max_bytes: int) -> None:
        super().__init__(env, correlation_id)
        self._partition = partition
        self._max_bytes = max_bytes

    def __call__(self, batches: Sequence[Buffer], size: int, log_end: int) -> None:
        if self.sent or size > self._max_bytes:
            return
        bounds = _bounds(self._partition, log_end=log_end)  # the write may not have reached the log yet
        self.send(Reply(encode_message(self._correlation_id, bounds, batches)))


def acknowledge(env: HandlerEnv, request: ReplicaFetchRequest) -> None:
    """Take a fetch's acknowledgement the moment the session reads it (the route's ``admit`` hook), a turn of
    the loop before its handler task runs: the high watermark, and the acks-ALL produce waiting for it, move
    that much sooner (1 KiB acks-ALL writes, 3 brokers on 2 cores: 30–50 µs from reading the fetch to its
    handler). The same checks as :func:`replica_fetch`, which records it again (harmlessly) and answers any
    refusal; a refused fetch acknowledges nothing."""
    try:
        partition = env.broker.manager.leader_of(request.stream, request.partition)
    except TidelogError:
        return
    offset = request.offset
    if (
        _check_follower(partition, request.replica_id, request.leader_epoch) is None
        and partition.log_start <= offset <= partition.log_end
    ):
        partition.replica_fetched(request.replica_id, offset)


async def epoch_end_offset(
    env: HandlerEnv, correlation_id: int, request: EpochEndOffsetRequest, _payload: memoryview
) -> Reply:
    """Where ``request.leader_epoch`` ends on this leader's log (KIP-279), or ``(-1, -1)`` when unknown."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    epoch = partition.record.leader_epoch
    if request.current_leader_epoch >= 0:
        refusal = _check_follower(partition, request.replica_id, request.current_leader_epoch)
        if refusal is not None:
            body = refusal.to_error_body()
            return Reply(encode_message(correlation_id, EpochEndOffsetResponse(epoch, -1, body)))
    suspended = partition.safety.refusal()
    if suspended is not None:  # the follower keeps its log until the head is confirmed (module docstring)
        return Reply(encode_message(correlation_id, EpochEndOffsetResponse(epoch, -1, suspended.to_error_body())))
    answer = partition.log.end_offset_for_epoch(request.leader_epoch)
    answer = epoch_end_after_reset(partition.record, request.leader_epoch, answer, partition.log_start)
    response = EpochEndOffsetResponse(answer.epoch, answer.end_offset)
    return Reply(encode_message(correlation_id, response))


async def segment_list(
    env: HandlerEnv, correlation_id: int, request: SegmentListRequest, _payload: memoryview
) -> Reply:
    """The sealed segments holding offsets at or after ``request.offset``, oldest first; see the module docstring."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    refusal = _check_follower(partition, request.replica_id, request.leader_epoch)
    if refusal is not None:
        return Reply(encode_message(correlation_id, _listing(partition, (), refusal)))
    sealed = partition.log.segments[:-1]
    listed = tuple(
        SegmentSummary(s.base_offset, s.next_offset, s.size, s.max_timestamp)
        for s in sealed
        if s.next_offset > request.offset
    )[: request.max_segments]
    return Reply(encode_message(correlation_id, _listing(partition, listed)))


async def segment_fetch(
    env: HandlerEnv, correlation_id: int, request: SegmentFetchRequest, _payload: memoryview
) -> Reply:
    """Raw bytes of one sealed segment file; see the module docstring."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    epoch = partition.record.leader_epoch
    refusal = _check_follower(partition, request.replica_id, request.leader_epoch)
    if refusal is not None:
        response = SegmentFetchResponse(0, 0, partition.log_start, epoch, refusal.to_error_body())
        return Reply(encode_message(correlation_id, response))
    max_bytes = min(request.max_bytes, MAX_FETCH_BYTES)
    found = partition.log.sealed_segment_range(request.base_offset, request.position, max_bytes)
    if found is None:
        return _segment_gone(correlation_id, partition, f"no sealed segment at {request.base_offset} (deleted?)")
    file, size = found
    file_id = os.fstat(file.fd).st_ino  # a compaction renames a new file into place: another inode
    if request.file_id and request.file_id != file_id:
        file.close()
        return _segment_gone(correlation_id, partition, f"segment {request.base_offset} was rewritten meanwhile")
    header = SegmentFetchResponse(size, file_id, partition.log_start, epoch)
    if env.zero_copy:
        return frame_with_file(Op.SEGMENT_FETCH, correlation_id, header, file)
    with file:
        data = await asyncio.to_thread(os.pread, file.fd, file.length, file.position)
    return Reply(encode_message(correlation_id, header, data))


def _segment_gone(correlation_id: int, partition: Partition, reason: str) -> Reply:
    error = OffsetOutOfRangeError(f"{partition.name}: {reason}").to_error_body()
    response = SegmentFetchResponse(0, 0, partition.log_start, partition.record.leader_epoch, error)
    return Reply(encode_message(correlation_id, response))


def _listing(
    partition: Partition, segments: tuple[SegmentSummary, ...], error: TidelogError | None = None
) -> SegmentListResponse:
    body = None if error is None else error.to_error_body()
    return SegmentListResponse(
        partition.high_watermark,
        partition.log_start,
        partition.log_end,
        partition.record.leader_epoch,
        segments,
        body,
    )


def _out_of_range(partition: Partition, replica_id: str, offset: int) -> TidelogError:
    """The refusal of a fetch outside the log. Beyond its end, the fetch is first taken as evidence
    (:meth:`Partition.replica_fetched`): a suspended leader answers PARTITION_SUSPENDED (module docstring)."""
    start, end = partition.log_start, partition.log_end
    if offset > end:
        partition.replica_fetched(replica_id, offset)
        suspended = partition.safety.refusal()
        if suspended is not None:
            return suspended
    return OffsetOutOfRangeError(
        f"replica {replica_id} fetches {partition.name} at {offset}, outside the leader's [{start}, {end}]"
    )


def _check_follower(partition: Partition, replica_id: str, leader_epoch: int) -> TidelogError | None:
    """Why ``replica_id`` following at ``leader_epoch`` may not fetch from ``partition``; None when it may."""
    epoch = partition.record.leader_epoch
    if leader_epoch < epoch:
        return FencedLeaderEpochError(
            f"replica {replica_id} follows {partition.name} at leader epoch {leader_epoch}; it is {epoch} now"
        )
    if leader_epoch > epoch:
        return NotLeaderError(
            f"replica {replica_id} follows {partition.name} at leader epoch {leader_epoch}, "
            f"newer than this leader's {epoch}: this broker's leadership is stale"
        )
    if partition.followers.state(replica_id) is None:
        replicas = ",".join(partition.record.replicas)
        return NotLeaderError(
            f"broker {replica_id} is not a follower of {partition.name} at leader epoch {epoch} "
            f"(replicas {replicas}): refresh metadata"
        )
    return None


def _bounds(
    partition: Partition, error: TidelogError | None = None, *, log_end: int | None = None
) -> ReplicaFetchResponse:
    body = None if error is None else error.to_error_body()
    end = partition.log_end if log_end is None else log_end
    return ReplicaFetchResponse(partition.high_watermark, partition.log_start, end, partition.record.leader_epoch, body)


def _refuse(correlation_id: int, partition: Partition, error: TidelogError) -> Reply:
    return Reply(encode_message(correlation_id, _bounds(partition, error)))


ROUTES: dict[int, Route] = {
    Op.REPLICA_FETCH: route(ReplicaFetchRequest, replica_fetch, acknowledge),
    Op.EPOCH_END_OFFSET: route(EpochEndOffsetRequest, epoch_end_offset),
    Op.SEGMENT_LIST: route(SegmentListRequest, segment_list),
    Op.SEGMENT_FETCH: route(SegmentFetchRequest, segment_fetch),
}
