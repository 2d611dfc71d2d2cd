"""The one error table: every domain error code of tidelog and what it means on each protocol.

One row per :class:`ErrorCode` gives the stable wire number, the default message, whether the same request may
succeed later (``retriable``), the gRPC status the Liftbridge-compatible API answers with, and the closest
Liftbridge publish error codes (``PublishAsyncError.Code`` for ``PublishAsync``, ``Ack.Error`` for acks sent
to NATS ack inboxes). Services never choose a status themselves: they raise a :class:`TidelogError` and the
boundary looks it up here, so the two protocols can never disagree.

The exception tree (one class per code, flat, so ``except NotLeaderError`` reads as what it catches and
``err.retriable`` drives retry loops)::

    TidelogError                 code, message, retriable; .spec, .grpc_status, .to_error_body()
     ├── UnknownStreamError        UNKNOWN_STREAM        NOT_FOUND
     ├── UnknownPartitionError     UNKNOWN_PARTITION     NOT_FOUND
     ├── StreamExistsError         STREAM_EXISTS         ALREADY_EXISTS
     ├── NotLeaderError            NOT_LEADER            FAILED_PRECONDITION   retriable: refresh metadata
     ├── ReadonlyError             READONLY              FAILED_PRECONDITION
     ├── InvalidArgumentError      INVALID_ARGUMENT      INVALID_ARGUMENT
     ├── MessageTooLargeError      MESSAGE_TOO_LARGE     INVALID_ARGUMENT
     ├── RequestTimeoutError       TIMEOUT               DEADLINE_EXCEEDED     retriable
     ├── NotEnoughReplicasError    NOT_ENOUGH_REPLICAS   UNAVAILABLE           retriable
     ├── OffsetOutOfRangeError     OFFSET_OUT_OF_RANGE   OUT_OF_RANGE
     ├── IncorrectOffsetError      INCORRECT_OFFSET      ABORTED
     ├── CorruptDataError          CORRUPT_DATA          DATA_LOSS
     ├── InternalError             INTERNAL              INTERNAL
     ├── UnavailableError          UNAVAILABLE           UNAVAILABLE           retriable
     ├── StopReachedError          STOP_REACHED          RESOURCE_EXHAUSTED
     ├── FencedLeaderEpochError    FENCED_LEADER_EPOCH   FAILED_PRECONDITION   retriable: refresh metadata
     ├── UnsupportedError          UNSUPPORTED           UNIMPLEMENTED
     ├── PermissionDeniedError     PERMISSION_DENIED     PERMISSION_DENIED
     ├── UnknownGroupError         UNKNOWN_GROUP         NOT_FOUND
     ├── StaleGroupEpochError      STALE_GROUP_EPOCH     FAILED_PRECONDITION   retriable: refetch assignments
     ├── OutOfOrderSequenceError   OUT_OF_ORDER_SEQUENCE ABORTED               re-initialize the producer
     ├── ProducerFencedError       PRODUCER_FENCED       FAILED_PRECONDITION   a newer instance took over: stop
     ├── UnknownProducerError      UNKNOWN_PRODUCER      FAILED_PRECONDITION   re-initialize the producer
     ├── DuplicateInFlightError    DUPLICATE_IN_FLIGHT   UNAVAILABLE           retriable: after a backoff
     ├── RegisterMismatchError     REGISTER_MISMATCH     ABORTED               re-read the registers, decide again
     ├── AppendTooSlowError        APPEND_TOO_SLOW       ABORTED               stream the append faster
     ├── PartitionSuspendedError   PARTITION_SUSPENDED   FAILED_PRECONDITION   an operator runs reset-head
     ├── DiskFullError             DISK_FULL             RESOURCE_EXHAUSTED    retriable: once space is freed
     ├── OpenAppendsLimitError     OPEN_APPENDS_LIMIT    RESOURCE_EXHAUSTED    commit or abort open appends first
     ├── OffsetDamagedError        OFFSET_DAMAGED        DATA_LOSS             read on from the next offset
     ├── NotCoordinatorError       NOT_COORDINATOR       FAILED_PRECONDITION   retriable: ask the group's coordinator
     ├── UnknownMemberError        UNKNOWN_MEMBER        FAILED_PRECONDITION   join the group again
     ├── GroupRefusedError         GROUP_REFUSED         FAILED_PRECONDITION   the group's state does not allow it
     ├── EncryptionError           ENCRYPTION            FAILED_PRECONDITION   the broker needs the master key
     └── PartitionPausedError      PARTITION_PAUSED      FAILED_PRECONDITION   publish, or subscribe with resume

The choices gRPC leaves open follow its own guidance ("UNAVAILABLE if the client can retry just the failing
call; ABORTED if it should retry at a higher level, e.g. a failed test-and-set; FAILED_PRECONDITION if it
should not retry until the system state has been fixed"):

- NOT_ENOUGH_REPLICAS is UNAVAILABLE: the write was refused before anything was appended, and the ISR regrows
  by itself as followers catch up, so retrying the very same call is safe and is the right reaction. Mapping
  it to FAILED_PRECONDITION would tell clients to wait for an operator. (Kafka marks it retriable too.)
- INCORRECT_OFFSET is ABORTED: it is a failed test-and-set on the expected offset; the client must re-read the
  log and decide again, and replaying the same request would fail the same way.
- NOT_LEADER and FENCED_LEADER_EPOCH are FAILED_PRECONDITION, as Liftbridge answers a subscribe to a follower:
  the state to fix is the client's stale view of who leads. They are retriable after a metadata refresh.
- OUT_OF_ORDER_SEQUENCE is ABORTED, gRPC's own example ("a sequencer check failure"): the producer's sequence
  numbers and the partition's disagree; it re-initializes (new epoch, sequence 0) and decides what to resend.
- PRODUCER_FENCED and UNKNOWN_PRODUCER are FAILED_PRECONDITION: the same request can never succeed. A fenced
  producer was replaced by a newer instance of its name and must stop; an unknown one re-initializes first.
- DUPLICATE_IN_FLIGHT is UNAVAILABLE and retriable: the very batch is being written right now, and repeating
  the same call after a backoff gets its offsets (or a real outcome), as NOT_ENOUGH_REPLICAS is retried.
- REGISTER_MISMATCH is ABORTED like INCORRECT_OFFSET: a failed test on the partition's registers (Gazette's
  fencing); another writer holds them, and repeating the append fails the same way.
- APPEND_TOO_SLOW is ABORTED: the broker dropped a transactional append whose client streamed below
  ``append_min_rate_bytes``; nothing of it was stored, and the client may start it again.
- PARTITION_SUSPENDED is FAILED_PRECONDITION: the leader found evidence that its log lost acknowledged data
  (seed 002, "fail to safety") and refuses appends until an operator runs ``tidelog partition reset-head``.
- DISK_FULL is RESOURCE_EXHAUSTED, gRPC's own example ("the entire file system is out of space"), and
  retriable (Kafka's KAFKA_STORAGE_ERROR is too): the write was refused and undone, nothing of it was stored,
  and the partition stays healthy, so the same write succeeds once space is freed
  (:mod:`tidelog.storage.disk_full`). Any ``ENOSPC``/``EDQUOT`` reaching a boundary answers it.
- OPEN_APPENDS_LIMIT is RESOURCE_EXHAUSTED ("perhaps a per-user quota") and not retriable as such: the
  connection holds as many uncommitted transactional appends (or spooled bytes) as the broker allows, and the
  same request fails again until the client commits or aborts some of them.
- OFFSET_DAMAGED is DATA_LOSS: the offsets read are damaged on the leader's disk (bit rot) and no replica
  restored them. The message names the range and the next readable offset (a wire FETCH also carries them as
  fields); reading from there succeeds, and once an operator confirms skipping the range
  (``tidelog partition skip-damaged``) reads pass over it silently.
- PARTITION_PAUSED is FAILED_PRECONDITION, as Liftbridge answers a subscriber of a paused partition: the
  partition's log is closed (:mod:`tidelog.broker.pausing`); a publish or a subscribe with ``resume`` set
  resumes it, so repeating the very same request never helps.

``retriable`` means the same request may succeed later, not that repeating it is free of duplicates: a
TIMEOUT after the leader wrote a batch is retriable, and only an idempotent producer retries it exactly once.

Codes are stable on the wire: append new ones, never renumber or reuse. 0 is not an error code.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

import grpc

from tidelog.protocol.frames import ProtocolError
from tidelog.protocol.message_codec import UnsupportedOpError
from tidelog.protocol.messages import ErrorBody


class ErrorCode(enum.IntEnum):
    """tidelog's domain error codes, the numbers both protocols carry (append only; 0 is not an error)."""

    UNKNOWN_STREAM = 1
    UNKNOWN_PARTITION = 2
    STREAM_EXISTS = 3
    NOT_LEADER = 4
    READONLY = 5
    INVALID_ARGUMENT = 6
    MESSAGE_TOO_LARGE = 7
    TIMEOUT = 8
    NOT_ENOUGH_REPLICAS = 9
    OFFSET_OUT_OF_RANGE = 10
    INCORRECT_OFFSET = 11
    CORRUPT_DATA = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    STOP_REACHED = 15
    FENCED_LEADER_EPOCH = 16
    UNSUPPORTED = 17
    PERMISSION_DENIED = 18
    UNKNOWN_GROUP = 19
    STALE_GROUP_EPOCH = 20
    OUT_OF_ORDER_SEQUENCE = 21
    PRODUCER_FENCED = 22
    UNKNOWN_PRODUCER = 23
    DUPLICATE_IN_FLIGHT = 24
    REGISTER_MISMATCH = 25
    APPEND_TOO_SLOW = 26
    PARTITION_SUSPENDED = 27
    DISK_FULL = 28
    OPEN_APPENDS_LIMIT = 29
    OFFSET_DAMAGED = 30
    NOT_COORDINATOR = 31
    UNKNOWN_MEMBER = 32
    GROUP_REFUSED = 33
    ENCRYPTION = 34
    PARTITION_PAUSED = 35


