"""Pause and resume in a three-broker cluster (a LocalCluster: one NATS, one etcd, three ``tidelog serve``
processes): the controller records the pause in etcd, the leader unsubscribes from NATS and every replica closes
its log (counted in each broker's ``/proc/<pid>/fd`` and on nats-server's ``/subsz``), a restarted replica does not
open it, and a publish through a broker that does not lead the partition resumes every replica.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import (
    bounded,
    create_stream,
    nats_subscriptions,
    open_files_under,
    publish,
    read_until_stop,
    until,
    values,
)
from tests.helpers import BOUND
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol._gen import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

STREAM = "paused-in-a-cluster"
SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


def stub_for(cluster: LocalCluster, broker_id: str) -> api_pb2_grpc.APIStub:
    return api_pb2_grpc.APIStub(grpc.aio.insecure_channel(cluster.broker(broker_id).grpc_address))


def open_files(cluster: LocalCluster, broker_id: str) -> int:
    handle = cluster.broker(broker_id)
    assert handle.pid is not None
    directories = list(handle.data_dir.glob(f"streams/{STREAM}@*/0"))
    return sum(open_files_under(handle.pid, d) for d in directories)


async def record(cluster: LocalCluster) -> PartitionRecord:
    found = await cluster.partition_record(STREAM, 0)
    assert found is not None
    return found


async def test_pause_closes_every_replica_survives_a_restart_and_a_publish_resumes(cluster: LocalCluster) -> None:
    await create_stream(stub_for(cluster, "b0"), STREAM, replicationFactor=3)

    async def in_sync() -> bool:
        found = await cluster.partition_record(STREAM, 0)
        return found is not None and len(found.isr) == 3

    await until(in_sync, "three in-sync replicas")
    leader = (await record(cluster)).leader
    follower = next(b.id for b in cluster.brokers if b.id != leader)
    await publish(stub_for(cluster, follower), STREAM, b"before", ackPolicy=api_pb2.ALL)
    await until(lambda: all(open_files(cluster, b.id) > 0 for b in cluster.brokers), "every replica open")
    monitor = cluster.nats.monitor_url
    assert await nats_subscriptions(monitor, STREAM) == 1  # the leader's ingest

    await bounded(stub_for(cluster, follower).PauseStream(api_pb2.PauseStreamRequest(name=STREAM)))
    assert (await record(cluster)).paused  # in etcd, written by the controller
    await until(lambda: all(open_files(cluster, b.id) == 0 for b in cluster.brokers), "every replica closed")

    async def unsubscribed() -> bool:
        return await nats_subscriptions(monitor, STREAM) == 0

    await until(unsubscribed, "the leader to unsubscribe from NATS")

    assert await cluster.stop_broker(follower) == 0
    await cluster.restart(follower)  # serving and registered: its metadata is applied, the partition not opened
    assert open_files(cluster, follower) == 0

    other = next(b.id for b in cluster.brokers if b.id != leader and b.id != follower)
    assert (await publish(stub_for(cluster, other), STREAM, b"after", ackPolicy=api_pb2.ALL)).ack.offset == 1
    assert not (await record(cluster)).paused
    await until(lambda: all(open_files(cluster, b.id) > 0 for b in cluster.brokers), "every replica open again")

    async def subscribed_again() -> bool:
        return await nats_subscriptions(monitor, STREAM) == 1

    await until(subscribed_again, "the leader to subscribe to NATS again")
    leader = (await record(cluster)).leader
    assert values(await read_until_stop(stub_for(cluster, leader), STREAM)) == [b"before", b"after"]

    async def replicated() -> bool:
        try:
            got = await read_until_stop(stub_for(cluster, follower), STREAM, readISRReplica=True)
        except grpc.aio.AioRpcError:  # not back in the ISR yet: it serves only then
            return False
        return values(got) == [b"before", b"after"]

    await cluster.wait_until(replicated, BOUND, "the restarted follower to hold both messages")
