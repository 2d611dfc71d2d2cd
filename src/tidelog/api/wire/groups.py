"""The consumer-group family of the wire protocol: JOIN_GROUP, LEAVE_GROUP, GROUP_ASSIGNMENTS, REPORT_COORDINATOR,
DESCRIBE_GROUP, LIST_GROUPS and DELETE_GROUP.

The first four are Liftbridge's group RPCs (:mod:`tidelog.api.rpc.groups`), for the native client and for brokers
forwarding group changes to the controller (``forwarded`` set); DESCRIBE_GROUP and LIST_GROUPS answer from this
broker's mirror of the group records (where a group's coordinator is, for a member told NOT_COORDINATOR; what
tooling shows). Handlers are thin: every rule lives in :class:`~tidelog.broker.groups.service.GroupService`.

DELETE_GROUP (``tidelog group delete``) deletes a group's committed offsets, which are cursors: it is answered by
the leader of one ``__cursors`` partition, for the cursors that partition holds (a client sends it to each). There
is no group record to delete with them: the controller deletes a group's record when its last member leaves. So
while the record exists the group has members, and the request is refused (GROUP_REFUSED) with nothing deleted.
"""

from __future__ import annotations

from tidelog.api.wire.cursors import store_of
from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.broker.groups.service import GroupService
from tidelog.metadata.group_records import check_id
from tidelog.protocol.errors import GroupRefusedError, UnknownGroupError, UnsupportedError
from tidelog.protocol.frames import Op
from tidelog.protocol.group_messages import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    GroupMemberInfo,
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
from tidelog.protocol.message_codec import encode_message


def _groups(env: HandlerEnv) -> GroupService:
    service = env.broker.groups
    if service is None:
        raise UnsupportedError(f"broker {env.broker.broker_id} runs without consumer groups")
    return service


async def join_group(env: HandlerEnv, correlation_id: int, request: JoinGroupRequest, _: memoryview) -> Reply:
    joined = await _groups(env).join(
        request.group_id, request.consumer_id, request.streams, forwarded=request.forwarded
    )
    response = JoinGroupResponse(
        joined.coordinator, joined.epoch, joined.consumer_timeout_ms, joined.coordinator_timeout_ms
    )
    return Reply(encode_message(correlation_id, response))


async def leave_group(env: HandlerEnv, correlation_id: int, request: LeaveGroupRequest, _: memoryview) -> Reply:
    await _groups(env).leave(
        request.group_id, request.consumer_id, expired=request.expired, forwarded=request.forwarded
    )
    return Reply(encode_message(correlation_id, LeaveGroupResponse()))


async def group_assignments(
    env: HandlerEnv, correlation_id: int, request: GroupAssignmentsRequest, _: memoryview
) -> Reply:
    epoch, assignments = await _groups(env).fetch_assignments(request.group_id, request.consumer_id, request.epoch)
    streams = tuple(StreamAssignment(stream, ids) for stream, ids in assignments)
    return Reply(encode_message(correlation_id, GroupAssignmentsResponse(epoch, streams)))


async def report_coordinator(
    env: HandlerEnv, correlation_id: int, request: ReportCoordinatorRequest, _: memoryview
) -> Reply:
    await _groups(env).report(
        request.group_id, request.consumer_id, request.coordinator, request.epoch, forwarded=request.forwarded
    )
    return Reply(encode_message(correlation_id, ReportCoordinatorResponse()))


async def describe_group(env: HandlerEnv, correlation_id: int, request: DescribeGroupRequest, _: memoryview) -> Reply:
    service = _groups(env)
    check_id("groupId", request.group_id)
    record = service.record(request.group_id)
    if record is None:
        raise UnknownGroupError(f"no such consumer group {request.group_id}")
    members = tuple(
        GroupMemberInfo(m.id, m.streams, tuple(StreamAssignment(s, ids) for s, ids in m.assignments))
        for m in record.members
    )
    response = DescribeGroupResponse(record.id, record.coordinator, record.epoch, members)
    return Reply(encode_message(correlation_id, response))


async def list_groups(env: HandlerEnv, correlation_id: int, request: ListGroupsRequest, _: memoryview) -> Reply:
    groups = _groups(env).groups.groups
    summaries = tuple(GroupSummary(g.id, g.coordinator, g.epoch, len(g.members)) for _, g in sorted(groups.items()))
    return Reply(encode_message(correlation_id, ListGroupsResponse(summaries)))


async def delete_group(env: HandlerEnv, correlation_id: int, request: DeleteGroupRequest, _: memoryview) -> Reply:
    check_id("groupId", request.group_id)
    service = env.broker.groups
    record = service.record(request.group_id) if service is not None else None
    if record is not None and record.members:
        names = ", ".join(m.id for m in record.members)
        raise GroupRefusedError(
            f"consumer group {request.group_id} has {len(record.members)} live member(s) ({names}): stop them "
            "(or wait for the coordinator to remove them) before deleting it"
        )
    store = store_of(env.broker)
    deleted = await store.delete_cursors_of(request.group_id, request.cursors_partition, request.timeout_ms / 1000)
    return Reply(encode_message(correlation_id, DeleteGroupResponse(deleted)))


ROUTES: dict[int, Route] = {
    Op.JOIN_GROUP: route(JoinGroupRequest, join_group),
    Op.LEAVE_GROUP: route(LeaveGroupRequest, leave_group),
    Op.GROUP_ASSIGNMENTS: route(GroupAssignmentsRequest, group_assignments),
    Op.REPORT_COORDINATOR: route(ReportCoordinatorRequest, report_coordinator),
    Op.DESCRIBE_GROUP: route(DescribeGroupRequest, describe_group),
    Op.LIST_GROUPS: route(ListGroupsRequest, list_groups),
    Op.DELETE_GROUP: route(DeleteGroupRequest, delete_group),
}
