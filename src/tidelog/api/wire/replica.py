"""The replication family of the wire protocol, leader side: REPLICA_FETCH and EPOCH_END_OFFSET.

Followers pull. A follower's REPLICA_FETCH names the offset it wants next, which is its log end: that is its
acknowledgement of everything below (with flush ``always``, fsynced before it asked), and the leader records it
with :meth:`Partition.replica_fetched` as the session reads the request (:func:`acknowledge`, the route's
``admit`` hook), before the handler even runs, so the high watermark moves as soon as the request arrives,
not when the next batch does. The answer carries batches from that offset up to the log
*end* (followers copy uncommitted batches too: that is what lets them acknowledge them), exactly as stored,
plus the leader's high watermark, bounds and epoch. At the tail the fetch waits for the next write, not for
the HW: the leader's fsync and the followers' copy overlap instead of adding up. It waits *parked*
(:func:`park_at_tail`, the route's ``park`` hook, run as the session reads it): a future that is its slot in
the session, a timer, and a place among the partition's waiters (:meth:`Partition.park_at_log_end`), with no
handler task. The write that ends the wait answers it itself, from inside the append, with the batches being
written (:class:`_TailFetch`, through the session's ``reply_now``): both followers have their copy before the
leader's fsync round even starts. When it cannot (a write over the fetch's ``max_bytes``, one copied from a
spool file, a session busy writing), the batches are read back from the log a turn of the loop later. A
handler task waiting instead costs the leader CPU and latency on every replicated write (docs/performance.md).

What is refused, and how (errors inside the response, so the follower also learns the leader's epoch and
bounds without another round trip; a broker that does not lead at all answers with an error frame, from
:meth:`~tidelog.broker.manager.PartitionManager.leader_of`):

- a request from another leadership than this one, or from no replica of the partition: FENCED_LEADER_EPOCH
  or NOT_LEADER, decided by :mod:`tidelog.replication.leader.fencing`
  (:meth:`~tidelog.broker.partitions.partition.Partition.fence_follower`);
- an offset outside ``[log_start, log_end]``: OFFSET_OUT_OF_RANGE with the bounds. Below the log start means
  far-horizon catch-up. Above the log end, after the follower's epoch truncation, the follower holds offsets the
  leader lacks: evidence that consistency is lost (:mod:`tidelog.broker.partitions.safety`), which suspends appends, and
  the answer is PARTITION_SUSPENDED, so that the follower keeps its copy instead of cutting it to the leader's
  end. Only where an operator confirmed the head for this leadership is it OFFSET_OUT_OF_RANGE: the follower
  cuts what the operator gave up.

None of these record the follower's offset: a refused fetch acknowledges nothing.

SEGMENT_LIST and SEGMENT_FETCH serve far-horizon catch-up (:mod:`tidelog.replication.follower.catch_up`): a follower
that is behind the log start, or too many bytes behind, lists the sealed segments from its log end and copies
them as whole files, in chunks. Only sealed segments: the active one changes under the reader and fetching
covers it. A chunk is the segment file's raw bytes, sent with ``os.sendfile`` on plain TCP like a fetch,
unchecked here (the follower checks every batch of the whole file). A segment that is no longer there
(retention deleted it meanwhile) or whose file was replaced since the first chunk (compaction) is refused with
OFFSET_OUT_OF_RANGE, and the follower starts its round again. Both are fenced like REPLICA_FETCH and record
nothing: copying files is no acknowledgement.

EPOCH_END_OFFSET answers KIP-279's question "where does my latest epoch end on your log?" from the leader's
epoch cache (:meth:`Log.end_offset_for_epoch`); the follower truncates there before fetching (see
:mod:`tidelog.replication.follower.truncation`). It is fenced like a fetch when the follower names the leadership it
believes in, so a follower never truncates on the word of a deposed leader — nor on the word of a suspended
one, whose log is known to lack committed records: that is PARTITION_SUSPENDED too. After a confirmed head, an
epoch this leader does not know ends at its log start (:func:`~tidelog.broker.partitions.safety.epoch_end_after_reset`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from tidelog.api.wire import reassign_throttle
from tidelog.api.wire.fetch import MAX_FETCH_BYTES
from tidelog.api.wire.handlers import (
    SENT,
    HandlerEnv,
    Reply,
    Route,
    batches_reply,
    frame_with_file,
    route,
)
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.safety import epoch_end_after_reset
from tidelog.protocol.errors import OffsetOutOfRangeError, TidelogError, UnavailableError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.peer_messages import (
    EpochEndOffsetRequest,
    EpochEndOffsetResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    SegmentFetchRequest,
    SegmentFetchResponse,
    SegmentListRequest,
    SegmentListResponse,
    SegmentSummary,
)
from tidelog.storage.file_writes import Buffer


async def replica_fetch(
    env: HandlerEnv, correlation_id: int, request: ReplicaFetchRequest, _payload: memoryview
) -> Reply:
    """Batches from ``request.offset`` up to the log end, at once; see the module docstring. A fetch that waits
    at the tail never gets here: :func:`park_at_tail` took it as it was read."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    refusal = partition.fence_follower(request.replica_id, request.leader_epoch)
    if refusal is not None:
        return _refuse(correlation_id, partition, refusal)
    offset = request.offset
    if not partition.local_log_start <= offset <= partition.log_end:
        return _refuse(correlation_id, partition, out_of_range(partition, request.replica_id, offset))
    partition.replica_fetched(request.replica_id, offset)  # its acknowledgement: feeds the HW at once
    max_bytes = reassign_throttle.answer_cap(
        partition.record, request.replica_id, min(request.max_bytes, MAX_FETCH_BYTES)
    )
    await reassign_throttle.pace(partition, partition.record, request.replica_id)
    reply = _from_log(env, correlation_id, partition, offset, max_bytes, verify=request.verify)
    reassign_throttle.charge(partition, partition.record, request.replica_id, reply)
    return reply