class LiftbridgeAsyncCode(enum.IntEnum):
    """Liftbridge ``PublishAsyncError.Code`` (numbers from its proto; no dependency on generated code)."""

    UNKNOWN = 0
    BAD_REQUEST = 1
    NOT_FOUND = 2
    INTERNAL = 3
    READONLY = 4
    INCORRECT_OFFSET = 5
    ENCRYPTION_FAILED = 6
    PERMISSION_DENIED = 7


class LiftbridgeAckError(enum.IntEnum):
    """Liftbridge ``Ack.Error`` (numbers from its proto)."""

    OK = 0
    UNKNOWN = 1
    INCORRECT_OFFSET = 2
    TOO_LARGE = 3
    ENCRYPTION = 4


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """One row of the table."""

    code: ErrorCode
    message: str  # default message, used when the raiser has nothing more specific
    retriable: bool
    grpc_status: grpc.StatusCode
    async_code: LiftbridgeAsyncCode  # PublishAsyncError.code
    ack_error: LiftbridgeAckError  # Ack.ackError


_S = grpc.StatusCode
_A = LiftbridgeAsyncCode
_K = LiftbridgeAckError
_C = ErrorCode

# fmt: off
_TABLE: tuple[ErrorSpec, ...] = (
    ErrorSpec(_C.UNKNOWN_STREAM, "no such stream", False, _S.NOT_FOUND, _A.NOT_FOUND, _K.UNKNOWN),
    ErrorSpec(_C.UNKNOWN_PARTITION, "no such partition", False, _S.NOT_FOUND, _A.NOT_FOUND, _K.UNKNOWN),
    ErrorSpec(_C.STREAM_EXISTS, "stream already exists", False, _S.ALREADY_EXISTS, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.NOT_LEADER, "this broker is not the partition leader", True, _S.FAILED_PRECONDITION, _A.UNKNOWN,
              _K.UNKNOWN),
    ErrorSpec(_C.READONLY, "the partition is read-only", False, _S.FAILED_PRECONDITION, _A.READONLY, _K.UNKNOWN),
    ErrorSpec(_C.INVALID_ARGUMENT, "invalid argument", False, _S.INVALID_ARGUMENT, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.MESSAGE_TOO_LARGE, "message too large", False, _S.INVALID_ARGUMENT, _A.BAD_REQUEST,
              _K.TOO_LARGE),
    ErrorSpec(_C.TIMEOUT, "timed out", True, _S.DEADLINE_EXCEEDED, _A.UNKNOWN, _K.UNKNOWN),
    ErrorSpec(_C.NOT_ENOUGH_REPLICAS, "fewer in-sync replicas than min_isr", True, _S.UNAVAILABLE, _A.UNKNOWN,
              _K.UNKNOWN),
    ErrorSpec(_C.OFFSET_OUT_OF_RANGE, "offset out of range", False, _S.OUT_OF_RANGE, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.INCORRECT_OFFSET, "incorrect expected offset", False, _S.ABORTED, _A.INCORRECT_OFFSET,
              _K.INCORRECT_OFFSET),
    ErrorSpec(_C.CORRUPT_DATA, "corrupt data", False, _S.DATA_LOSS, _A.INTERNAL, _K.UNKNOWN),
    ErrorSpec(_C.INTERNAL, "internal error", False, _S.INTERNAL, _A.INTERNAL, _K.UNKNOWN),
    ErrorSpec(_C.UNAVAILABLE, "service unavailable", True, _S.UNAVAILABLE, _A.UNKNOWN, _K.UNKNOWN),
    ErrorSpec(_C.STOP_REACHED, "stop position reached", False, _S.RESOURCE_EXHAUSTED, _A.UNKNOWN, _K.UNKNOWN),
    ErrorSpec(_C.FENCED_LEADER_EPOCH, "stale leader epoch", True, _S.FAILED_PRECONDITION, _A.UNKNOWN, _K.UNKNOWN),
    ErrorSpec(_C.UNSUPPORTED, "unsupported operation", False, _S.UNIMPLEMENTED, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.PERMISSION_DENIED, "permission denied", False, _S.PERMISSION_DENIED, _A.PERMISSION_DENIED,
              _K.UNKNOWN),
    ErrorSpec(_C.UNKNOWN_GROUP, "no such consumer group", False, _S.NOT_FOUND, _A.NOT_FOUND, _K.UNKNOWN),
    ErrorSpec(_C.STALE_GROUP_EPOCH, "stale consumer group epoch", True, _S.FAILED_PRECONDITION, _A.UNKNOWN,
              _K.UNKNOWN),
    ErrorSpec(_C.OUT_OF_ORDER_SEQUENCE, "out-of-order producer sequence", False, _S.ABORTED, _A.BAD_REQUEST,
              _K.UNKNOWN),
    ErrorSpec(_C.PRODUCER_FENCED, "producer fenced by a newer epoch", False, _S.FAILED_PRECONDITION,
              _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.UNKNOWN_PRODUCER, "unknown producer id", False, _S.FAILED_PRECONDITION, _A.BAD_REQUEST,
              _K.UNKNOWN),
    ErrorSpec(_C.DUPLICATE_IN_FLIGHT, "the same batch is being written", True, _S.UNAVAILABLE, _A.UNKNOWN,
              _K.UNKNOWN),
    ErrorSpec(_C.REGISTER_MISMATCH, "the partition's registers do not match the append's selector", False,
              _S.ABORTED, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.APPEND_TOO_SLOW, "the append streamed slower than the broker's minimum rate", False,
              _S.ABORTED, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.PARTITION_SUSPENDED, "the partition refuses appends until an operator confirms its head", False,
              _S.FAILED_PRECONDITION, _A.INTERNAL, _K.UNKNOWN),
    ErrorSpec(_C.DISK_FULL, "the broker's disk is full: writes resume once space is freed", True,
              _S.RESOURCE_EXHAUSTED, _A.INTERNAL, _K.UNKNOWN),
    ErrorSpec(_C.OPEN_APPENDS_LIMIT, "the connection has too many transactional appends open", False,
              _S.RESOURCE_EXHAUSTED, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.OFFSET_DAMAGED, "the offset is damaged on disk", False, _S.DATA_LOSS, _A.INTERNAL, _K.UNKNOWN),
    ErrorSpec(_C.NOT_COORDINATOR, "this broker is not the consumer group's coordinator", True,
              _S.FAILED_PRECONDITION, _A.UNKNOWN, _K.UNKNOWN),
    ErrorSpec(_C.UNKNOWN_MEMBER, "the consumer is not a member of the consumer group", False,
              _S.FAILED_PRECONDITION, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.GROUP_REFUSED, "the consumer group's state does not allow this request", False,
              _S.FAILED_PRECONDITION, _A.BAD_REQUEST, _K.UNKNOWN),
    ErrorSpec(_C.ENCRYPTION, "the partition is encrypted and this broker cannot encrypt or decrypt it", False,
              _S.FAILED_PRECONDITION, _A.ENCRYPTION_FAILED, _K.ENCRYPTION),
    ErrorSpec(_C.PARTITION_PAUSED, "the partition is paused", False, _S.FAILED_PRECONDITION, _A.UNKNOWN,
              _K.UNKNOWN),
)
# fmt: on

