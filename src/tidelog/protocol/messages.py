"""Frame headers of the tidelog wire protocol: one msgspec ``Struct`` per op and direction.

Headers are small and positional (``array_like``): a produce request header is ``["orders", 3, 1, 5000]`` in
msgpack, about a dozen bytes, and msgspec decodes it into a typed, validated object in well under a
microsecond. Record batches never go through msgpack: they are the frame's payload, untouched
(:mod:`tidelog.protocol.frames`).

Evolution: fields are only ever appended, each new one with a default. A decoder ignores trailing fields it
does not know and fills in defaults for trailing fields the sender omitted, so old and new peers interoperate
without a version bump. Never reorder, remove or retype a field.

Watermarks on this protocol are *exclusive*, as in Kafka: ``high_watermark`` is one past the last committed
offset (consumers read below it) and ``log_end`` is the offset the next record will get. The Liftbridge gRPC
API reports the last offsets instead (``-1`` when empty); that translation belongs to the gRPC layer.

A response that has something useful to say besides the failure carries an ``error`` field instead: a produce
whose batches were written but not acknowledged by the ISR in time still names its offsets, and a fetch below
the log start still returns the log's bounds, so the client can act without another round trip.

Broker-to-broker headers are in :mod:`tidelog.protocol.peer_messages`; the table of which header goes with
which frame, and the encoding and decoding of headers, are in :mod:`tidelog.protocol.message_codec`.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

PartitionId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Offset = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
OffsetOrNone = Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]  # -1: unknown, or nothing there
Millis = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
ByteCount = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Name = Annotated[str, msgspec.Meta(min_length=1)]


class Acks(enum.IntEnum):
    """When a produce is acknowledged. Numbered as Liftbridge's ``AckPolicy`` so the gRPC layer passes it on."""

    LEADER = 0  # written to the leader's log
    ALL = 1  # committed: written by every ISR member (tidelog's default)
    NONE = 2  # not waited for; offsets in the response are -1


class Isolation(enum.IntEnum):
    """What a fetch may return."""

    COMMITTED = 0  # below the high watermark: what consumers see
    UNCOMMITTED = 1  # up to the log end: tooling and diagnostics (replicas use REPLICA_FETCH)


class Header(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Base of every header: frozen, positional, and untracked by the GC (headers never form cycles).

    msgspec passes these options on to subclasses; each subclass still says ``frozen=True`` because mypy's
    dataclass model of a Struct does not inherit it."""


class ErrorBody(Header, frozen=True):
    """A failure on the wire. ``code`` is an ``ErrorCode`` from :mod:`tidelog.protocol.errors`, kept as a plain int
    so that a code added by a newer peer still decodes; ``retriable`` travels too, so an older client knows
    whether to retry a code it has never heard of."""

    code: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
    message: str = ""
    retriable: bool = False


# -- produce ---------------------------------------------------------------------------------------------------


class ProduceRequest(Header, frozen=True):
    """Append the payload's record batches (one or more, concatenated) to one partition."""

    stream: Name
    partition: PartitionId
    acks: Acks = Acks.ALL
    timeout_ms: Millis = 5_000  # how long the leader waits for the ISR before answering TIMEOUT


class ProduceResponse(Header, frozen=True):
    """Offsets assigned to the first and last record produced; -1 when unknown (``Acks.NONE``)."""

    base_offset: OffsetOrNone
    last_offset: OffsetOrNone
    error: ErrorBody | None = None  # e.g. TIMEOUT after the write: the offsets are real but not committed


# -- fetch ------------------------------------------------------------------------------------------------------


class GroupContext(Header, frozen=True):
    """A request made on behalf of a consumer group member: the group, the member and the group epoch it holds.

    A broker refuses the request unless ``epoch`` is the group's current epoch and the request's partition is
    assigned to ``consumer_id`` at it (STALE_GROUP_EPOCH; UNKNOWN_GROUP, UNKNOWN_MEMBER): a member that missed a
    rebalance can neither read nor commit a partition that moved (:mod:`tidelog.broker.groups.fencing`)."""

    group_id: str
    consumer_id: str
    epoch: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]


