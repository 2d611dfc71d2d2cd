"""Encoding and decoding frame headers: the table from ``(kind, op)`` to header type, and msgspec's codecs.

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
    SET_CURSOR      SetCursorRequest      SetCursorResponse
    FETCH_CURSOR    FetchCursorRequest    FetchCursorResponse
    LIST_CURSORS    ListCursorsRequest    ListCursorsResponse
    APPEND          AppendRequest         AppendResponse         request: encoded records (BEGIN, CHUNK)
    SET_STREAM_STATE SetStreamStateRequest SetStreamStateResponse
    RESET_HEAD      ResetHeadRequest      ResetHeadResponse
    SKIP_DAMAGED    SkipDamagedRequest    SkipDamagedResponse
    REPLICA_FETCH   ReplicaFetchRequest   ReplicaFetchResponse   response: record batches (broker to broker)
    EPOCH_END_OFFSET EpochEndOffsetRequest EpochEndOffsetResponse (broker to broker)
    SEGMENT_LIST    SegmentListRequest    SegmentListResponse    (broker to broker)
    SEGMENT_FETCH   SegmentFetchRequest   SegmentFetchResponse   response: raw bytes of a segment file
    SESSION_FETCH   SessionFetchRequest   SessionFetchResponse   response: batches of many partitions
    SASL_START …    the SCRAM login headers (:mod:`tidelog.protocol.auth_messages`)
    JOIN_GROUP …    the consumer-group headers (:mod:`tidelog.protocol.group_messages`)
    (any)           —                     ErrorBody in an ERROR frame: the request failed as a whole

Headers are defined in :mod:`tidelog.protocol.messages` (what clients send),
:mod:`tidelog.protocol.cursor_messages` and :mod:`tidelog.protocol.group_messages` (cursors and consumer groups)
and :mod:`tidelog.protocol.peer_messages` (what brokers send each other); this module routes and checks them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from tidelog.protocol.auth_messages import (
    SaslFinishRequest,
    SaslFinishResponse,
    SaslStartRequest,
    SaslStartResponse,
)
from tidelog.protocol.cursor_messages import (
    FetchCursorRequest,
    FetchCursorResponse,
    ListCursorsRequest,
    ListCursorsResponse,
    SetCursorRequest,
    SetCursorResponse,
)
from tidelog.protocol.frames import BytesLike, Frame, Kind, Op, ProtocolError, encode_frame
from tidelog.protocol.group_messages import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ReportCoordinatorRequest,
    ReportCoordinatorResponse,
)
from tidelog.protocol.messages import (
    AppendRequest,
    AppendResponse,
    CreateStreamRequest,
    CreateStreamResponse,
    DeleteStreamRequest,
    DeleteStreamResponse,
    ErrorBody,
    FetchRequest,
    FetchResponse,
    Header,
    InitProducerRequest,
    InitProducerResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListStreamsRequest,
    ListStreamsResponse,
    MetadataRequest,
    MetadataResponse,
    ProduceRequest,
    ProduceResponse,
    ResetHeadRequest,
    ResetHeadResponse,
    SetStreamStateRequest,
    SetStreamStateResponse,
    SkipDamagedRequest,
    SkipDamagedResponse,
)
from tidelog.protocol.peer_messages import (
    AlterIsrRequest,
    AlterIsrResponse,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    EpochEndOffsetRequest,
    EpochEndOffsetResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    ReportUnreachableRequest,
    ReportUnreachableResponse,
    SegmentFetchRequest,
    SegmentFetchResponse,
    SegmentListRequest,
    SegmentListResponse,
    SuspendPartitionRequest,
    SuspendPartitionResponse,
)
from tidelog.protocol.reassign_messages import (
    DecommissionBrokerRequest,
    DecommissionBrokerResponse,
    ListReassignmentsRequest,
    ListReassignmentsResponse,
    ReassignPartitionsRequest,
    ReassignPartitionsResponse,
)
from tidelog.protocol.reshape_messages import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    AlterStreamRequest,
    AlterStreamResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
)
from tidelog.protocol.session_messages import SessionFetchRequest, SessionFetchResponse

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
    (Kind.REQUEST, Op.ADD_PARTITIONS): AddPartitionsRequest,
    (Kind.RESPONSE, Op.ADD_PARTITIONS): AddPartitionsResponse,
    (Kind.REQUEST, Op.ALTER_STREAM): AlterStreamRequest,
    (Kind.RESPONSE, Op.ALTER_STREAM): AlterStreamResponse,
    (Kind.REQUEST, Op.ELECT_LEADERS): ElectLeadersRequest,
    (Kind.RESPONSE, Op.ELECT_LEADERS): ElectLeadersResponse,
    (Kind.REQUEST, Op.REASSIGN_PARTITIONS): ReassignPartitionsRequest,
    (Kind.RESPONSE, Op.REASSIGN_PARTITIONS): ReassignPartitionsResponse,
    (Kind.REQUEST, Op.DECOMMISSION_BROKER): DecommissionBrokerRequest,
    (Kind.RESPONSE, Op.DECOMMISSION_BROKER): DecommissionBrokerResponse,
    (Kind.REQUEST, Op.LIST_REASSIGNMENTS): ListReassignmentsRequest,
    (Kind.RESPONSE, Op.LIST_REASSIGNMENTS): ListReassignmentsResponse,
    (Kind.REQUEST, Op.SET_CURSOR): SetCursorRequest,
    (Kind.RESPONSE, Op.SET_CURSOR): SetCursorResponse,
    (Kind.REQUEST, Op.FETCH_CURSOR): FetchCursorRequest,
    (Kind.RESPONSE, Op.FETCH_CURSOR): FetchCursorResponse,
    (Kind.REQUEST, Op.LIST_CURSORS): ListCursorsRequest,
    (Kind.RESPONSE, Op.LIST_CURSORS): ListCursorsResponse,
    (Kind.REQUEST, Op.JOIN_GROUP): JoinGroupRequest,
    (Kind.RESPONSE, Op.JOIN_GROUP): JoinGroupResponse,
    (Kind.REQUEST, Op.LEAVE_GROUP): LeaveGroupRequest,
    (Kind.RESPONSE, Op.LEAVE_GROUP): LeaveGroupResponse,
    (Kind.REQUEST, Op.GROUP_ASSIGNMENTS): GroupAssignmentsRequest,
    (Kind.RESPONSE, Op.GROUP_ASSIGNMENTS): GroupAssignmentsResponse,
    (Kind.REQUEST, Op.REPORT_COORDINATOR): ReportCoordinatorRequest,
    (Kind.RESPONSE, Op.REPORT_COORDINATOR): ReportCoordinatorResponse,
    (Kind.REQUEST, Op.DESCRIBE_GROUP): DescribeGroupRequest,
    (Kind.RESPONSE, Op.DESCRIBE_GROUP): DescribeGroupResponse,
    (Kind.REQUEST, Op.LIST_GROUPS): ListGroupsRequest,
    (Kind.RESPONSE, Op.LIST_GROUPS): ListGroupsResponse,
    (Kind.REQUEST, Op.DELETE_GROUP): DeleteGroupRequest,
    (Kind.RESPONSE, Op.DELETE_GROUP): DeleteGroupResponse,
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
    (Kind.REQUEST, Op.SESSION_FETCH): SessionFetchRequest,
    (Kind.RESPONSE, Op.SESSION_FETCH): SessionFetchResponse,
    (Kind.REQUEST, Op.INIT_PRODUCER): InitProducerRequest,
    (Kind.RESPONSE, Op.INIT_PRODUCER): InitProducerResponse,
    (Kind.REQUEST, Op.APPEND): AppendRequest,
    (Kind.RESPONSE, Op.APPEND): AppendResponse,
    (Kind.REQUEST, Op.SASL_START): SaslStartRequest,
    (Kind.RESPONSE, Op.SASL_START): SaslStartResponse,
    (Kind.REQUEST, Op.SASL_FINISH): SaslFinishRequest,
    (Kind.RESPONSE, Op.SASL_FINISH): SaslFinishResponse,
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