SPECS: Mapping[ErrorCode, ErrorSpec] = MappingProxyType({row.code: row for row in _TABLE})
if len(SPECS) != len(_TABLE) or set(SPECS) != set(ErrorCode):
    raise AssertionError("the error table must have exactly one row per ErrorCode")

_CLASSES: dict[ErrorCode, type[TidelogError]] = {}


class TidelogError(Exception):
    """Base of every domain error; subclasses are bound to one :class:`ErrorCode` each.

    ``message`` defaults to the table's; ``retriable`` too, though an error decoded from the wire keeps what
    the sender said (the sender knows its situation best, and may be newer than this table).
    """

    code: ClassVar[ErrorCode]

    def __init_subclass__(cls, *, code: ErrorCode | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            if code in _CLASSES:
                raise TypeError(f"{code.name} already has {_CLASSES[code].__name__}")
            cls.code = code
            _CLASSES[code] = cls

    def __init__(self, message: str | None = None, *, retriable: bool | None = None) -> None:
        if getattr(type(self), "code", None) is None:
            raise TypeError(f"{type(self).__name__} has no error code: raise a subclass, or use make_error()")
        spec = SPECS[self.code]
        self.message = spec.message if message is None else message
        self.retriable = spec.retriable if retriable is None else retriable
        super().__init__(self.message)

    @property
    def spec(self) -> ErrorSpec:
        return SPECS[self.code]

    @property
    def grpc_status(self) -> grpc.StatusCode:
        return SPECS[self.code].grpc_status

    def to_error_body(self) -> ErrorBody:
        return ErrorBody(code=int(self.code), message=self.message, retriable=self.retriable)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code.name}, retriable={self.retriable})"