def _from_log(
    env: HandlerEnv, correlation_id: int, partition: Partition, offset: int, max_bytes: int, *, verify: bool = False
) -> Reply:
    """The batches from ``offset`` up to the log end, or just the bounds when there are none. With ``verify``
    they are read into memory and CRC-checked (the follower found a bad batch in a zero-copy answer: damage on
    this disk is found and recorded, :mod:`tidelog.storage.damage`)."""
    end = partition.log_end
    header = _bounds(partition)
    if offset >= end:
        return Reply(encode_message(correlation_id, header))
    if verify:
        return Reply(encode_message(correlation_id, header, partition.log.read(offset, max_bytes, max_offset=end)))
    return batches_reply(env, Op.REPLICA_FETCH, correlation_id, header, partition.log, offset, max_bytes, end)


def park_at_tail(env: HandlerEnv, correlation_id: int, request: ReplicaFetchRequest) -> asyncio.Future[Reply] | None:
    """The route's ``park`` hook: a fetch at the log end that may wait waits as a :class:`_TailFetch`, with no
    handler task; None (the handler answers at once) for any other fetch, a refused one included."""
    if not request.max_wait_ms or env.winding_down.done():
        return None
    try:
        partition = env.broker.manager.leader_of(request.stream, request.partition)
    except TidelogError:
        return None
    offset = request.offset
    if offset != partition.log_end or partition.fence_follower(request.replica_id, request.leader_epoch):
        return None
    fetch = _TailFetch(env, correlation_id, partition, offset, min(request.max_bytes, MAX_FETCH_BYTES))
    try:
        partition.park_at_log_end(offset, fetch)
    except TidelogError:  # closing: the handler answers (with the error)
        return None
    fetch.start(request.max_wait_ms / 1000)
    return fetch.reply


