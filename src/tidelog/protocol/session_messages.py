"""SESSION_FETCH: a follower copies every partition it follows from one leader broker in one request.

One request names many partitions (:class:`SessionFetchEntry`: where the follower's copy ends, the leadership it
follows, the leader high watermark it already knows); one response carries, for each partition with something to
say (batches, a moved high watermark, an error), a :class:`SessionFetchPartition` and that partition's batches,
one after the other in the payload (``size`` bytes each, in the order of ``partitions``). Partitions with
nothing new are left out. The request's ``max_bytes`` is one budget shared by all of them; the leader fills it
in request order, and the follower rotates that order each round, so a hot partition cannot starve the others.

Each entry is an acknowledgement like a REPLICA_FETCH's, and refused like one, for itself alone: a per-partition
error travels in its :class:`SessionFetchPartition` and the others are served. The wire op, the long-poll and
the budget are described where they are served (:mod:`tidelog.api.wire.session_fetch`) and fetched
(:mod:`tidelog.replication.follower.session`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.protocol.frames import ProtocolError
from tidelog.protocol.messages import ByteCount, ErrorBody, Header, Millis, Name, Offset, PartitionId
from tidelog.protocol.peer_messages import LeaderEpoch


class SessionFetchEntry(Header, frozen=True):
    """One partition of a session fetch: copy ``stream``/``partition`` from ``offset`` (the follower's log end,
    its acknowledgement of everything below) as a follower of ``leader_epoch``."""

    stream: Name
    partition: PartitionId
    offset: Offset
    leader_epoch: LeaderEpoch
    known_hw: Offset = 0  # the leader HW the follower holds: an unchanged one, with no data, is not repeated
    verify: bool = False  # the follower's copy of the last answer failed its CRC: check the disk's bytes


class SessionFetchRequest(Header, frozen=True):
    """Many partitions from one leader broker, for one follower broker (``replica_id``)."""

    replica_id: Name
    entries: tuple[SessionFetchEntry, ...]
    max_bytes: ByteCount = 8 * 1024 * 1024  # shared by all entries, filled in request order
    partition_max_bytes: ByteCount = 1024 * 1024  # soft, per partition: its first batch comes whole
    max_wait_ms: Millis = 500  # long-poll until any partition has data (or news), at most this long


class SessionFetchPartition(Header, frozen=True):
    """What the leader says about one partition: its bounds and epoch as of the answer, an error, and ``size``
    bytes of batches in the payload (exactly as stored, up to the log end)."""

    stream: Name
    partition: PartitionId
    high_watermark: Offset
    log_start: Offset
    log_end: Offset
    leader_epoch: LeaderEpoch
    size: ByteCount = 0
    error: ErrorBody | None = None  # FENCED_LEADER_EPOCH, NOT_LEADER, OFFSET_OUT_OF_RANGE…, as for REPLICA_FETCH


class SessionFetchResponse(Header, frozen=True):
    """The partitions with something to say; their batches follow in the payload, in this order."""

    partitions: tuple[SessionFetchPartition, ...] = ()


def split_payload(
    response: SessionFetchResponse, payload: memoryview
) -> list[tuple[SessionFetchPartition, memoryview]]:
    """Each partition's slice of the payload; ProtocolError when the sizes do not add up to the payload's."""
    parts: list[tuple[SessionFetchPartition, memoryview]] = []
    position = 0
    for entry in response.partitions:
        end = position + entry.size
        if end > len(payload):
            raise ProtocolError(
                f"session fetch: {entry.stream}/{entry.partition} claims {entry.size} bytes, "
                f"{len(payload) - position} are left in the payload"
            )
        parts.append((entry, payload[position:end]))
        position = end
    if position != len(payload):
        raise ProtocolError(f"session fetch: {len(payload) - position} payload bytes belong to no partition")
    return parts


def rotated(entries: Sequence[SessionFetchEntry], start: int) -> tuple[SessionFetchEntry, ...]:
    """``entries`` starting at ``start`` (modulo their number): the order the leader fills the budget in."""
    if not entries:
        return ()
    cut = start % len(entries)
    return (*entries[cut:], *entries[:cut])