class UnknownStreamError(TidelogError, code=ErrorCode.UNKNOWN_STREAM):
    """The stream does not exist (or this broker's metadata has not seen it yet)."""


class UnknownPartitionError(TidelogError, code=ErrorCode.UNKNOWN_PARTITION):
    """The stream exists but has no such partition."""


class StreamExistsError(TidelogError, code=ErrorCode.STREAM_EXISTS):
    """CreateStream of a name that is taken."""


class NotLeaderError(TidelogError, code=ErrorCode.NOT_LEADER):
    """A leader-only request reached a follower: refresh metadata and retry against the leader."""


class ReadonlyError(TidelogError, code=ErrorCode.READONLY):
    """The partition was set read-only; writes are refused until it is made writable again."""


class InvalidArgumentError(TidelogError, code=ErrorCode.INVALID_ARGUMENT):
    """Bad input: a malformed header or batch, an out-of-range field, an impossible setting."""


class MessageTooLargeError(TidelogError, code=ErrorCode.MESSAGE_TOO_LARGE):
    """A record or batch above the stream's or broker's size limit."""


class RequestTimeoutError(TidelogError, code=ErrorCode.TIMEOUT):
    """The request's deadline passed (for a produce: possibly after the leader wrote the batch)."""


class NotEnoughReplicasError(TidelogError, code=ErrorCode.NOT_ENOUGH_REPLICAS):
    """The ISR is smaller than ``min_isr``; an ``Acks.ALL`` write was refused before anything was appended."""


