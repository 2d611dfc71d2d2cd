"""The consumer-group family of the wire protocol: JOIN_GROUP, LEAVE_GROUP, GROUP_ASSIGNMENTS, REPORT_COORDINATOR.

The same operations as Liftbridge's group RPCs (:mod:`tidelog.api.rpc.groups`), for the native client and for
brokers forwarding group changes to the controller (``forwarded`` set). Handlers are thin: every rule lives in
:class:`~tidelog.broker.groups.service.GroupService`.
"""

from __future__ import annotations

from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.broker.groups.service import GroupService
from tidelog.protocol.errors import UnsupportedError
from tidelog.protocol.frames import Op
from tidelog.protocol.messages import (
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ReportCoordinatorRequest,
    ReportCoordinatorResponse,
    StreamAssignment,
    encode_message,
)


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


ROUTES: dict[int, Route] = {
    Op.JOIN_GROUP: route(JoinGroupRequest, join_group),
    Op.LEAVE_GROUP: route(LeaveGroupRequest, leave_group),
    Op.GROUP_ASSIGNMENTS: route(GroupAssignmentsRequest, group_assignments),
    Op.REPORT_COORDINATOR: route(ReportCoordinatorRequest, report_coordinator),
}