class _TailFetch:
    """A replica fetch waiting at the log end: a future that is the session's slot for it, a timer, and a place
    among the partition's waiters (:meth:`Partition.park_at_log_end`). No task: a follower's fetch waits like
    this between every two writes, and a handler task cost the leader two task steps and a coroutine chain per
    fetch, one of them right where the next produce arrives (see docs/performance.md).

    The write that starts here answers it from inside the append, with the batches being written and the log
    end they make, straight to the follower's socket through the session's ``reply_now``. When it cannot (a
    write over ``max_bytes``, one copied from a spool file, a session busy writing) the batches are read back
    from the log a turn of the loop later, once the write is in. The timer, and the session winding down
    (server stopping, follower gone), answer with what the log holds (usually nothing); the partition closing
    answers with its error."""

    __slots__ = ("_correlation_id", "_env", "_max_bytes", "_offset", "_partition", "_timer", "reply")

    def __init__(self, env: HandlerEnv, correlation_id: int, partition: Partition, offset: int, max_bytes: int) -> None:
        self._env = env
        self._correlation_id = correlation_id
        self._partition = partition
        self._offset = offset
        self._max_bytes = max_bytes
        self._timer: asyncio.TimerHandle | None = None
        self.reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

    def start(self, timeout: float) -> None:
        """Parked: start the timer and listen for the session winding down, until the reply is settled."""
        self._timer = asyncio.get_running_loop().call_later(timeout, self._answer_from_log)
        self._env.winding_down.add_done_callback(self._wind_down)
        self.reply.add_done_callback(self._leave)

    def written(self, batches: Sequence[Buffer] | None, size: int, log_end: int) -> None:
        if self.reply.done():
            return
        if batches is not None and size <= self._max_bytes:
            bounds = _bounds(self._partition, log_end=log_end)  # the write may not have reached the log yet
            if self._env.reply_now(self.reply, Reply(encode_message(self._correlation_id, bounds, batches))):
                self.reply.set_result(SENT)
                return
        asyncio.get_running_loop().call_soon(self._answer_from_log)  # after the write is in

    def closed(self, error: TidelogError) -> None:
        if not self.reply.done():
            self.reply.set_exception(error)

    def _wind_down(self, _winding_down: asyncio.Future[None]) -> None:
        self._answer_from_log()

    def _answer_from_log(self) -> None:
        if self.reply.done():
            return
        try:
            reply = _from_log(self._env, self._correlation_id, self._partition, self._offset, self._max_bytes)
        except Exception as exc:  # the session answers with the error frame, as for a handler's
            self.reply.set_exception(exc)
            return
        self.reply.set_result(reply)

    def _leave(self, _reply: asyncio.Future[Reply]) -> None:
        """Answered, or dropped by the session (cancelled): stop the timer, leave the partition's waiters."""
        if self._timer is not None:
            self._timer.cancel()
        self._env.winding_down.remove_done_callback(self._wind_down)
        self._partition.unpark(self._offset, self)


def acknowledge(env: HandlerEnv, request: ReplicaFetchRequest) -> None:
    """Take a fetch's acknowledgement the moment the session reads it (the route's ``admit`` hook), a turn of
    the loop before its handler task runs: the high watermark, and the acks-ALL produce waiting for it, move
    that much sooner (docs/performance.md). The same checks as :func:`replica_fetch`, which records it again
    (harmlessly) and answers any refusal; a refused fetch acknowledges nothing."""
    try:
        partition = env.broker.manager.leader_of(request.stream, request.partition)
    except TidelogError:
        return
    record_ack(partition, request.replica_id, request.leader_epoch, request.offset)


def record_ack(partition: Partition, replica_id: str, leader_epoch: int, offset: int) -> None:
    """Record ``offset`` as ``replica_id``'s acknowledgement, unless a fetch at it is refused (fenced by epoch or
    replica set, or outside ``[log_start, log_end]``); shared by REPLICA_FETCH and SESSION_FETCH."""
    if (
        partition.fence_follower(replica_id, leader_epoch) is None
        and partition.local_log_start <= offset <= partition.log_end
    ):
        partition.replica_fetched(replica_id, offset)


