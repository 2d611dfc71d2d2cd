"""The consumer-group ops of the wire protocol against a real broker: what a native client does to be a member
without gRPC (join, heartbeat with assignments, report, leave), and the refusals it meets, by error class."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.broker.helpers import create_stream
from tests.helpers import BOUND
from tidelog.client import Admin
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.cursor_messages import CursorPosition, ListCursorsRequest, ListCursorsResponse
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.errors import (
    GroupRefusedError,
    InvalidArgumentError,
    StaleGroupEpochError,
    UnknownGroupError,
    UnknownMemberError,
)
from tidelog.protocol.group_messages import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    GroupSummary,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ReportCoordinatorRequest,
    ReportCoordinatorResponse,
    StreamAssignment,
)
from tidelog.protocol.messages import Header
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")
BAD_ID = r"no (groupId|consumerId|streams|coordinator) provided|at most|may not"  # each names the rule broken


@pytest_asyncio.fixture(loop_scope="module")
async def conn(broker: Broker) -> AsyncIterator[Connection]:
    assert broker.wire is not None
    connection = await Connection.open("127.0.0.1", broker.wire.port)
    try:
        yield connection
    finally:
        await connection.close()


async def test_a_member_over_the_wire(
    broker: Broker, stub: api_pb2_grpc.APIStub, conn: Connection, stream_name: str
) -> None:
    await create_stream(stub, stream_name, partitions=3)
    group = f"w-{stream_name}"
    joined = (await conn.request(JoinGroupRequest(group, "m1", (stream_name,)), timeout=BOUND)).header
    assert isinstance(joined, JoinGroupResponse)
    assert joined.coordinator == broker.id and joined.consumer_timeout_ms == broker.config.group_consumer_timeout_ms

    fetched = (await conn.request(GroupAssignmentsRequest(group, "m1", joined.epoch), timeout=BOUND)).header
    assert fetched == GroupAssignmentsResponse(joined.epoch, (StreamAssignment(stream_name, (0, 1, 2)),))

    second = (await conn.request(JoinGroupRequest(group, "m2", (stream_name,)), timeout=BOUND)).header
    assert isinstance(second, JoinGroupResponse) and second.epoch > joined.epoch
    with pytest.raises(StaleGroupEpochError):
        await conn.request(GroupAssignmentsRequest(group, "m1", joined.epoch), timeout=BOUND)
    with pytest.raises(GroupRefusedError, match="already a member"):
        await conn.request(JoinGroupRequest(group, "m2", (stream_name,)), timeout=BOUND)
    with pytest.raises(GroupRefusedError, match="mismatch"):
        await conn.request(ReportCoordinatorRequest(group, "m1", broker.id, joined.epoch), timeout=BOUND)
    reported = await conn.request(ReportCoordinatorRequest(group, "m1", broker.id, second.epoch), timeout=BOUND)
    assert isinstance(reported.header, ReportCoordinatorResponse)

    left = await conn.request(LeaveGroupRequest(group, "m2"), timeout=BOUND)
    assert isinstance(left.header, LeaveGroupResponse)
    with pytest.raises(UnknownMemberError):
        await conn.request(LeaveGroupRequest(group, "m2"), timeout=BOUND)
    await conn.request(LeaveGroupRequest(group, "m1"), timeout=BOUND)
    with pytest.raises(UnknownGroupError):
        await conn.request(LeaveGroupRequest(group, "m1"), timeout=BOUND)


@pytest.mark.parametrize(
    "request_",
    [
        JoinGroupRequest("", "c", ("s",)),
        JoinGroupRequest("g", "x" * 256, ("s",)),
        JoinGroupRequest("g", "c", ()),
        LeaveGroupRequest("g", ""),
        GroupAssignmentsRequest("g/h", "c", 0),
        ReportCoordinatorRequest("g", "c", "", 0),
        JoinGroupRequest("x" * 256, "c", ("s",)),
        LeaveGroupRequest("", "c"),
        GroupAssignmentsRequest("g", "", 0),
        GroupAssignmentsRequest("g", "c" * 256, 0),
        ReportCoordinatorRequest("", "c", "b0", 0),
        DescribeGroupRequest(""),
    ],
)
async def test_bad_ids_are_invalid_arguments(conn: Connection, request_: Header) -> None:
    with pytest.raises(InvalidArgumentError, match=BAD_ID):
        await conn.request(request_, timeout=BOUND)


async def test_joining_with_a_stream_that_does_not_exist_stores_nothing(
    stub: api_pb2_grpc.APIStub, conn: Connection, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    group = f"n-{stream_name}"
    with pytest.raises(GroupRefusedError, match="no-such-stream"):
        await conn.request(JoinGroupRequest(group, "c", (stream_name, "no-such-stream")), timeout=BOUND)
    with pytest.raises(UnknownGroupError):
        await conn.request(DescribeGroupRequest(group), timeout=BOUND)


async def test_describe_and_list_groups(
    broker: Broker, stub: api_pb2_grpc.APIStub, conn: Connection, stream_name: str
) -> None:
    await create_stream(stub, stream_name, partitions=2)
    group = f"d-{stream_name}"
    with pytest.raises(UnknownGroupError):
        await conn.request(DescribeGroupRequest(group), timeout=BOUND)
    await conn.request(JoinGroupRequest(group, "m1", (stream_name,)), timeout=BOUND)
    joined = (await conn.request(JoinGroupRequest(group, "m2", (stream_name,)), timeout=BOUND)).header
    assert isinstance(joined, JoinGroupResponse)

    described = (await conn.request(DescribeGroupRequest(group), timeout=BOUND)).header
    assert isinstance(described, DescribeGroupResponse)
    assert (described.coordinator, described.epoch) == (broker.id, joined.epoch)
    assert [m.consumer_id for m in described.members] == ["m1", "m2"]
    owned = sorted(p for m in described.members for a in m.assignments for p in a.partitions)
    assert owned == [0, 1]

    listed = (await conn.request(ListGroupsRequest(), timeout=BOUND)).header
    assert isinstance(listed, ListGroupsResponse)
    assert GroupSummary(group, broker.id, joined.epoch, 2) in listed.groups
    await conn.request(LeaveGroupRequest(group, "m1"), timeout=BOUND)
    await conn.request(LeaveGroupRequest(group, "m2"), timeout=BOUND)


async def test_a_group_with_members_cannot_be_deleted_and_one_without_loses_every_committed_offset(
    broker: Broker, stub: api_pb2_grpc.APIStub, conn: Connection, stream_name: str
) -> None:
    """DELETE_GROUP goes to the leader of each ``__cursors`` partition (one here): refused while the group has
    members, whatever the client checked; then tombstones for the group's cursors alone, listed by LIST_CURSORS."""
    await create_stream(stub, stream_name, partitions=2)
    assert broker.mirror is not None
    await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)
    group = f"x-{stream_name}"
    assert broker.wire is not None
    async with Admin(f"127.0.0.1:{broker.wire.port}") as admin:
        await admin.set_cursor(stream_name, 0, group, 5)
        await admin.set_cursor(stream_name, 1, group, 7)
        await admin.set_cursor(stream_name, 1, f"{group},{stream_name}", 9)  # an id with a comma: another cursor
        listed = (await conn.request(ListCursorsRequest(group, 0), timeout=BOUND)).header
        assert listed == ListCursorsResponse((CursorPosition(stream_name, 0, 5), CursorPosition(stream_name, 1, 7)))

        await conn.request(JoinGroupRequest(group, "m1", (stream_name,)), timeout=BOUND)
        with pytest.raises(GroupRefusedError, match="1 live member"):
            await conn.request(DeleteGroupRequest(group, 0), timeout=BOUND)
        await conn.request(LeaveGroupRequest(group, "m1"), timeout=BOUND)
        assert await admin.group_offsets(group) == {(stream_name, 0): 5, (stream_name, 1): 7}

        deleted = (await conn.request(DeleteGroupRequest(group, 0), timeout=BOUND)).header
        assert deleted == DeleteGroupResponse(2)
        assert [await admin.fetch_cursor(stream_name, p, group) for p in (0, 1)] == [-1, -1]
        assert await admin.group_offsets(group) == {}
        assert await admin.fetch_cursor(stream_name, 1, f"{group},{stream_name}") == 9
        with pytest.raises(UnknownGroupError, match="no members and no committed offsets"):
            await admin.delete_group(group)
        await admin.set_cursor(stream_name, 0, group, 1)  # a deleted cursor can be set again
        assert await admin.group_offsets(group) == {(stream_name, 0): 1}
