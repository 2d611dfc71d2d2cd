"""Frame headers: the table, round trips, the positional wire shape, evolution and hostile bytes."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol import auth_messages as am
from tidelog.protocol import group_messages as gm
from tidelog.protocol import reassign_messages as ra
from tidelog.protocol import reshape_messages as rm
from tidelog.protocol import session_messages as sm
from tidelog.protocol.cursor_messages import (
    CursorPosition,
    FetchCursorRequest,
    FetchCursorResponse,
    ListCursorsRequest,
    ListCursorsResponse,
    SetCursorRequest,
    SetCursorResponse,
)
from tidelog.protocol.frames import FrameDecoder, Kind, Op, ProtocolError
from tidelog.protocol.message_codec import (
    HEADER_TYPES,
    UnsupportedOpError,
    decode_as,
    decode_frame_header,
    decode_header,
    encode_error,
    encode_header,
    encode_message,
)
from tidelog.protocol.messages import (
    INT32_MAX,
    INT64_MAX,
    Acks,
    AppendPhase,
    AppendRequest,
    AppendResponse,
    BrokerInfo,
    CreateStreamRequest,
    CreateStreamResponse,
    DamagedSpan,
    DeleteStreamRequest,
    DeleteStreamResponse,
    ErrorBody,
    FetchRequest,
    FetchResponse,
    Header,
    InitProducerRequest,
    InitProducerResponse,
    Isolation,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListStreamsRequest,
    ListStreamsResponse,
    MetadataRequest,
    MetadataResponse,
    PartitionInfo,
    ProduceRequest,
    ProduceResponse,
    ResetHeadRequest,
    ResetHeadResponse,
    SetStreamStateRequest,
    SetStreamStateResponse,
    SkipDamagedRequest,
    SkipDamagedResponse,
    StreamInfo,
    StreamSummary,
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
    SegmentSummary,
    SuspendPartitionRequest,
    SuspendPartitionResponse,
)

names = st.text(min_size=1, max_size=12)
text = st.text(max_size=12)
partition = st.integers(0, INT32_MAX)
offset = st.integers(0, INT64_MAX)
offset_or_none = st.integers(-1, INT64_MAX)
millis = st.integers(0, INT32_MAX)
epoch = st.integers(0, INT32_MAX)
epoch_or_none = st.integers(-1, INT32_MAX)
error_body = st.builds(ErrorBody, st.integers(0, INT32_MAX), text, st.booleans())
maybe_error = st.none() | error_body
ids = st.lists(text, max_size=3).map(tuple)
partition_info = st.builds(
    PartitionInfo,
    partition,
    st.none() | text,
    ids,
    ids,
    st.integers(0, INT32_MAX),
    offset,
    offset,
    st.booleans(),
    st.booleans(),
    offset,
    text,
)

STRATEGIES: dict[type[Header], st.SearchStrategy[Any]] = {
    ProduceRequest: st.builds(ProduceRequest, names, partition, st.sampled_from(Acks), millis),
    ProduceResponse: st.builds(ProduceResponse, offset_or_none, offset_or_none, maybe_error),
    FetchRequest: st.builds(
        FetchRequest, names, partition, offset, millis, millis, millis, st.sampled_from(Isolation), st.booleans()
    ),
    FetchResponse: st.builds(FetchResponse, offset, offset, offset, maybe_error, offset_or_none, offset_or_none),
    MetadataRequest: st.builds(MetadataRequest, ids),
    MetadataResponse: st.builds(
        MetadataResponse,
        st.lists(st.builds(BrokerInfo, text, text, st.integers(0, 65535)), max_size=3).map(tuple),
        st.lists(
            st.builds(StreamInfo, text, text, st.lists(partition_info, max_size=3).map(tuple), maybe_error), max_size=3
        ).map(tuple),
        st.none() | text,
    ),
    CreateStreamRequest: st.builds(
        CreateStreamRequest,
        names,
        names,
        st.integers(1, INT32_MAX),
        st.integers(-1, INT32_MAX),
        text,
        st.dictionaries(text, text, max_size=3),
        millis,
        st.booleans(),
    ),
    CreateStreamResponse: st.just(CreateStreamResponse()),
    DeleteStreamRequest: st.builds(DeleteStreamRequest, names, millis, st.booleans()),
    DeleteStreamResponse: st.just(DeleteStreamResponse()),
    ListStreamsRequest: st.builds(ListStreamsRequest, text),
    ListStreamsResponse: st.builds(
        ListStreamsResponse,
        st.lists(st.builds(StreamSummary, text, text, partition, st.integers(-1, INT32_MAX)), max_size=3).map(tuple),
    ),
    ListOffsetsRequest: st.builds(ListOffsetsRequest, names, partition, st.integers(-1, INT64_MAX)),
    ListOffsetsResponse: st.builds(ListOffsetsResponse, offset, offset, offset, offset_or_none, epoch_or_none, text),
    SetStreamStateRequest: st.builds(
        SetStreamStateRequest,
        names,
        st.lists(partition, max_size=3).map(tuple),
        st.none() | st.booleans(),
        st.none() | st.booleans(),
        millis,
        st.booleans(),
        st.booleans(),
    ),
    SetStreamStateResponse: st.just(SetStreamStateResponse()),
    rm.AddPartitionsRequest: st.builds(
        rm.AddPartitionsRequest, names, st.integers(1, INT32_MAX), millis, st.booleans()
    ),
    rm.AddPartitionsResponse: st.builds(rm.AddPartitionsResponse, st.integers(1, INT32_MAX), st.integers(1, INT32_MAX)),
    rm.AlterStreamRequest: st.builds(
        rm.AlterStreamRequest, names, st.dictionaries(names, text, max_size=3), millis, st.booleans()
    ),
    rm.AlterStreamResponse: st.builds(
        rm.AlterStreamResponse, st.lists(st.builds(rm.SettingChange, text, text, text), max_size=3).map(tuple)
    ),
    rm.ElectLeadersRequest: st.builds(rm.ElectLeadersRequest, millis, st.booleans()),
    rm.ElectLeadersResponse: st.builds(rm.ElectLeadersResponse, st.integers(0, INT32_MAX), st.integers(0, INT32_MAX)),
    ra.ReassignPartitionsRequest: st.builds(
        ra.ReassignPartitionsRequest,
        st.lists(
            st.builds(ra.PartitionReplicas, names, partition, st.lists(names, max_size=3).map(tuple)), max_size=3
        ).map(tuple),
        st.integers(0, 2**40),
        st.booleans(),
        st.booleans(),
        st.lists(names, max_size=3).map(tuple),
        st.lists(names, max_size=3).map(tuple),
        millis,
        st.booleans(),
    ),
    ra.ReassignPartitionsResponse: st.builds(
        ra.ReassignPartitionsResponse,
        st.lists(
            st.builds(
                ra.PartitionMove,
                text,
                partition,
                st.lists(text, max_size=3).map(tuple),
                st.lists(text, max_size=3).map(tuple),
                text,
            ),
            max_size=3,
        ).map(tuple),
    ),
    ra.DecommissionBrokerRequest: st.builds(
        ra.DecommissionBrokerRequest, names, st.integers(0, 2**40), millis, st.booleans()
    ),
    ra.DecommissionBrokerResponse: st.builds(
        ra.DecommissionBrokerResponse,
        st.lists(st.builds(ra.PartitionMove, text, partition, st.just(("a",)), st.just(("b",)), text), max_size=2).map(
            tuple
        ),
    ),
    ra.ListReassignmentsRequest: st.builds(
        ra.ListReassignmentsRequest,
        st.lists(st.builds(ra.PartitionReplicas, names, partition, st.just(("a", "b"))), max_size=2).map(tuple),
        text,
    ),
    ra.ListReassignmentsResponse: st.builds(
        ra.ListReassignmentsResponse,
        st.lists(
            st.builds(
                ra.ReassignmentStatus,
                text,
                partition,
                st.just(("a",)),
                st.just(("b",)),
                st.just(()),
                text,
                text,
                text,
                st.integers(0, 2**40),
            ),
            max_size=2,
        ).map(tuple),
        st.integers(0, INT32_MAX),
    ),
    ResetHeadRequest: st.builds(ResetHeadRequest, names, partition, offset_or_none, millis, st.booleans()),
    ResetHeadResponse: st.builds(ResetHeadResponse, text, epoch, offset, offset, offset, text),
    SkipDamagedRequest: st.builds(SkipDamagedRequest, names, partition, offset_or_none, offset_or_none),
    SkipDamagedResponse: st.builds(
        SkipDamagedResponse,
        st.lists(st.builds(DamagedSpan, offset, offset, st.booleans(), text), max_size=3).map(tuple),
        st.integers(0, INT32_MAX),
        st.integers(0, INT32_MAX),
    ),
    ReplicaFetchRequest: st.builds(
        ReplicaFetchRequest, names, partition, names, offset, epoch, millis, millis, st.booleans()
    ),
    ReplicaFetchResponse: st.builds(ReplicaFetchResponse, offset, offset, offset, epoch, maybe_error),
    EpochEndOffsetRequest: st.builds(EpochEndOffsetRequest, names, partition, names, epoch_or_none, epoch_or_none),
    EpochEndOffsetResponse: st.builds(EpochEndOffsetResponse, epoch_or_none, offset_or_none, maybe_error),
    AlterIsrRequest: st.builds(AlterIsrRequest, names, partition, names, epoch, ids),
    AlterIsrResponse: st.builds(AlterIsrResponse, epoch, ids),
    ReportUnreachableRequest: st.builds(ReportUnreachableRequest, names, names),
    ReportUnreachableResponse: st.just(ReportUnreachableResponse()),
    ControlledShutdownRequest: st.builds(ControlledShutdownRequest, names),
    ControlledShutdownResponse: st.builds(ControlledShutdownResponse, st.integers(0, INT32_MAX)),
    SuspendPartitionRequest: st.builds(SuspendPartitionRequest, names, partition, names, epoch, text),
    SuspendPartitionResponse: st.just(SuspendPartitionResponse()),
    SegmentListRequest: st.builds(
        SegmentListRequest, names, partition, names, offset, epoch, st.integers(1, INT32_MAX)
    ),
    SegmentListResponse: st.builds(
        SegmentListResponse,
        offset,
        offset,
        offset,
        epoch,
        st.lists(
            st.builds(SegmentSummary, offset, offset, offset, st.none() | st.integers(-(2**63), INT64_MAX)), max_size=3
        ).map(tuple),
        maybe_error,
    ),
    SegmentFetchRequest: st.builds(SegmentFetchRequest, names, partition, names, epoch, offset, offset, millis, offset),
    SegmentFetchResponse: st.builds(SegmentFetchResponse, offset, offset, offset, epoch, maybe_error),
    InitProducerRequest: st.builds(InitProducerRequest, text, millis),
    InitProducerResponse: st.builds(InitProducerResponse, offset, st.integers(0, 2**15 - 1)),
    AppendRequest: st.builds(
        AppendRequest,
        offset,
        st.sampled_from(AppendPhase),
        text,
        partition,
        offset_or_none,
        st.binary(max_size=8),
        st.binary(max_size=8),
        st.binary(max_size=8),
        st.integers(-(2**63), INT64_MAX),
        st.sampled_from(Acks),
        millis,
    ),
    AppendResponse: st.builds(
        AppendResponse,
        offset,
        st.integers(0, INT32_MAX),
        text,
        offset_or_none,
        offset_or_none,
        offset_or_none,
        st.binary(max_size=8),
    ),
}

# cursors (SET_CURSOR, FETCH_CURSOR): any 32/64-bit partition and offset decode; the broker checks them
cursor_partition = st.integers(-(2**31), INT32_MAX)
STRATEGIES.update(
    {
        SetCursorRequest: st.builds(
            SetCursorRequest, names, cursor_partition, text, st.integers(-(2**63), INT64_MAX), millis
        ),
        SetCursorResponse: st.builds(SetCursorResponse),
        FetchCursorRequest: st.builds(FetchCursorRequest, names, cursor_partition, text, millis),
        FetchCursorResponse: st.builds(FetchCursorResponse, offset_or_none),
        ListCursorsRequest: st.builds(ListCursorsRequest, text, partition, millis),
        ListCursorsResponse: st.builds(
            ListCursorsResponse,
            st.lists(st.builds(CursorPosition, text, partition, offset_or_none), max_size=3).map(tuple),
        ),
    }
)

# SCRAM logins (tidelog.protocol.auth_messages)
STRATEGIES.update(
    {
        am.SaslStartRequest: st.builds(am.SaslStartRequest, text, text),
        am.SaslStartResponse: st.builds(am.SaslStartResponse, text),
        am.SaslFinishRequest: st.builds(am.SaslFinishRequest, text),
        am.SaslFinishResponse: st.builds(am.SaslFinishResponse, text, text),
    }
)

# consumer groups (tidelog.protocol.group_messages)
group_epoch = st.integers(0, INT64_MAX)
stream_assignment = st.builds(gm.StreamAssignment, text, st.lists(partition, max_size=3).map(tuple))
assigned = st.lists(stream_assignment, max_size=3).map(tuple)
STRATEGIES.update(
    {
        gm.JoinGroupRequest: st.builds(gm.JoinGroupRequest, text, text, ids, st.booleans()),
        gm.JoinGroupResponse: st.builds(gm.JoinGroupResponse, text, group_epoch, millis, millis),
        gm.LeaveGroupRequest: st.builds(gm.LeaveGroupRequest, text, text, st.booleans(), st.booleans()),
        gm.LeaveGroupResponse: st.just(gm.LeaveGroupResponse()),
        gm.GroupAssignmentsRequest: st.builds(gm.GroupAssignmentsRequest, text, text, group_epoch),
        gm.GroupAssignmentsResponse: st.builds(gm.GroupAssignmentsResponse, group_epoch, assigned),
        gm.ReportCoordinatorRequest: st.builds(
            gm.ReportCoordinatorRequest, text, text, text, group_epoch, st.booleans()
        ),
        gm.ReportCoordinatorResponse: st.just(gm.ReportCoordinatorResponse()),
        gm.DescribeGroupRequest: st.builds(gm.DescribeGroupRequest, text),
        gm.DescribeGroupResponse: st.builds(
            gm.DescribeGroupResponse,
            text,
            text,
            group_epoch,
            st.lists(st.builds(gm.GroupMemberInfo, text, ids, assigned), max_size=3).map(tuple),
        ),
        gm.ListGroupsRequest: st.just(gm.ListGroupsRequest()),
        gm.DeleteGroupRequest: st.builds(gm.DeleteGroupRequest, text, partition, millis),
        gm.DeleteGroupResponse: st.builds(gm.DeleteGroupResponse, millis),
        gm.ListGroupsResponse: st.builds(
            gm.ListGroupsResponse,
            st.lists(st.builds(gm.GroupSummary, text, text, group_epoch, millis), max_size=3).map(tuple),
        ),
    }
)

# fetch sessions (tidelog.protocol.session_messages)
STRATEGIES.update(
    {
        sm.SessionFetchRequest: st.builds(
            sm.SessionFetchRequest,
            names,
            st.lists(
                st.builds(sm.SessionFetchEntry, names, partition, offset, epoch, offset, st.booleans()), max_size=3
            ).map(tuple),
            millis,
            millis,
            millis,
        ),
        sm.SessionFetchResponse: st.builds(
            sm.SessionFetchResponse,
            st.lists(
                st.builds(
                    sm.SessionFetchPartition, names, partition, offset, offset, offset, epoch, millis, maybe_error
                ),
                max_size=3,
            ).map(tuple),
        ),
    }
)
ROUTES = sorted(HEADER_TYPES, key=lambda route: (route[1], route[0]))


def test_every_route_has_a_strategy_and_a_known_op() -> None:
    assert set(STRATEGIES) == set(HEADER_TYPES.values())
    assert all(isinstance(op, Op) and kind in (Kind.REQUEST, Kind.RESPONSE) for kind, op in HEADER_TYPES)
    assert len(set(HEADER_TYPES.values())) == len(HEADER_TYPES)  # a type names its route


def test_headers_are_positional_arrays_on_the_wire() -> None:
    assert msgspec.msgpack.decode(encode_header(ProduceRequest("orders", 3))) == ["orders", 3, 1, 5000]
    assert len(encode_header(ProduceRequest("orders", 3))) == 13
    assert msgspec.msgpack.decode(encode_header(ErrorBody(4, "not leader", True))) == [4, "not leader", True]


@settings(max_examples=50)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0].name}-{r[1].name}")
@given(data=st.data())
def test_every_header_round_trips_through_a_frame(route: tuple[Kind, Op], data: st.DataObject) -> None:
    header = data.draw(STRATEGIES[HEADER_TYPES[route]])
    payload = data.draw(st.binary(max_size=64))
    (frame,) = FrameDecoder().feed(b"".join(encode_message(77, header, payload)))
    assert (frame.kind, frame.op, frame.correlation_id) == (route[0], route[1], 77)
    assert decode_frame_header(frame) == header
    assert bytes(frame.payload) == payload


def test_error_frames_carry_an_error_body_whatever_the_op() -> None:
    body = ErrorBody(1, "no such stream", False)
    (frame,) = FrameDecoder().feed(b"".join(encode_error(5, Op.FETCH, body)))
    assert (frame.kind, frame.op, frame.correlation_id) == (Kind.ERROR, Op.FETCH, 5)
    assert decode_frame_header(frame) == body
    (frame,) = FrameDecoder().feed(b"".join(encode_error(5, 4242, body)))
    assert decode_frame_header(frame) == body


def test_older_and_newer_peers_interoperate() -> None:
    # An older sender omits trailing fields: defaults fill in. A newer one appends fields: they are ignored.
    assert decode_as(ProduceRequest, msgspec.msgpack.encode(["s", 2])) == ProduceRequest("s", 2)
    newer = msgspec.msgpack.encode(["s", 2, 0, 100, "a field from the future", [1, 2]])
    assert decode_as(ProduceRequest, newer) == ProduceRequest("s", 2, Acks.LEADER, 100)


def test_unknown_ops_raise_unsupported() -> None:
    for kind, op in [(Kind.REQUEST, 999), (Kind.RESPONSE, 999)]:
        with pytest.raises(UnsupportedOpError) as info:
            decode_header(kind, op, b"\x90")
        assert (info.value.kind, info.value.op) == (kind, op)
        assert isinstance(info.value, ProtocolError)
    with pytest.raises(UnsupportedOpError):
        decode_header(Kind.PUSH, Op.PRODUCE, b"\x90")


@pytest.mark.parametrize(
    "fields",
    [
        ["", 0],  # empty stream name
        ["s", -1],  # negative partition
        ["s", 2**31],  # partition beyond int32
        ["s", 0, 7],  # no such ack policy
        ["s", 0, 1, -5],  # negative timeout
        ["s"],  # a required field missing
        [0, 0],  # wrong type
        {"stream": "s", "partition": 0},  # a map, not the positional array
    ],
)
def test_invalid_fields_raise_protocol_error(fields: object) -> None:
    with pytest.raises(ProtocolError, match="ProduceRequest"):
        decode_header(Kind.REQUEST, Op.PRODUCE, msgspec.msgpack.encode(fields))


def test_a_declared_huge_array_is_refused_without_allocating_it() -> None:
    hostile = b"\x94\xa1s\x00\x01\x00" + b"\xdd\xff\xff\xff\xff"  # then an array claiming 4 billion items
    with pytest.raises(ProtocolError):
        decode_as(MetadataRequest, b"\x91" + hostile[6:])
    with pytest.raises(ProtocolError):
        decode_as(MetadataResponse, b"\x92\xdd\xff\xff\xff\xff")


@pytest.mark.parametrize(
    "route",
    [r for r in ROUTES if msgspec.structs.fields(HEADER_TYPES[r])],  # field-less headers ignore trailing items
    ids=lambda r: f"{r[0].name}-{r[1].name}",
)
def test_invalid_utf8_raises_protocol_error(route: tuple[Kind, Op]) -> None:
    # Found by the property below: msgspec raised a bare UnicodeDecodeError for constrained strings.
    for hostile in (b"\x93\xa1\x80", b"\x91\x91\xa1\xff", b"\x92\xa2\xc3\x28\x00"):
        with pytest.raises(ProtocolError):
            decode_header(route[0], route[1], hostile)


# Per route (about a hundred of them): the atheris targets and the committed corpus (tests/testing) go deeper.
@settings(max_examples=100)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0].name}-{r[1].name}")
@given(data=st.binary(max_size=64))
def test_random_bytes_raise_only_protocol_error(route: tuple[Kind, Op], data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_header(route[0], route[1], data)


@settings(max_examples=50)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0].name}-{r[1].name}")
@given(data=st.data())
def test_truncated_headers_raise_only_protocol_error(route: tuple[Kind, Op], data: st.DataObject) -> None:
    encoded = encode_header(data.draw(STRATEGIES[HEADER_TYPES[route]]))
    cut = data.draw(st.integers(0, max(0, len(encoded) - 1)))
    with contextlib.suppress(ProtocolError):
        decode_header(route[0], route[1], encoded[:cut])


def test_misuse_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="encode_error"):
        encode_message(1, ErrorBody(1))
    with pytest.raises(TypeError, match="not a registered"):
        decode_as(Header, b"\x90")


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=24,
)


@settings(max_examples=40)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0].name}-{r[1].name}")
@given(value=msgpack_values)
def test_well_formed_msgpack_of_the_wrong_shape_raises_only_protocol_error(route: tuple[Kind, Op], value: Any) -> None:
    with contextlib.suppress(ProtocolError):
        decode_header(route[0], route[1], msgspec.msgpack.encode(value))


def test_a_malformed_header_names_the_field_not_its_position() -> None:
    """msgspec says ``at `$[3]``` of a positional header; the error names the field instead."""
    with pytest.raises(ProtocolError) as caught:
        decode_as(CreateStreamRequest, msgspec.msgpack.encode(["x", "x", 1, -3]))
    assert str(caught.value) == "malformed CreateStreamRequest header: field replication_factor: Expected `int` >= -1"
    with pytest.raises(ProtocolError, match=r"field name: Expected `str` of length >= 1$"):
        decode_as(CreateStreamRequest, msgspec.msgpack.encode(["", "x"]))