async def epoch_end_offset(
    env: HandlerEnv, correlation_id: int, request: EpochEndOffsetRequest, _payload: memoryview
) -> Reply:
    """Where ``request.leader_epoch`` ends on this leader's log (KIP-279), or ``(-1, -1)`` when unknown."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    epoch = partition.record.leader_epoch
    if request.current_leader_epoch >= 0:
        refusal = partition.fence_follower(request.replica_id, request.current_leader_epoch)
        if refusal is not None:
            body = refusal.to_error_body()
            return Reply(encode_message(correlation_id, EpochEndOffsetResponse(epoch, -1, body)))
    suspended = partition.safety.refusal()
    if suspended is not None:  # the follower keeps its log until the head is confirmed (module docstring)
        return Reply(encode_message(correlation_id, EpochEndOffsetResponse(epoch, -1, suspended.to_error_body())))
    answer = partition.log.end_offset_for_epoch(request.leader_epoch)
    answer = epoch_end_after_reset(partition.record, request.leader_epoch, answer, partition.local_log_start)
    response = EpochEndOffsetResponse(answer.epoch, answer.end_offset)
    return Reply(encode_message(correlation_id, response))


async def segment_list(
    env: HandlerEnv, correlation_id: int, request: SegmentListRequest, _payload: memoryview
) -> Reply:
    """The sealed segments holding offsets at or after ``request.offset``, oldest first; see the module docstring."""
    partition = env.broker.manager.leader_of(request.stream, request.partition)
    refusal = partition.fence_follower(request.replica_id, request.leader_epoch)
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
    refusal = partition.fence_follower(request.replica_id, request.leader_epoch)
    if refusal is not None:
        response = SegmentFetchResponse(0, 0, partition.local_log_start, epoch, refusal.to_error_body())
        return Reply(encode_message(correlation_id, response))
    max_bytes = reassign_throttle.answer_cap(
        partition.record, request.replica_id, min(request.max_bytes, MAX_FETCH_BYTES)
    )
    await reassign_throttle.pace(partition, partition.record, request.replica_id)
    found = partition.log.sealed_segment_range(request.base_offset, request.position, max_bytes)
    if found is None:
        return _segment_gone(correlation_id, partition, f"no sealed segment at {request.base_offset} (deleted?)")
    file, size = found
    file_id = os.fstat(file.fd).st_ino  # a compaction renames a new file into place: another inode
    if request.file_id and request.file_id != file_id:
        file.close()
        return _segment_gone(correlation_id, partition, f"segment {request.base_offset} was rewritten meanwhile")
    header = SegmentFetchResponse(size, file_id, partition.local_log_start, epoch)
    reassign_throttle.charge(partition, partition.record, request.replica_id, Reply([], file))
    if env.zero_copy:
        return frame_with_file(Op.SEGMENT_FETCH, correlation_id, header, file)
    with file:
        data = await asyncio.to_thread(os.pread, file.fd, file.length, file.position)
    return Reply(encode_message(correlation_id, header, data))


def _segment_gone(correlation_id: int, partition: Partition, reason: str) -> Reply:
    error = OffsetOutOfRangeError(f"{partition.name}: {reason}").to_error_body()
    response = SegmentFetchResponse(0, 0, partition.local_log_start, partition.record.leader_epoch, error)
    return Reply(encode_message(correlation_id, response))


def _listing(
    partition: Partition, segments: tuple[SegmentSummary, ...], error: TidelogError | None = None
) -> SegmentListResponse:
    body = None if error is None else error.to_error_body()
    return SegmentListResponse(
        partition.high_watermark,
        partition.local_log_start,
        partition.log_end,
        partition.record.leader_epoch,
        segments,
        body,
    )


def out_of_range(partition: Partition, replica_id: str, offset: int) -> TidelogError:
    """The refusal of a fetch outside the log. Beyond its end, the fetch is first taken as evidence
    (:meth:`Partition.replica_fetched`): a suspended leader answers PARTITION_SUSPENDED (module docstring)."""
    start, end = partition.local_log_start, partition.log_end
    if offset > end:
        partition.replica_fetched(replica_id, offset)
        suspended = partition.safety.refusal()
        if suspended is not None:
            return suspended
        if partition.log.flusher.failed is not None:  # a write failed after its followers had it: they keep it
            return UnavailableError(f"{partition.name}: the leader's log failed; its leadership moves on")
    return OffsetOutOfRangeError(
        f"replica {replica_id} fetches {partition.name} at {offset}, outside the leader's [{start}, {end}]"
    )


def _bounds(
    partition: Partition, error: TidelogError | None = None, *, log_end: int | None = None
) -> ReplicaFetchResponse:
    body = None if error is None else error.to_error_body()
    end = partition.log_end if log_end is None else log_end
    return ReplicaFetchResponse(
        partition.high_watermark, partition.local_log_start, end, partition.record.leader_epoch, body
    )


def _refuse(correlation_id: int, partition: Partition, error: TidelogError) -> Reply:
    return Reply(encode_message(correlation_id, _bounds(partition, error)))


ROUTES: dict[int, Route] = {
    Op.REPLICA_FETCH: route(ReplicaFetchRequest, replica_fetch, acknowledge, park_at_tail),
    Op.EPOCH_END_OFFSET: route(EpochEndOffsetRequest, epoch_end_offset),
    Op.SEGMENT_LIST: route(SegmentListRequest, segment_list),
    Op.SEGMENT_FETCH: route(SegmentFetchRequest, segment_fetch),
}
