"""Fencing by group epoch on a real broker (NATS, etcd, one ``tidelog`` broker): a commit (SET_CURSOR) or a read
(FETCH, FETCH_CURSOR) made on behalf of a consumer group member carries the group, the member and the epoch it holds,
and the broker refuses it, nothing stored, once a rebalance moved the group on. Requests without a group context
are Liftbridge's, unfenced."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.broker.helpers import create_stream
from tests.helpers import BOUND
from tidelog.client import Admin
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.cursor_messages import FetchCursorRequest, FetchCursorResponse, SetCursorRequest
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.errors import (
    InvalidArgumentError,
    StaleGroupEpochError,
    UnknownGroupError,
    UnknownMemberError,
    UnknownPartitionError,
)
from tidelog.protocol.group_messages import (
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
)
from tidelog.protocol.messages import FetchRequest, FetchResponse, GroupContext
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module")
async def conn(broker: Broker) -> AsyncIterator[Connection]:
    assert broker.wire is not None
    assert broker.mirror is not None
    await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)
    connection = await Connection.open("127.0.0.1", broker.wire.port)
    try:
        yield connection
    finally:
        await connection.close()


async def _join(conn: Connection, group: str, consumer: str, stream: str) -> int:
    joined = (await conn.request(JoinGroupRequest(group, consumer, (stream,)), timeout=BOUND)).header
    assert isinstance(joined, JoinGroupResponse)
    return joined.epoch


async def _owned(conn: Connection, group: str, consumer: str, epoch: int) -> set[int]:
    answer = (await conn.request(GroupAssignmentsRequest(group, consumer, epoch), timeout=BOUND)).header
    assert isinstance(answer, GroupAssignmentsResponse)
    return {p for a in answer.assignments for p in a.partitions}


async def _cursor(conn: Connection, stream: str, partition: int, group: str) -> int:
    answer = (await conn.request(FetchCursorRequest(stream, partition, group), timeout=BOUND)).header
    assert isinstance(answer, FetchCursorResponse)
    return answer.offset


async def test_a_member_whose_epoch_a_rebalance_bumped_cannot_commit(
    conn: Connection, stub: api_pb2_grpc.APIStub, stream_name: str
) -> None:
    await create_stream(stub, stream_name, partitions=2)
    group = f"f-{stream_name}"
    first = await _join(conn, group, "a", stream_name)
    assert await _owned(conn, group, "a", first) == {0, 1}
    a_first = GroupContext(group, "a", first)
    await conn.request(SetCursorRequest(stream_name, 0, group, 10, group=a_first), timeout=BOUND)
    await conn.request(SetCursorRequest(stream_name, 1, group, 20, group=a_first), timeout=BOUND)

    second = await _join(conn, group, "b", stream_name)  # the rebalance: one partition moves to b
    assert second > first
    (kept,) = await _owned(conn, group, "a", second)
    (moved,) = await _owned(conn, group, "b", second)

    with pytest.raises(StaleGroupEpochError, match=f"group epoch {first}.*is at epoch {second}"):
        await conn.request(SetCursorRequest(stream_name, kept, group, 99, group=a_first), timeout=BOUND)
    a_second = GroupContext(group, "a", second)
    with pytest.raises(StaleGroupEpochError, match=f"not currently assigned partition {moved}"):
        await conn.request(SetCursorRequest(stream_name, moved, group, 99, group=a_second), timeout=BOUND)
    assert await _cursor(conn, stream_name, 0, group) == 10, "a refused commit stores nothing"
    assert await _cursor(conn, stream_name, 1, group) == 20

    await conn.request(SetCursorRequest(stream_name, kept, group, 11 + kept, group=a_second), timeout=BOUND)
    b_second = GroupContext(group, "b", second)
    await conn.request(SetCursorRequest(stream_name, moved, group, 30, group=b_second), timeout=BOUND)
    assert await _cursor(conn, stream_name, kept, group) == 11 + kept
    assert await _cursor(conn, stream_name, moved, group) == 30

    await conn.request(LeaveGroupRequest(group, "b"), timeout=BOUND)
    with pytest.raises(StaleGroupEpochError):  # b left: the group is at a new epoch, b is at none
        await conn.request(SetCursorRequest(stream_name, moved, group, 31, group=b_second), timeout=BOUND)
    await conn.request(LeaveGroupRequest(group, "a"), timeout=BOUND)
    with pytest.raises(UnknownGroupError):
        await conn.request(SetCursorRequest(stream_name, moved, group, 31, group=b_second), timeout=BOUND)
    assert await _cursor(conn, stream_name, moved, group) == 30


async def test_a_member_whose_epoch_is_stale_cannot_fetch(
    conn: Connection, stub: api_pb2_grpc.APIStub, stream_name: str
) -> None:
    await create_stream(stub, stream_name, partitions=2)
    group = f"r-{stream_name}"
    first = await _join(conn, group, "a", stream_name)
    await _owned(conn, group, "a", first)
    mine = GroupContext(group, "a", first)
    answer = (await conn.request(FetchRequest(stream_name, 0, 0, max_wait_ms=0, group=mine), timeout=BOUND)).header
    assert isinstance(answer, FetchResponse) and answer.error is None

    second = await _join(conn, group, "b", stream_name)
    (moved,) = await _owned(conn, group, "b", second)
    with pytest.raises(StaleGroupEpochError, match=f"at group epoch {first}"):
        await conn.request(FetchRequest(stream_name, 0, 0, max_wait_ms=0, group=mine), timeout=BOUND)
    with pytest.raises(StaleGroupEpochError, match="not currently assigned"):
        await conn.request(
            FetchRequest(stream_name, moved, 0, max_wait_ms=0, group=GroupContext(group, "a", second)), timeout=BOUND
        )
    with pytest.raises(UnknownMemberError):
        await conn.request(
            FetchRequest(stream_name, moved, 0, max_wait_ms=0, group=GroupContext(group, "c", second)), timeout=BOUND
        )
    plain = (await conn.request(FetchRequest(stream_name, moved, 0, max_wait_ms=0), timeout=BOUND)).header
    assert isinstance(plain, FetchResponse) and plain.error is None, "a fetch without a group is not fenced"
    await conn.request(LeaveGroupRequest(group, "a"), timeout=BOUND)
    await conn.request(LeaveGroupRequest(group, "b"), timeout=BOUND)


@pytest.mark.parametrize(
    ("cursor_id", "context", "partition", "error", "says"),
    [
        ("g", GroupContext("", "c", 1), 0, InvalidArgumentError, "no groupId"),
        ("g", GroupContext("g", "", 1), 0, InvalidArgumentError, "consumer id cannot be empty"),
        ("g", GroupContext("g", "c" * 256, 1), 0, InvalidArgumentError, "at most 255"),
        ("other", GroupContext("g", "c", 1), 0, InvalidArgumentError, "is not the group id"),
        ("g", GroupContext("g", "c", 1), 5, UnknownPartitionError, "not 5"),
    ],
)
async def test_bad_group_commits_get_their_error_and_store_nothing(
    conn: Connection,
    stub: api_pb2_grpc.APIStub,
    stream_name: str,
    cursor_id: str,
    context: GroupContext,
    partition: int,
    error: type[Exception],
    says: str,
) -> None:
    await create_stream(stub, stream_name)
    with pytest.raises(error, match=says):
        await conn.request(SetCursorRequest(stream_name, partition, cursor_id, 5, group=context), timeout=BOUND)
    assert await _cursor(conn, stream_name, 0, cursor_id) == -1


async def test_plain_cursors_are_not_fenced(broker: Broker, conn: Connection, stream_name: str) -> None:
    assert broker.wire is not None
    async with Admin(f"127.0.0.1:{broker.wire.port}") as admin:
        await admin.create_stream(stream_name)
        await admin.set_cursor(stream_name, 0, "no-such-group", 7)
        assert await admin.fetch_cursor(stream_name, 0, "no-such-group") == 7
        with pytest.raises(UnknownGroupError):
            await admin.set_cursor(stream_name, 0, "no-such-group", 8, group=GroupContext("no-such-group", "c", 1))
        assert await admin.fetch_cursor(stream_name, 0, "no-such-group") == 7
