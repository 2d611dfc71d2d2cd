"""Consumer-group calls through the generated Liftbridge stubs, as a Liftbridge client makes them."""

from __future__ import annotations

from tests.broker.helpers import bounded
from tidelog.protocol._gen import api_pb2, api_pb2_grpc

Stub = api_pb2_grpc.APIStub


async def join(stub: Stub, group: str, consumer: str, *streams: str) -> api_pb2.JoinConsumerGroupResponse:
    request = api_pb2.JoinConsumerGroupRequest(groupId=group, consumerId=consumer, streams=list(streams))
    response: api_pb2.JoinConsumerGroupResponse = await bounded(stub.JoinConsumerGroup(request))
    return response


async def leave(stub: Stub, group: str, consumer: str) -> None:
    await bounded(stub.LeaveConsumerGroup(api_pb2.LeaveConsumerGroupRequest(groupId=group, consumerId=consumer)))


async def assignments(stub: Stub, group: str, consumer: str, epoch: int) -> tuple[int, set[tuple[str, int]]]:
    """The group epoch and the member's partitions, as ``(stream, partition)``; also the member's heartbeat."""
    request = api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId=consumer, epoch=epoch)
    response = await bounded(stub.FetchConsumerGroupAssignments(request))
    return response.epoch, {(a.stream, p) for a in response.assignments for p in a.partitions}


async def group_metadata(stub: Stub, group: str) -> api_pb2.ConsumerGroupMetadata:
    response = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest(groups=[group])))
    (found,) = response.groupMetadata
    return found


async def report(stub: Stub, group: str, consumer: str, coordinator: str, epoch: int) -> None:
    request = api_pb2.ReportConsumerGroupCoordinatorRequest(
        groupId=group, consumerId=consumer, coordinator=coordinator, epoch=epoch
    )
    await bounded(stub.ReportConsumerGroupCoordinator(request))


def partitions(stream: str, count: int) -> set[tuple[str, int]]:
    return {(stream, p) for p in range(count)}
