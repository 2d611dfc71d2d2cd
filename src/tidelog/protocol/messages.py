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

Which header goes with which frame::

    op              request               response               payload
    PRODUCE         ProduceRequest        ProduceResponse        request: record batches
    FETCH           FetchRequest          FetchResponse          response: record batches
    METADATA        MetadataRequest       MetadataResponse
    CREATE_STREAM   CreateStreamRequest   CreateStreamResponse
    DELETE_STREAM   DeleteStreamRequest   DeleteStreamResponse
    LIST_STREAMS    ListStreamsRequest    ListStreamsResponse
    LIST_OFFSETS    ListOffsetsRequest    ListOffsetsResponse
    INIT_PRODUCER   InitProducerRequest   InitProducerResponse
    APPEND          AppendRequest         AppendResponse         request: encoded records (BEGIN, CHUNK)
    SET_STREAM_STATE SetStreamStateRequest SetStreamStateResponse
    RESET_HEAD      ResetHeadRequest      ResetHeadResponse
    SKIP_DAMAGED    SkipDamagedRequest    SkipDamagedResponse
    REPLICA_FETCH   ReplicaFetchRequest   ReplicaFetchResponse   response: record batches (broker to broker)
    EPOCH_END_OFFSET EpochEndOffsetRequest EpochEndOffsetResponse (broker to broker)
    SEGMENT_LIST    SegmentListRequest    SegmentListResponse    (broker to broker)
    SEGMENT_FETCH   SegmentFetchRequest   SegmentFetchResponse   response: raw bytes of a segment file
    (any)           —                     ErrorBody in an ERROR frame: the request failed as a whole

A response that has something useful to say besides the failure carries an ``error`` field instead: a produce
whose batches were written but not acknowledged by the ISR in time still names its offsets, and a fetch below
the log start still returns the log's bounds, so the client can act without another round trip.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import msgspec

from tidelog.protocol.frames import BytesLike, Frame, Kind, Op, ProtocolError, encode_frame

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


class FetchRequest(Header, frozen=True):
    """Read batches from ``offset``; long-polls up to ``max_wait_ms`` until ``min_bytes`` are available."""

    stream: Name
    partition: PartitionId
    offset: Offset
    max_bytes: ByteCount = 1024 * 1024  # soft: the first batch is returned whole even if larger
    max_wait_ms: Millis = 500
    min_bytes: ByteCount = 1
    isolation: Isolation = Isolation.COMMITTED
    verify: bool = False  # the client's CRC check failed on an answer from this offset: check the disk's bytes
    replica: bool = False  # read this broker's copy even as an in-sync follower (a replica restoring damage)


class FetchResponse(Header, frozen=True):
    """The partition's bounds when the response was built; the payload holds the batches (maybe none)."""

    high_watermark: Offset
    log_start: Offset
    log_end: Offset
    error: ErrorBody | None = None  # e.g. OFFSET_OUT_OF_RANGE, with the bounds to reset to
    damaged_first: OffsetOrNone = -1  # OFFSET_DAMAGED: the damaged range, inclusive; read on from last + 1
    damaged_last: OffsetOrNone = -1


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


# -- the table ----------------------------------------------------------------------------------------------------

HEADER_TYPES: dict[tuple[Kind, int], type[Header]] = {
    (Kind.REQUEST, Op.PRODUCE): ProduceRequest,
    (Kind.RESPONSE, Op.PRODUCE): ProduceResponse,
    (Kind.REQUEST, Op.FETCH): FetchRequest,
    (Kind.RESPONSE, Op.FETCH): FetchResponse,
    (Kind.REQUEST, Op.METADATA): MetadataRequest,
    (Kind.RESPONSE, Op.METADATA): MetadataResponse,
    (Kind.REQUEST, Op.CREATE_STREAM): CreateStreamRequest,
    (Kind.RESPONSE, Op.CREATE_STREAM): CreateStreamResponse,
    (Kind.REQUEST, Op.DELETE_STREAM): DeleteStreamRequest,
    (Kind.RESPONSE, Op.DELETE_STREAM): DeleteStreamResponse,
    (Kind.REQUEST, Op.LIST_STREAMS): ListStreamsRequest,
    (Kind.RESPONSE, Op.LIST_STREAMS): ListStreamsResponse,
    (Kind.REQUEST, Op.LIST_OFFSETS): ListOffsetsRequest,
    (Kind.RESPONSE, Op.LIST_OFFSETS): ListOffsetsResponse,
    (Kind.REQUEST, Op.SET_STREAM_STATE): SetStreamStateRequest,
    (Kind.RESPONSE, Op.SET_STREAM_STATE): SetStreamStateResponse,
    (Kind.REQUEST, Op.RESET_HEAD): ResetHeadRequest,
    (Kind.RESPONSE, Op.RESET_HEAD): ResetHeadResponse,
    (Kind.REQUEST, Op.SKIP_DAMAGED): SkipDamagedRequest,
    (Kind.RESPONSE, Op.SKIP_DAMAGED): SkipDamagedResponse,
    (Kind.REQUEST, Op.ALTER_ISR): AlterIsrRequest,
    (Kind.RESPONSE, Op.ALTER_ISR): AlterIsrResponse,
    (Kind.REQUEST, Op.REPORT_UNREACHABLE): ReportUnreachableRequest,
    (Kind.RESPONSE, Op.REPORT_UNREACHABLE): ReportUnreachableResponse,
    (Kind.REQUEST, Op.CONTROLLED_SHUTDOWN): ControlledShutdownRequest,
    (Kind.RESPONSE, Op.CONTROLLED_SHUTDOWN): ControlledShutdownResponse,
    (Kind.REQUEST, Op.SUSPEND_PARTITION): SuspendPartitionRequest,
    (Kind.RESPONSE, Op.SUSPEND_PARTITION): SuspendPartitionResponse,
    (Kind.REQUEST, Op.REPLICA_FETCH): ReplicaFetchRequest,
    (Kind.RESPONSE, Op.REPLICA_FETCH): ReplicaFetchResponse,
    (Kind.REQUEST, Op.EPOCH_END_OFFSET): EpochEndOffsetRequest,
    (Kind.RESPONSE, Op.EPOCH_END_OFFSET): EpochEndOffsetResponse,
    (Kind.REQUEST, Op.SEGMENT_LIST): SegmentListRequest,
    (Kind.RESPONSE, Op.SEGMENT_LIST): SegmentListResponse,
    (Kind.REQUEST, Op.SEGMENT_FETCH): SegmentFetchRequest,
    (Kind.RESPONSE, Op.SEGMENT_FETCH): SegmentFetchResponse,
    (Kind.REQUEST, Op.INIT_PRODUCER): InitProducerRequest,
    (Kind.RESPONSE, Op.INIT_PRODUCER): InitProducerResponse,
    (Kind.REQUEST, Op.APPEND): AppendRequest,
    (Kind.RESPONSE, Op.APPEND): AppendResponse,
}
_ROUTES: dict[type[Header], tuple[Kind, int]] = {cls: route for route, cls in HEADER_TYPES.items()}

