"""Liftbridge's consumer-group RPCs against one real broker, through the generated gRPC stubs.

Join, assignments balanced over the members, leave and rebalance, epochs that grow with every membership change,
a member removed once it stops heartbeating, ``Subscribe`` refused for a stale epoch or a partition assigned to
another member, ``FetchMetadata`` answering groups, and every kind of bad input refused with Liftbridge's status
and nothing stored.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from tests.broker.groups.helpers import assignments, group_metadata, join, leave, partitions
from tests.broker.helpers import bounded, create_stream, expect_code, publish
from tests.helpers import BOUND
from tidelog.metadata.group_records import MAX_ID_LENGTH
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

Stub = api_pb2_grpc.APIStub
S = grpc.StatusCode
CONSUMER_TIMEOUT_MS = 1500


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"group_consumer_timeout_ms": CONSUMER_TIMEOUT_MS}


async def test_join_balance_leave_and_epochs(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=6)
    group = f"g-{stream_name}"

    first = await join(stub, group, "c1", stream_name)
    assert first.coordinator == broker.id
    assert first.consumerTimeout == CONSUMER_TIMEOUT_MS * 1_000_000  # nanoseconds, as Liftbridge sends it
    epoch, alone = await assignments(stub, group, "c1", first.epoch)
    assert (epoch, alone) == (first.epoch, partitions(stream_name, 6))

    second = await join(stub, group, "c2", stream_name)
    third = await join(stub, group, "c3", stream_name)
    assert first.epoch < second.epoch < third.epoch
    meta = await group_metadata(stub, group)
    assert (meta.error, meta.coordinator, meta.epoch) == (api_pb2.ConsumerGroupMetadata.OK, broker.id, third.epoch)

    details = await expect_code(S.FAILED_PRECONDITION, assignments(stub, group, "c1", first.epoch))
    assert "epoch" in details
    owned = {c: (await assignments(stub, group, c, third.epoch))[1] for c in ("c1", "c2", "c3")}
    assert [len(p) for p in owned.values()] == [2, 2, 2]
    assert set().union(*owned.values()) == partitions(stream_name, 6)
    assert owned["c1"] < alone, "the first member keeps part of what it had"

    await leave(stub, group, "c2")
    after = await group_metadata(stub, group)
    assert after.epoch > third.epoch
    rest = {c: (await assignments(stub, group, c, after.epoch))[1] for c in ("c1", "c3")}
    assert [len(p) for p in rest.values()] == [3, 3]
    assert set().union(*rest.values()) == partitions(stream_name, 6)
    assert owned["c1"] <= rest["c1"] and owned["c3"] <= rest["c3"], "only the leaver's partitions move"

    await leave(stub, group, "c1")
    await leave(stub, group, "c3")
    gone = await group_metadata(stub, group)
    assert gone.error == api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP
    await expect_code(S.NOT_FOUND, assignments(stub, group, "c1", after.epoch))


async def test_a_member_that_stops_heartbeating_is_removed(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=4)
    group = f"g-{stream_name}"
    await join(stub, group, "quiet", stream_name)
    joined = await join(stub, group, "live", stream_name)
    _, mine = await assignments(stub, group, "live", joined.epoch)
    assert len(mine) == 2

    async def heartbeat_until_alone() -> set[tuple[str, int]]:
        epoch = joined.epoch
        while True:  # bounded by the caller's timeout
            try:
                epoch, owned = await assignments(stub, group, "live", epoch)
            except grpc.aio.AioRpcError as error:
                assert error.code() == S.FAILED_PRECONDITION, error.details()
                epoch = (await group_metadata(stub, group)).epoch
                continue
            if len(owned) == 4:
                return owned
            await asyncio.sleep(CONSUMER_TIMEOUT_MS / 5000)  # a heartbeat interval, as a client keeps one

    owned = await asyncio.wait_for(heartbeat_until_alone(), BOUND)
    assert owned == partitions(stream_name, 4)
    current = (await group_metadata(stub, group)).epoch
    details = await expect_code(S.FAILED_PRECONDITION, assignments(stub, group, "quiet", current))
    assert "not a member" in details
    await leave(stub, group, "live")


async def test_subscribe_refuses_stale_epochs_and_foreign_partitions(
    broker: Broker, stub: Stub, stream_name: str
) -> None:
    await create_stream(stub, stream_name, partitions=2)
    group = f"g-{stream_name}"
    first = await join(stub, group, "a", stream_name)
    second = await join(stub, group, "b", stream_name)
    _, mine = await assignments(stub, group, "a", second.epoch)
    ((_, own),) = mine
    other = 1 - own

    def subscribe(partition: int, epoch: int) -> Any:
        consumer = api_pb2.Consumer(groupId=group, groupEpoch=epoch, consumerId="a")
        request = api_pb2.SubscribeRequest(stream=stream_name, partition=partition, consumer=consumer)
        return stub.Subscribe(request)

    call = subscribe(own, second.epoch)
    assert await bounded(call.read()) == api_pb2.Message()  # the handshake: accepted
    call.cancel()

    async def first_message(partition: int, epoch: int) -> Any:
        return await subscribe(partition, epoch).read()

    details = await expect_code(S.FAILED_PRECONDITION, first_message(own, first.epoch))
    assert "epoch" in details
    details = await expect_code(S.FAILED_PRECONDITION, first_message(other, second.epoch))
    assert "not currently assigned" in details
    no_consumer = api_pb2.Consumer(groupId=group, groupEpoch=second.epoch)
    request = api_pb2.SubscribeRequest(stream=stream_name, partition=own, consumer=no_consumer)
    await expect_code(S.INVALID_ARGUMENT, stub.Subscribe(request).read())
    await leave(stub, group, "a")
    await leave(stub, group, "b")


async def test_bad_input_is_refused_and_nothing_is_stored(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    group = f"g-{stream_name}"
    too_long = "x" * (MAX_ID_LENGTH + 1)

    for g, c, streams in (
        ("", "c", [stream_name]),
        (group, "", [stream_name]),
        (too_long, "c", [stream_name]),
        (group, too_long, [stream_name]),
        (group, "c", []),
        ("a/b", "c", [stream_name]),
    ):
        request = api_pb2.JoinConsumerGroupRequest(groupId=g, consumerId=c, streams=streams)
        await expect_code(S.INVALID_ARGUMENT, stub.JoinConsumerGroup(request))
    details = await expect_code(
        S.FAILED_PRECONDITION,
        stub.JoinConsumerGroup(
            api_pb2.JoinConsumerGroupRequest(groupId=group, consumerId="c", streams=[stream_name, "no-such-stream"])
        ),
    )
    assert "no-such-stream" in details
    assert (await group_metadata(stub, group)).error == api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP

    await expect_code(
        S.NOT_FOUND, stub.LeaveConsumerGroup(api_pb2.LeaveConsumerGroupRequest(groupId=group, consumerId="c"))
    )
    await expect_code(
        S.NOT_FOUND,
        stub.FetchConsumerGroupAssignments(
            api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId="c", epoch=0)
        ),
    )

    joined = await join(stub, group, "c", stream_name)
    details = await expect_code(
        S.FAILED_PRECONDITION,
        stub.JoinConsumerGroup(api_pb2.JoinConsumerGroupRequest(groupId=group, consumerId="c", streams=[stream_name])),
    )
    assert "already a member" in details
    await expect_code(
        S.FAILED_PRECONDITION,
        stub.LeaveConsumerGroup(api_pb2.LeaveConsumerGroupRequest(groupId=group, consumerId="stranger")),
    )
    await expect_code(
        S.FAILED_PRECONDITION,
        stub.FetchConsumerGroupAssignments(
            api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId="stranger", epoch=joined.epoch)
        ),
    )
    report = api_pb2.ReportConsumerGroupCoordinatorRequest
    await expect_code(S.INVALID_ARGUMENT, stub.ReportConsumerGroupCoordinator(report(groupId=group, consumerId="c")))
    await expect_code(
        S.FAILED_PRECONDITION,
        stub.ReportConsumerGroupCoordinator(
            report(groupId=group, consumerId="c", coordinator="elsewhere", epoch=joined.epoch)
        ),
    )
    meta = await group_metadata(stub, group)
    assert meta.epoch == joined.epoch, "no refused request changed the group"
    await leave(stub, group, "c")


async def test_stale_epochs_and_bad_ids_of_a_subscription_are_refused(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    group = f"g-{stream_name}"
    first = await join(stub, group, "a", stream_name)
    second = await join(stub, group, "b", stream_name)
    details = await expect_code(S.FAILED_PRECONDITION, assignments(stub, group, "a", first.epoch))
    assert f"epoch {first.epoch}" in details
    too_long = "x" * (MAX_ID_LENGTH + 1)
    for group_id, consumer_id in ((too_long, "a"), (group, too_long), (group, "a b")):
        consumer = api_pb2.Consumer(groupId=group_id, groupEpoch=second.epoch, consumerId=consumer_id)
        request = api_pb2.SubscribeRequest(stream=stream_name, partition=0, consumer=consumer)
        await expect_code(S.INVALID_ARGUMENT, stub.Subscribe(request).read())
    assert (await group_metadata(stub, group)).epoch == second.epoch, "no refused request changed the group"
    await leave(stub, group, "a")
    await leave(stub, group, "b")


async def test_a_rebalance_ends_the_subscription_of_a_partition_that_moved(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    group = f"g-{stream_name}"
    first = await join(stub, group, "a", stream_name)
    calls = {}
    for p in (0, 1):
        consumer = api_pb2.Consumer(groupId=group, groupEpoch=first.epoch, consumerId="a")
        calls[p] = stub.Subscribe(api_pb2.SubscribeRequest(stream=stream_name, partition=p, consumer=consumer))
        assert await bounded(calls[p].read()) == api_pb2.Message()

    second = await join(stub, group, "b", stream_name)
    _, kept = await assignments(stub, group, "a", second.epoch)
    ((_, own),) = kept
    moved = 1 - own
    assert await bounded(calls[moved].read()) == grpc.aio.EOF, "the moved partition's subscription ended"
    assert await bounded(calls[moved].code()) == S.OK

    await publish(stub, stream_name, b"still mine", partition=own)
    message = await bounded(calls[own].read())
    assert (message.partition, message.value) == (own, b"still mine")
    calls[own].cancel()
    await leave(stub, group, "a")
    await leave(stub, group, "b")


async def test_a_deleted_stream_leaves_the_group_rebalanced(broker: Broker, stub: Stub, stream_name: str) -> None:
    kept, dropped = f"{stream_name}-k", f"{stream_name}-d"
    await create_stream(stub, kept, partitions=2)
    await create_stream(stub, dropped, partitions=2)
    group = f"g-{stream_name}"
    joined = await join(stub, group, "c", kept, dropped)
    _, owned = await assignments(stub, group, "c", joined.epoch)
    assert owned == partitions(kept, 2) | partitions(dropped, 2)

    await bounded(stub.DeleteStream(api_pb2.DeleteStreamRequest(name=dropped)))

    assert broker.groups is not None
    await broker.groups.mirror.wait_for(lambda g: getattr(g.get(group), "epoch", 0) > joined.epoch, BOUND)
    epoch = (await group_metadata(stub, group)).epoch
    assert await assignments(stub, group, "c", epoch) == (epoch, partitions(kept, 2))
    await leave(stub, group, "c")
