"""Bit rot in a replicated partition heals from a replica (issue 15): three real brokers (a LocalCluster).

A byte flipped inside a sealed segment of the leader, or of a follower, is found when a reader reaches it; the
broker fetches a sound copy of the damaged batch from an in-sync replica and writes it over the damaged span, so
readers get every record — they are told to retry while that runs, never to skip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import EVERY, FIRST, produce_batches, rot
from tidelog.client import Admin, Consumer
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.records import iter_batches
from tidelog.protocol.records.errors import CorruptBatchError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "10000",
}
CLUSTER_BOUND = 60.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


async def full_isr(cluster: LocalCluster, name: str) -> PartitionRecord:
    async def ready() -> bool:
        record = await cluster.partition_record(name, 0)
        return record is not None and len(record.isr) == 3 and bool(record.leader)

    await cluster.wait_until(ready, CLUSTER_BOUND, f"{name}: three in-sync replicas")
    record = await cluster.partition_record(name, 0)
    assert record is not None
    return record


async def replicated_stream(cluster: LocalCluster, name: str) -> PartitionRecord:
    """A stream on all three brokers holding EVERY offset, every replica in sync with all of it."""
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream(name, replication_factor=3, config={"segment.max.bytes": 4096})
        await full_isr(cluster, name)
        await produce_batches(cluster.bootstrap()[0], name)

        def replicated() -> bool:
            return all(stored_end(b.data_dir, name) == len(EVERY) for b in cluster.brokers)

        await cluster.wait_until(replicated, CLUSTER_BOUND, f"{name}: every replica holding every offset")
    record = await cluster.partition_record(name, 0)
    assert record is not None and len(record.isr) == 3
    return record


def stored_end(data_dir: Path, name: str) -> int:
    """One past the last offset written to a broker's files of ``name``/0 (0 when it has none yet)."""
    end = 0
    for path in data_dir.glob(f"streams/{name}@*/0/*.log"):
        with contextlib.suppress(CorruptBatchError):  # the active segment's zero-filled room ends the scan
            for _, header in iter_batches(path.read_bytes(), verify=False):
                end = max(end, header.next_offset)
    return end


def segment_bytes(cluster: LocalCluster, broker_id: str, name: str, damaged: Path) -> bytes:
    (partition_dir,) = cluster.broker(broker_id).data_dir.glob(f"streams/{name}@*/0")
    return (partition_dir / damaged.name).read_bytes()


async def test_a_leader_restores_a_rotten_batch_from_a_follower(cluster: LocalCluster) -> None:
    record = await replicated_stream(cluster, "heal-leader")
    follower = next(r for r in record.replicas if r != record.leader)
    damaged = rot(cluster.broker(record.leader).data_dir, "heal-leader")
    assert damaged.read_bytes() != segment_bytes(cluster, follower, "heal-leader", damaged)
    offsets: list[int] = []
    async with Consumer(cluster.bootstrap(), "heal-leader", stop_at_end=True) as consumer:
        async with asyncio.timeout(CLUSTER_BOUND):
            offsets = [record.offset async for record in consumer]  # no OffsetDamagedError: nothing is skipped
    assert offsets == EVERY
    assert damaged.read_bytes() == segment_bytes(cluster, follower, "heal-leader", damaged)
    async with Admin(cluster.bootstrap()) as admin:
        listed = await admin.skip_damaged("heal-leader", 0)
    assert (listed.ranges, listed.found_total, listed.repaired_total) == ((), 1, 1)


async def test_a_follower_restores_a_rotten_batch_from_its_leader(cluster: LocalCluster) -> None:
    record = await replicated_stream(cluster, "heal-follower")
    follower = next(r for r in record.replicas if r != record.leader)
    damaged = rot(cluster.broker(follower).data_dir, "heal-follower")
    request = api_pb2.SubscribeRequest(
        stream="heal-follower",
        partition=0,
        startPosition=api_pb2.StartPosition.EARLIEST,
        stopPosition=api_pb2.StopPosition.STOP_OFFSET,
        stopOffset=EVERY[-1],
        readISRReplica=True,
    )
    statuses: list[grpc.StatusCode] = []
    async with grpc.aio.insecure_channel(cluster.broker(follower).grpc_address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        async with asyncio.timeout(CLUSTER_BOUND):
            while True:  # as a Liftbridge client does: resubscribe after UNAVAILABLE
                received: list[int] = []
                try:
                    async for message in stub.Subscribe(request):
                        if message.value:
                            received.append(message.offset)
                except grpc.aio.AioRpcError as exc:
                    statuses.append(exc.code())
                    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # the stop offset: read to the end
                        break
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
                    assert received == list(range(FIRST))  # everything before the damage, then "retry"
    assert received == EVERY
    assert grpc.StatusCode.DATA_LOSS not in statuses
    assert damaged.read_bytes() == segment_bytes(cluster, record.leader, "heal-follower", damaged)


async def test_a_follower_catching_up_through_a_rotten_batch_makes_its_leader_restore_it(
    cluster: LocalCluster,
) -> None:
    name = "heal-catch-up"
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream(name, replication_factor=3, config={"segment.max.bytes": 4096})
    record = await full_isr(cluster, name)
    late = next(r for r in record.replicas if r != record.leader)
    await cluster.stop_broker(late)

    async def shrunk() -> bool:
        current = await cluster.partition_record(name, 0)
        return current is not None and late not in current.isr

    await cluster.wait_until(shrunk, CLUSTER_BOUND, f"{late} to leave the ISR")
    await produce_batches(cluster.bootstrap()[0], name)
    # The leader wrote these bytes itself, so it serves them without checking: the follower's check finds it.
    rot(cluster.broker(record.leader).data_dir, name)
    await cluster.restart(late)

    def caught_up() -> bool:
        return stored_end(cluster.broker(late).data_dir, name) == len(EVERY)

    await cluster.wait_until(caught_up, CLUSTER_BOUND, f"{late} to copy every offset")
    other = next(r for r in record.replicas if r not in (record.leader, late))
    for broker_id in (record.leader, late):
        for path in sorted(cluster.broker(broker_id).data_dir.glob(f"streams/{name}@*/0/*.log"))[:-1]:
            assert path.read_bytes() == segment_bytes(cluster, other, name, path), f"{broker_id}: {path.name}"