class FetchRequest(Header, frozen=True):
    """Read batches from ``offset``; long-polls up to ``max_wait_ms`` until ``min_bytes`` are available.
    ``group``: read as that consumer group member (refused unless it owns the partition at the group's epoch)."""

    stream: Name
    partition: PartitionId
    offset: Offset
    max_bytes: ByteCount = 1024 * 1024  # soft: the first batch is returned whole even if larger
    max_wait_ms: Millis = 500
    min_bytes: ByteCount = 1
    isolation: Isolation = Isolation.COMMITTED
    verify: bool = False  # the client's CRC check failed on an answer from this offset: check the disk's bytes
    replica: bool = False  # read this broker's copy even as an in-sync follower (a replica restoring damage)
    group: GroupContext | None = None  # a consumer group member's fetch: fenced by its group epoch
    isr_read: bool = False  # a consumer's read of this broker's copy when an in-sync follower (readISRReplica)


class FetchResponse(Header, frozen=True):
    """The partition's bounds when the response was built; the payload holds the batches (maybe none)."""

    high_watermark: Offset
    log_start: Offset
    log_end: Offset
    error: ErrorBody | None = None  # e.g. OFFSET_OUT_OF_RANGE, with the bounds to reset to
    damaged_first: OffsetOrNone = -1  # OFFSET_DAMAGED: the damaged range, inclusive; read on from last + 1
    damaged_last: OffsetOrNone = -1
    readonly: bool = False  # the partition is read-only: a reader at a high watermark equal to log_end is at its end


# -- metadata ---------------------------------------------------------------------------------------------------


class MetadataRequest(Header, frozen=True):
    streams: tuple[str, ...] = ()  # empty: every stream


class BrokerInfo(Header, frozen=True):
    id: str
    host: str
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)]  # the wire protocol's port


class PartitionInfo(Header, frozen=True):
    id: PartitionId
    leader: str | None  # broker id; None while no leader is elected
    replicas: tuple[str, ...]  # the first is the preferred leader
    isr: tuple[str, ...]
    leader_epoch: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
    high_watermark: Offset  # exclusive, see the module docstring
    log_end: Offset  # exclusive: the newest offset is log_end - 1
    readonly: bool = False
    paused: bool = False
    log_start: Offset = 0  # the oldest offset the log may hold (appended after the first release)
    suspended: str = ""  # why appends are refused (fail to safety); empty while they are not
    local_log_start: OffsetOrNone = -1  # the oldest offset on the leader's disk; -1: not asked (metadata answers)
    remote_start: OffsetOrNone = -1  # the tiered store's offsets [remote_start, remote_end); -1: none there
    remote_end: OffsetOrNone = -1


class StreamInfo(Header, frozen=True):
    name: str
    subject: str
    partitions: tuple[PartitionInfo, ...] = ()
    error: ErrorBody | None = None  # UNKNOWN_STREAM for a requested stream that does not exist


class MetadataResponse(Header, frozen=True):
    brokers: tuple[BrokerInfo, ...]
    streams: tuple[StreamInfo, ...]
    controller: str | None = None  # broker id of the controller, when known


# -- stream administration ----------------------------------------------------------------------------------------


class CreateStreamRequest(Header, frozen=True):
    """Create a stream. ``config`` holds per-stream overrides by name (``"retention.max.bytes": "1073741824"``);
    strings, as Kafka's CreateTopics does, so that adding a setting never changes this header."""

    name: Name
    subject: Name
    partitions: Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)] = 1
    replication_factor: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] = 1  # -1: every broker (Liftbridge)
    group: str = ""  # NATS queue group the leaders subscribe with; empty for none
    config: dict[str, str] = {}
    timeout_ms: Millis = 10_000
    forwarded: bool = False  # sent on by a broker to the controller: answer, never forward again


class CreateStreamResponse(Header, frozen=True):
    pass


