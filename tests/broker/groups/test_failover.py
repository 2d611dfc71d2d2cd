"""Consumer groups on three brokers: requests through any broker, coordinator failover on members' reports and
when the coordinator's broker is killed (SIGKILL, by PID), the group carrying on with another coordinator.

Real processes (a LocalCluster: one NATS, one etcd, three ``tidelog serve``) and Liftbridge gRPC stubs. Timeouts
are shortened so that failover happens within a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tests.broker.groups.helpers import assignments, group_metadata, join, partitions, report
from tests.broker.helpers import create_stream, expect_code
from tests.helpers import BOUND
from tidelog.local.cluster import LocalCluster
from tidelog.protocol._gen import api_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "group_consumer_timeout_ms": "4000",
    "group_coordinator_timeout_ms": "3000",
}
MEMBERS = ("c0", "c1", "c2")
_names = itertools.count()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


def stub_for(cluster: LocalCluster, broker_id: str) -> api_pb2_grpc.APIStub:
    return api_pb2_grpc.APIStub(grpc.aio.insecure_channel(cluster.broker(broker_id).grpc_address))


async def three_member_group(cluster: LocalCluster) -> tuple[str, str]:
    """A 6-partition stream and a group of three members, each joined through a different broker."""
    n = next(_names)
    stream, group = f"gs{n}", f"group{n}"
    await create_stream(stub_for(cluster, "b0"), stream, partitions=6, replicationFactor=3)
    for member, broker in zip(MEMBERS, ("b0", "b1", "b2"), strict=True):
        last = await join(stub_for(cluster, broker), group, member, stream)

    async def agreed() -> bool:  # each broker's mirror shows the controller's writes a moment later
        metas = [await group_metadata(stub_for(cluster, b.id), group) for b in cluster.brokers if b.running]
        return all((m.coordinator, m.epoch) == (last.coordinator, last.epoch) for m in metas)

    await cluster.wait_until(agreed, BOUND, "every broker answers the same group metadata")
    return stream, group


async def until_members_consume(cluster: LocalCluster, via: str, group: str, stream: str, dead: str = "") -> str:
    """Heartbeat every member as a Liftbridge client does (metadata, report a coordinator that is gone, fetch
    assignments) until all three hold assignments from one live coordinator covering the stream; that one."""
    stub = stub_for(cluster, via)

    async def rounds() -> str:
        while True:  # bounded by the caller's timeout
            meta = await group_metadata(stub, group)
            if meta.coordinator == dead:
                for member in MEMBERS:  # refused when the epoch moved on, or no controller yet: report again
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await report(stub, group, member, meta.coordinator, meta.epoch)
            else:
                coordinator = stub_for(cluster, meta.coordinator)
                try:
                    owned = [(await assignments(coordinator, group, m, meta.epoch))[1] for m in MEMBERS]
                except grpc.aio.AioRpcError:
                    owned = []
                if owned and set().union(*owned) == partitions(stream, 6) and all(len(o) == 2 for o in owned):
                    return str(meta.coordinator)
            await asyncio.sleep(0.2)  # a heartbeat interval

    return await asyncio.wait_for(rounds(), BOUND)


async def test_any_broker_serves_joins_and_only_the_coordinator_answers_heartbeats(cluster: LocalCluster) -> None:
    stream, group = await three_member_group(cluster)
    meta = await group_metadata(stub_for(cluster, "b0"), group)
    coordinator, epoch = meta.coordinator, meta.epoch
    other = next(b.id for b in cluster.brokers if b.id != coordinator)
    details = await expect_code(
        grpc.StatusCode.FAILED_PRECONDITION, assignments(stub_for(cluster, other), group, "c0", epoch)
    )
    assert "not the coordinator" in details
    assert await until_members_consume(cluster, other, group, stream) == coordinator


async def test_a_majority_of_reports_moves_the_coordinator(cluster: LocalCluster) -> None:
    stream, group = await three_member_group(cluster)
    via = stub_for(cluster, "b1")
    before = await group_metadata(via, group)
    await report(via, group, "c0", before.coordinator, before.epoch)
    assert await group_metadata(via, group) == before, "one report of three is not a majority"
    await report(via, group, "c1", before.coordinator, before.epoch)

    async def moved() -> bool:  # b1's mirror may show the controller's write a moment later
        return (await group_metadata(via, group)).epoch != before.epoch

    await cluster.wait_until(moved, BOUND, "the group's new coordinator")
    after = await group_metadata(via, group)
    assert after.coordinator != before.coordinator and after.epoch > before.epoch
    details = await expect_code(
        grpc.StatusCode.FAILED_PRECONDITION,
        assignments(stub_for(cluster, before.coordinator), group, "c0", after.epoch),
    )
    assert "not the coordinator" in details
    assert await until_members_consume(cluster, "b1", group, stream) == after.coordinator


async def test_the_group_carries_on_when_its_coordinators_broker_is_killed(cluster: LocalCluster) -> None:
    stream, group = await three_member_group(cluster)
    meta = await group_metadata(stub_for(cluster, "b0"), group)
    dead = meta.coordinator
    survivor = next(b.id for b in cluster.brokers if b.id != dead)
    await until_members_consume(cluster, survivor, group, stream)
    await cluster.kill(dead)
    coordinator = await until_members_consume(cluster, survivor, group, stream, dead=dead)
    assert coordinator != dead
    after = await group_metadata(stub_for(cluster, survivor), group)
    assert after.epoch > meta.epoch
