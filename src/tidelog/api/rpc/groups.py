"""Liftbridge's consumer-group RPCs: request → :class:`~tidelog.broker.groups.service.GroupService` → response.

``JoinConsumerGroupResponse`` carries the timeouts as Liftbridge does, in nanoseconds (a Go ``time.Duration``),
so Liftbridge clients schedule their heartbeats from them unchanged. Errors reach the client through the service's
one error table: bad ids INVALID_ARGUMENT, an unknown group NOT_FOUND, not a member, not the coordinator, a stale
epoch or a stream that does not exist FAILED_PRECONDITION, as Liftbridge answers each.
"""

from __future__ import annotations

from tidelog.broker.context import BrokerContext
from tidelog.broker.groups.service import GroupService
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.errors import UnsupportedError

_NS_PER_MS = 1_000_000


def _groups(ctx: BrokerContext) -> GroupService:
    if ctx.groups is None:
        raise UnsupportedError(f"broker {ctx.broker_id} runs without consumer groups")
    return ctx.groups


async def join(ctx: BrokerContext, request: api_pb2.JoinConsumerGroupRequest) -> api_pb2.JoinConsumerGroupResponse:
    joined = await _groups(ctx).join(request.groupId, request.consumerId, list(request.streams))
    return api_pb2.JoinConsumerGroupResponse(
        coordinator=joined.coordinator,
        epoch=joined.epoch,
        consumerTimeout=joined.consumer_timeout_ms * _NS_PER_MS,
        coordinatorTimeout=joined.coordinator_timeout_ms * _NS_PER_MS,
    )


async def leave(ctx: BrokerContext, request: api_pb2.LeaveConsumerGroupRequest) -> api_pb2.LeaveConsumerGroupResponse:
    await _groups(ctx).leave(request.groupId, request.consumerId)
    return api_pb2.LeaveConsumerGroupResponse()


async def fetch_assignments(
    ctx: BrokerContext, request: api_pb2.FetchConsumerGroupAssignmentsRequest
) -> api_pb2.FetchConsumerGroupAssignmentsResponse:
    epoch, assignments = await _groups(ctx).fetch_assignments(request.groupId, request.consumerId, request.epoch)
    return api_pb2.FetchConsumerGroupAssignmentsResponse(
        epoch=epoch,
        assignments=[api_pb2.PartitionAssignment(stream=s, partitions=list(ids)) for s, ids in assignments],
    )


async def report_coordinator(
    ctx: BrokerContext, request: api_pb2.ReportConsumerGroupCoordinatorRequest
) -> api_pb2.ReportConsumerGroupCoordinatorResponse:
    await _groups(ctx).report(request.groupId, request.consumerId, request.coordinator, request.epoch)
    return api_pb2.ReportConsumerGroupCoordinatorResponse()


def group_metadata(ctx: BrokerContext, group_id: str) -> api_pb2.ConsumerGroupMetadata:
    """One group's entry of ``FetchMetadataResponse``: its coordinator and epoch, or UNKNOWN_GROUP."""
    record = ctx.groups.record(group_id) if ctx.groups is not None else None
    if record is None:
        return api_pb2.ConsumerGroupMetadata(groupId=group_id, error=api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP)
    return api_pb2.ConsumerGroupMetadata(groupId=group_id, coordinator=record.coordinator, epoch=record.epoch)