class OffsetOutOfRangeError(TidelogError, code=ErrorCode.OFFSET_OUT_OF_RANGE):
    """A read outside the partition's ``[log start, log end]``: reset to a bound and read again."""


class IncorrectOffsetError(TidelogError, code=ErrorCode.INCORRECT_OFFSET):
    """An optimistic-concurrency write whose expected offset is not the next offset of the partition."""


class CorruptDataError(TidelogError, code=ErrorCode.CORRUPT_DATA):
    """Bytes failed their CRC or structure check; they are never served."""


class InternalError(TidelogError, code=ErrorCode.INTERNAL):
    """A bug or an unexpected failure on the server."""


class UnavailableError(TidelogError, code=ErrorCode.UNAVAILABLE):
    """The broker cannot serve the request now (starting, shutting down, partition closing): retry."""


class StopReachedError(TidelogError, code=ErrorCode.STOP_REACHED):
    """A subscription reached its stop position (Liftbridge answers RESOURCE_EXHAUSTED)."""


class FencedLeaderEpochError(TidelogError, code=ErrorCode.FENCED_LEADER_EPOCH):
    """The request carried a leader epoch older than the partition's: its sender's view is stale."""


class UnsupportedError(TidelogError, code=ErrorCode.UNSUPPORTED):
    """An op or version this broker does not implement."""