class DeleteStreamRequest(Header, frozen=True):
    name: Name
    timeout_ms: Millis = 10_000
    forwarded: bool = False  # sent on by a broker to the controller: answer, never forward again


class DeleteStreamResponse(Header, frozen=True):
    pass


class ListStreamsRequest(Header, frozen=True):
    prefix: str = ""  # only streams whose name starts with it


class StreamSummary(Header, frozen=True):
    name: str
    subject: str
    partitions: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
    replication_factor: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]


class ListStreamsResponse(Header, frozen=True):
    streams: tuple[StreamSummary, ...]


class SetStreamStateRequest(Header, frozen=True):
    """Pause or resume, and set or clear read-only, on partitions of a stream (every partition when
    ``partitions`` is empty). ``None`` leaves a flag as it is. A paused partition resumes on its next write."""

    name: Name
    partitions: tuple[PartitionId, ...] = ()
    paused: bool | None = None
    readonly: bool | None = None
    timeout_ms: Millis = 10_000
    forwarded: bool = False  # sent on by a broker to the controller: answer, never forward again
    resume_all: bool = False  # with paused: a write to any of them resumes every paused partition
    rotate_key: bool = False  # an encrypted stream's partitions get a new data key for new data


class SetStreamStateResponse(Header, frozen=True):
    pass


class ResetHeadRequest(Header, frozen=True):
    """Confirm the head of a suspended partition (fail to safety): appends resume there. ``offset`` -1: the
    leader's log end; otherwise at most the log end and at least the high watermark (the leader cuts its
    uncommitted tail down to it). Any broker takes it and forwards it to the controller."""

    stream: Name
    partition: PartitionId
    offset: OffsetOrNone = -1
    timeout_ms: Millis = 10_000
    forwarded: bool = False  # sent on by a broker to the controller: answer, never forward again


class ResetHeadResponse(Header, frozen=True):
    """The confirmed head and the leadership that resumes at it (``leader_epoch``, one above the suspended
    one); the leader's bounds when it was asked, and the suspension that was cleared."""

    leader: str
    leader_epoch: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
    head: Offset
    high_watermark: Offset
    log_end: Offset  # before the reset: above ``head`` when the leader cuts its tail
    cleared: str = ""


class SkipDamagedRequest(Header, frozen=True):
    """An operator confirms skipping the damaged offsets ``first..last`` of a partition (exactly a range its
    leader reports); ``first`` -1 only lists the known ranges. Sent to the partition's leader."""

    stream: Name
    partition: PartitionId
    first: OffsetOrNone = -1
    last: OffsetOrNone = -1


class DamagedSpan(Header, frozen=True):
    """Offsets ``first..last`` found damaged on the leader's disk, and whether skipping them was confirmed."""

    first: Offset
    last: Offset
    confirmed: bool = False
    reason: str = ""


class SkipDamagedResponse(Header, frozen=True):
    """The partition's damaged ranges after the request, and how many the leader found and restored from a replica
    since it started (counters for metrics)."""

    ranges: tuple[DamagedSpan, ...] = ()
    found_total: Annotated[int, msgspec.Meta(ge=0)] = 0
    repaired_total: Annotated[int, msgspec.Meta(ge=0)] = 0


# -- offsets ------------------------------------------------------------------------------------------------------


class ListOffsetsRequest(Header, frozen=True):
    """Where a reader may start: the partition's bounds, and the offset at a point in time (Kafka's ListOffsets).

    A consumer resolves ``earliest`` (``log_start``), ``latest`` (``high_watermark``) or a timestamp with one
    round trip before its first fetch, so the fetch itself stays a plain offset read."""

    stream: Name
    partition: PartitionId
    timestamp: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] = -1  # ns since the epoch; -1: no lookup


