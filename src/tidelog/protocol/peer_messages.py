"""Frame headers that brokers send each other: control requests to the controller, replica fetches and the
far-horizon catch-up of whole sealed segments.

Clients never send these; they share the base :class:`~tidelog.protocol.messages.Header`, the field types and
the evolution rules of :mod:`tidelog.protocol.messages`, and their routes are in
:mod:`tidelog.protocol.message_codec`. Leader epochs travel in each one so that a leader refuses a follower of
another leadership, and a follower never truncates or copies on the word of a deposed leader.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from tidelog.protocol.messages import (
    INT32_MAX,
    INT64_MAX,
    ByteCount,
    ErrorBody,
    Header,
    Millis,
    Name,
    Offset,
    OffsetOrNone,
    PartitionId,
)

# -- control: broker to controller -------------------------------------------------------------------------------


class AlterIsrRequest(Header, frozen=True):
    """A leader asks for a new ISR; valid only for the leader of ``leader_epoch`` (the controller checks)."""

    stream: Name
    partition: PartitionId
    leader_id: Name
    leader_epoch: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
    isr: tuple[str, ...]


class AlterIsrResponse(Header, frozen=True):
    leader_epoch: int
    isr: tuple[str, ...]


class ReportUnreachableRequest(Header, frozen=True):
    """A follower could not connect to ``broker_id``: a hint, which the controller verifies itself."""

    reporter_id: Name
    broker_id: Name


class ReportUnreachableResponse(Header, frozen=True):
    pass


class ControlledShutdownRequest(Header, frozen=True):
    """``broker_id`` is stopping: move its leaderships to other ISR members and take it out of the ISRs."""

    broker_id: Name


class ControlledShutdownResponse(Header, frozen=True):
    remaining: int  # partitions it still leads (no other ISR member to take over)


class SuspendPartitionRequest(Header, frozen=True):
    """The leader of ``leader_epoch`` found evidence of lost consistency and refuses appends: record it."""

    stream: Name
    partition: PartitionId
    leader_id: Name
    leader_epoch: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
    reason: str


class SuspendPartitionResponse(Header, frozen=True):
    pass


# -- replication: follower to leader -----------------------------------------------------------------------------

LeaderEpoch = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
LeaderEpochOrNone = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]  # -1: undefined (no epoch known)


class ReplicaFetchRequest(Header, frozen=True):
    """A follower copies the leader's log from ``offset``, its log end: asking for it acknowledges everything
    below (with flush ``always``, fsynced), which is what moves the leader's high watermark.

    ``leader_epoch`` is the epoch the follower follows; the leader refuses any other, so a follower never
    copies from a deposed leader, nor a leader counts acknowledgements meant for another leadership."""

    stream: Name
    partition: PartitionId
    replica_id: Name  # the follower's broker id
    offset: Offset
    leader_epoch: LeaderEpoch
    max_bytes: ByteCount = 1024 * 1024  # soft, as for FETCH: the first batch comes whole
    max_wait_ms: Millis = 500  # long-poll at the log end (not the HW: followers copy uncommitted batches)
    verify: bool = False  # the follower's copy of the last answer failed its CRC: check the disk's bytes


class ReplicaFetchResponse(Header, frozen=True):
    """The leader's bounds and epoch when the response was built; the payload holds batches up to the log end,
    committed or not, exactly as stored (offsets and leader epochs included)."""

    high_watermark: Offset
    log_start: Offset
    log_end: Offset
    leader_epoch: LeaderEpoch
    error: ErrorBody | None = None  # FENCED_LEADER_EPOCH, NOT_LEADER, OFFSET_OUT_OF_RANGE (with the bounds)


class EpochEndOffsetRequest(Header, frozen=True):
    """KIP-279's OffsetsForLeaderEpoch for one partition: where does ``leader_epoch`` end on the leader?

    ``current_leader_epoch`` (KIP-320) is the leadership the follower believes in; a leader at another epoch
    refuses, so a follower never truncates on the word of a deposed leader. -1 skips that check."""

    stream: Name
    partition: PartitionId
    replica_id: Name
    leader_epoch: LeaderEpochOrNone  # the follower's latest epoch
    current_leader_epoch: LeaderEpochOrNone = -1


class EpochEndOffsetResponse(Header, frozen=True):
    """The largest epoch ≤ the one asked that the leader knows, and the offset where it ends on the leader;
    ``(-1, -1)`` when it knows none (the follower then falls back to its high watermark)."""

    leader_epoch: LeaderEpochOrNone
    end_offset: OffsetOrNone
    error: ErrorBody | None = None


# -- far-horizon catch-up: follower to leader --------------------------------------------------------------------

SegmentBytes = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]


class SegmentListRequest(Header, frozen=True):
    """List the leader's *sealed* segments holding offsets at or after ``offset`` (the follower's log end), in
    offset order: what a follower too far behind copies as whole files (seed 001's far-horizon catch-up).

    Fenced like REPLICA_FETCH: only a replica following ``leader_epoch`` is answered. The active segment is
    never listed: fetching copies it."""

    stream: Name
    partition: PartitionId
    replica_id: Name
    offset: Offset
    leader_epoch: LeaderEpoch
    max_segments: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 1000


class SegmentSummary(Header, frozen=True):
    """One sealed segment: offsets ``[base_offset, next_offset)`` in ``size`` bytes."""

    base_offset: Offset
    next_offset: Offset
    size: SegmentBytes
    max_timestamp: int | None = None  # ns; None when it holds no batch


class SegmentListResponse(Header, frozen=True):
    """The leader's bounds and epoch (as a REPLICA_FETCH answer carries them) and the segments listed."""

    high_watermark: Offset
    log_start: Offset
    log_end: Offset
    leader_epoch: LeaderEpoch
    segments: tuple[SegmentSummary, ...] = ()
    error: ErrorBody | None = None  # FENCED_LEADER_EPOCH, NOT_LEADER


class SegmentFetchRequest(Header, frozen=True):
    """Raw bytes ``[position, position + max_bytes)`` of the sealed segment based at ``base_offset``.

    ``file_id`` is the one the first answer for this segment named (0 on the first request): the leader refuses
    when its file is another by now (compaction rewrote it), so a download never mixes two files."""

    stream: Name
    partition: PartitionId
    replica_id: Name
    leader_epoch: LeaderEpoch
    base_offset: Offset
    position: SegmentBytes
    max_bytes: ByteCount = 4 * 1024 * 1024
    file_id: SegmentBytes = 0


class SegmentFetchResponse(Header, frozen=True):
    """The segment's total ``size`` and ``file_id``; the payload holds the bytes asked for (fewer at the file's
    end), exactly as stored and not checked by the leader: the follower checks every batch."""

    size: SegmentBytes
    file_id: SegmentBytes
    log_start: Offset
    leader_epoch: LeaderEpoch
    error: ErrorBody | None = None  # OFFSET_OUT_OF_RANGE: no such sealed segment (retention deleted it), or
    # its file changed; FENCED_LEADER_EPOCH, NOT_LEADER as for REPLICA_FETCH