class PermissionDeniedError(TidelogError, code=ErrorCode.PERMISSION_DENIED):
    """The ACL policy refuses the request."""


class UnknownGroupError(TidelogError, code=ErrorCode.UNKNOWN_GROUP):
    """No such consumer group."""


class StaleGroupEpochError(TidelogError, code=ErrorCode.STALE_GROUP_EPOCH):
    """A consumer group request with an old group epoch: refetch assignments and retry."""


class OutOfOrderSequenceError(TidelogError, code=ErrorCode.OUT_OF_ORDER_SEQUENCE):
    """An idempotent batch that does not continue its producer's sequence (a gap, or a retry older than the
    partition remembers): nothing was written; the producer re-initializes rather than guess."""


class ProducerFencedError(TidelogError, code=ErrorCode.PRODUCER_FENCED):
    """An idempotent batch from an epoch older than one the partition has seen for its producer id: a newer
    instance of the same named producer took over, and this one must stop writing."""


class UnknownProducerError(TidelogError, code=ErrorCode.UNKNOWN_PRODUCER):
    """The partition has no state for the producer id (never seen, or expired) and the batch does not start at
    sequence 0: the producer re-initializes (INIT_PRODUCER) and starts again at 0."""


class DuplicateInFlightError(TidelogError, code=ErrorCode.DUPLICATE_IN_FLIGHT):
    """A retry of a batch whose first attempt is being written right now: retry after a backoff to learn its
    offsets (writing it a second time is exactly what idempotence prevents)."""


class RegisterMismatchError(TidelogError, code=ErrorCode.REGISTER_MISMATCH):
    """A transactional append's ``check_registers`` selector did not match the partition's registers: another
    writer holds them. Nothing was appended; the error message names the registers found."""


class AppendTooSlowError(TidelogError, code=ErrorCode.APPEND_TOO_SLOW):
    """A transactional append streamed its chunks slower than the broker's ``append_min_rate_bytes`` and was
    aborted: nothing of it is stored and no offsets were used."""


class PartitionSuspendedError(TidelogError, code=ErrorCode.PARTITION_SUSPENDED):
    """The partition's leader saw evidence of data beyond its own log end (consistency lost) and refuses
    appends until an operator confirms the head with ``tidelog partition reset-head``."""


class DiskFullError(TidelogError, code=ErrorCode.DISK_FULL):
    """The broker's disk (or quota) is full: the write was refused and nothing of it stored; the partition keeps
    serving, and the same write succeeds once space is freed."""


class OpenAppendsLimitError(TidelogError, code=ErrorCode.OPEN_APPENDS_LIMIT):
    """A connection's uncommitted transactional appends reached ``max_open_appends_per_connection`` or
    ``max_open_append_bytes_per_connection``: commit or abort some before beginning (or growing) another."""


class OffsetDamagedError(TidelogError, code=ErrorCode.OFFSET_DAMAGED):
    """The offset lies in a range found damaged on disk. ``first``/``last`` name the range and ``next_offset``
    where reading resumes, when known (-1 otherwise: the message still says it)."""

    def __init__(
        self, message: str | None = None, *, retriable: bool | None = None, first: int = -1, last: int = -1
    ) -> None:
        super().__init__(message, retriable=retriable)
        self.first = first
        self.last = last

    @property
    def next_offset(self) -> int:
        return self.last + 1 if self.last >= 0 else -1