class ListOffsetsResponse(Header, frozen=True):
    """Bounds, exclusive as everywhere here; ``offset`` is the first committed offset whose timestamp is at or
    after the requested one (the high watermark when none is), or -1 when no timestamp was asked."""

    log_start: Offset
    high_watermark: Offset
    log_end: Offset
    offset: OffsetOrNone = -1
    leader_epoch: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] = -1  # the leadership that answered
    suspended: str = ""  # why the leader refuses appends (fail to safety); empty while it does not
    local_log_start: OffsetOrNone = -1  # the oldest offset on the leader's disk (log_start is below it when tiered)
    remote_start: OffsetOrNone = -1  # the tiered store's offsets [remote_start, remote_end); -1: none there
    remote_end: OffsetOrNone = -1


# -- idempotent producers ------------------------------------------------------------------------------------------


class InitProducerRequest(Header, frozen=True):
    """Ask for a producer id and epoch before the first idempotent batch (any broker answers).

    ``name`` empty: an anonymous producer, a fresh id with epoch 0. Otherwise a stable client-chosen name (as
    Kafka's ``transactional.id``): the id registered for it with the next epoch, which fences every older
    instance of the same name on every partition it writes to."""

    name: str = ""
    timeout_ms: Millis = 10_000


class InitProducerResponse(Header, frozen=True):
    """The id and epoch to put in every batch header; sequences start at 0 on each partition."""

    producer_id: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
    producer_epoch: Annotated[int, msgspec.Meta(ge=0, le=2**15 - 1)]


# -- transactional appends -------------------------------------------------------------------------------------


class AppendPhase(enum.IntEnum):
    """The frames of one transactional append, in the order a client sends them."""

    BEGIN = 0  # the partition, the expectations and the register changes; may carry the first records
    CHUNK = 1  # more records (payload: whole encoded records, offset deltas running on across chunks)
    COMMIT = 2  # write it all, or nothing; the response is the append's outcome
    ABORT = 3  # forget it: nothing is written, no offset is used
    WHOLE = 4  # BEGIN and COMMIT in one frame, for an append whose records fit in it (a compare-and-set)


class AppendRequest(Header, frozen=True):
    """One frame of a transactional append (op APPEND); frames of one append share ``append_id``.

    Only BEGIN (and WHOLE) needs the fields after ``phase``. Registers are encoded as in
    :mod:`tidelog.protocol.labels`: ``check_registers`` a selector, the other two label sets; empty bytes
    mean none. ``expected_offset`` -1: no expectation. ``first_timestamp`` (ns) is the reference the records'
    timestamp deltas count from.

    ``acks`` NONE is taken as LEADER: the COMMIT answer is the outcome, so it is always waited for.

    ``records``, ``crc`` and ``max_timestamp`` describe the frame's payload: how many records, their CRC32C,
    and the largest record timestamp so far in the append. The broker checks every record either way
    (:mod:`tidelog.protocol.records.check`); given (not -1), the count and CRC must match too. The append's largest
    timestamp is taken from the records.
    """

    append_id: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
    phase: AppendPhase
    stream: str = ""
    partition: PartitionId = 0
    expected_offset: OffsetOrNone = -1
    check_registers: bytes = b""
    union_registers: bytes = b""
    subtract_registers: bytes = b""
    first_timestamp: int = 0
    acks: Acks = Acks.ALL
    timeout_ms: Millis = 5_000
    records: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] = -1
    crc: Annotated[int, msgspec.Meta(ge=-1, le=2**32 - 1)] = -1
    max_timestamp: int = -1


class AppendResponse(Header, frozen=True):
    """The answer to each frame of an append. ``status`` 0 is success so far; otherwise an ``ErrorCode``
    (INCORRECT_OFFSET, REGISTER_MISMATCH, APPEND_TOO_SLOW, …) with ``message``, and nothing was written.

    The COMMIT answer is the outcome: the offsets of the records (-1 when the append had none), the log end,
    and the partition's registers (after the append when it succeeded, as found when it failed), so a client
    that lost a race can decide again without another round trip."""

    append_id: Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
    status: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)] = 0
    message: str = ""
    base_offset: OffsetOrNone = -1
    last_offset: OffsetOrNone = -1
    log_end: OffsetOrNone = -1
    registers: bytes = b""