# Encoding is driven by the value's type, so one encoder serves every header; decoding needs the target type,
# so there is one decoder per type, built once.
_ENCODER = msgspec.msgpack.Encoder()
_HEADER_CLASSES: list[type[Header]] = [ErrorBody, *HEADER_TYPES.values()]
_DECODERS: dict[type[Header], msgspec.msgpack.Decoder[Any]] = {
    cls: msgspec.msgpack.Decoder(cls) for cls in _HEADER_CLASSES
}

H = TypeVar("H", bound=Header)


class UnsupportedOpError(ProtocolError):
    """A well-formed frame whose (kind, op) has no header type on this side: answer with UNSUPPORTED."""

    def __init__(self, kind: Kind, op: int) -> None:
        super().__init__(f"no {kind.name.lower()} header is defined for op {op}")
        self.kind = kind
        self.op = op


def encode_header(header: Header) -> bytes:
    """The msgpack bytes of ``header`` (the frame's header section)."""
    return _ENCODER.encode(header)


def decode_as(cls: type[H], data: BytesLike) -> H:
    """Decode ``data`` as a ``cls`` header; anything malformed or out of range raises :class:`ProtocolError`."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        raise TypeError(f"{cls.__name__} is not a registered header type")
    try:
        header: H = decoder.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError) as exc:
        # msgspec reports invalid UTF-8 in a length-constrained string as a bare UnicodeDecodeError.
        raise ProtocolError(f"malformed {cls.__name__} header: {_field_named(cls, str(exc))}") from exc
    return header


_POSITION = re.compile(r" - at `\$\[(\d+)\][^`]*`")


def _field_named(cls: type[Header], problem: str) -> str:
    """msgspec's ``"Expected `int` >= -1 - at `$[3]`"`` as ``"field replication_factor: Expected `int` >= -1"``
    (headers are positional arrays, so msgspec can only say where; the field's name says what)."""
    found = _POSITION.search(problem)
    if found is None or int(found[1]) >= len(cls.__struct_fields__):
        return problem
    field = cls.__struct_fields__[int(found[1])]
    return f"field {field}: {problem[: found.start()]}{problem[found.end() :]}"


def decode_header(kind: Kind, op: int, data: BytesLike) -> Header:
    """Decode the header of a ``kind`` frame for ``op``; error frames always carry an :class:`ErrorBody`."""
    if kind == Kind.ERROR:
        return decode_as(ErrorBody, data)
    cls = HEADER_TYPES.get((kind, op))  # Op is an IntEnum: a plain int finds its entry
    if cls is None:
        raise UnsupportedOpError(kind, op)
    return decode_as(cls, data)


def decode_frame_header(frame: Frame) -> Header:
    """:func:`decode_header` applied to a decoded frame."""
    return decode_header(frame.kind, frame.op, frame.header)


def encode_message(
    correlation_id: int, header: Header, payload: BytesLike | Sequence[BytesLike] = b""
) -> list[BytesLike]:
    """Frame ``header`` (kind and op follow from its type) and ``payload`` as buffers for ``writelines``."""
    route = _ROUTES.get(type(header))
    if route is None:
        raise TypeError(f"{type(header).__name__} has no frame route; use encode_error for an ErrorBody")
    kind, op = route
    return encode_frame(kind, op, correlation_id, _ENCODER.encode(header), payload)


def encode_error(correlation_id: int, op: int, body: ErrorBody) -> list[BytesLike]:
    """An ERROR frame answering request ``correlation_id`` of ``op``."""
    return encode_frame(Kind.ERROR, op, correlation_id, _ENCODER.encode(body))