class NotCoordinatorError(TidelogError, code=ErrorCode.NOT_COORDINATOR):
    """A group request reached a broker that does not coordinate the group (it moved, or the client's view is
    old): ask the coordinator that metadata names, or report the coordinator when it does not answer."""


class UnknownMemberError(TidelogError, code=ErrorCode.UNKNOWN_MEMBER):
    """The consumer is not (or no longer) a member of the group: it left, or was removed after missing its
    heartbeats. It must join again."""


class GroupRefusedError(TidelogError, code=ErrorCode.GROUP_REFUSED):
    """The group's state does not allow the request: joining as a consumer that is already a member, with a
    stream that does not exist, or reporting a coordinator or epoch that is not the group's current one."""


class EncryptionError(TidelogError, code=ErrorCode.ENCRYPTION):
    """An encrypted partition's data cannot be written or read here: the broker has no master key
    (``encryption_key``), or not the one that wrapped the partition's data keys. Nothing is lost: the stored
    data stays as it is, and a broker with the key serves it."""


class PartitionPausedError(TidelogError, code=ErrorCode.PARTITION_PAUSED):
    """The partition is paused: its log is closed on every replica. A publish resumes it, and so does a
    subscribe with ``resume`` set."""


if set(_CLASSES) != set(ErrorCode):
    raise AssertionError("every ErrorCode needs exactly one TidelogError subclass")


def error_class(code: ErrorCode) -> type[TidelogError]:
    """The exception class bound to ``code``."""
    return _CLASSES[code]


def make_error(code: ErrorCode, message: str | None = None, *, retriable: bool | None = None) -> TidelogError:
    """An instance of the class bound to ``code`` (for code paths that hold a code rather than a class)."""
    return _CLASSES[code](message, retriable=retriable)


def grpc_status(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status the Liftbridge-compatible API answers ``code`` with."""
    return SPECS[code].grpc_status


def from_error_body(body: ErrorBody) -> TidelogError:
    """The exception an ``ErrorBody`` received from a peer stands for.

    A code this side does not know (a newer peer) becomes an :class:`InternalError` that names it and keeps the
    sender's ``retriable``, so retry loops still do the right thing.
    """
    try:
        code = ErrorCode(body.code)
    except ValueError:
        return InternalError(f"unknown error code {body.code}: {body.message}", retriable=body.retriable)
    return _CLASSES[code](body.message or None, retriable=body.retriable)


def error_from_exception(exc: BaseException) -> TidelogError:
    """The domain error for an exception this layer knows: a :class:`TidelogError` stays itself, a protocol
    violation is the peer's bad input, a timeout is a TIMEOUT, and anything else is an INTERNAL error.

    The client answers its callers with this; a broker first translates its lower layers' exceptions
    (:mod:`tidelog.broker.translate`) and falls back to it.
    """
    if isinstance(exc, TidelogError):
        return exc
    if isinstance(exc, UnsupportedOpError):
        return UnsupportedError(str(exc))
    if isinstance(exc, ProtocolError):
        return InvalidArgumentError(str(exc))
    if isinstance(exc, TimeoutError):
        return RequestTimeoutError(str(exc) or None)
    return InternalError(f"{type(exc).__name__}: {exc}")


MAX_STATUS_DETAILS_BYTES = 1024
"""Longest error message (UTF-8 bytes) sent as a gRPC status's details: gRPC carries it percent-encoded in the
trailers, whose metadata is limited (8 KiB by default), so an error quoting a huge input would itself fail."""


def status_details(message: str) -> str:
    """``message`` as a gRPC status's details: cut to :data:`MAX_STATUS_DETAILS_BYTES`, with a marker saying so."""
    data = message.encode(errors="replace")
    if len(data) <= MAX_STATUS_DETAILS_BYTES:
        return message
    kept = data[: MAX_STATUS_DETAILS_BYTES - 48].decode(errors="ignore")
    return f"{kept}... [{len(data) - len(kept.encode())} more bytes cut]"
