"""Encryption at rest in a three-broker cluster (real ``tidelog serve`` processes, the master key given as
``TIDELOG_ENCRYPTION_KEY``): followers store the leader's very ciphertext, and a follower that becomes leader
serves and seals with the same keys."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import grpc
import pytest

from tests.broker.helpers import SECRET, create_stream, publish, read_until_stop, stored
from tests.helpers import BOUND
from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.records import HEADER_SIZE, iter_batches
from tidelog.storage.encryption import KEY_ID

pytestmark = pytest.mark.slow

SETTINGS = {
    "encryption_key": base64.b64encode(os.urandom(32)).decode(),
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
}


def stub(cluster: LocalCluster, broker_id: str) -> api_pb2_grpc.APIStub:
    return api_pb2_grpc.APIStub(grpc.aio.insecure_channel(cluster.broker(broker_id).grpc_address))


async def test_followers_store_the_leaders_ciphertext_and_take_over(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, 3, settings=SETTINGS) as cluster:
        first = cluster.brokers[0].id
        await create_stream(
            stub(cluster, first), "sealed", replicationFactor=3, encryption=api_pb2.NullableBool(value=True)
        )

        async def isr_full() -> bool:
            record = await cluster.partition_record("sealed", 0)
            return record is not None and len(record.isr) == 3 and bool(record.leader)

        await cluster.wait_until(isr_full, BOUND, "sealed: three in-sync replicas")
        record = await cluster.partition_record("sealed", 0)
        assert record is not None and len(record.data_keys) == 1
        leader = record.leader
        for i in range(5):
            await publish(stub(cluster, leader), "sealed", SECRET + b"%d" % i, ackPolicy=api_pb2.ALL)

        def copies() -> dict[str, bytes]:
            return {b.id: stored(b.data_dir, "sealed") for b in cluster.brokers}

        await cluster.wait_until(lambda: len(set(copies().values())) == 1, BOUND, "every replica holds the batches")
        held = copies()[leader]
        assert held and SECRET not in held  # and the followers' copies are these very bytes

        controller = await cluster.controller_id()
        elsewhere = next(b.id for b in cluster.brokers if b.id != controller)
        async with Admin(cluster.broker(elsewhere).wire_address) as admin:  # forwarded to the controller
            await admin.rotate_key("sealed")

        async def rotated() -> bool:
            now = await cluster.partition_record("sealed", 0)
            return now is not None and len(now.data_keys) == 2

        await cluster.wait_until(rotated, BOUND, "a second data key")

        await cluster.stop_broker(leader)

        async def new_leader() -> bool:
            now = await cluster.partition_record("sealed", 0)
            return now is not None and bool(now.leader) and now.leader != leader

        await cluster.wait_until(new_leader, BOUND, "a follower to take over")
        after = await cluster.partition_record("sealed", 0)
        assert after is not None
        successor = stub(cluster, after.leader)

        async def published() -> bool:
            try:
                await publish(successor, "sealed", SECRET + b"5", ackPolicy=api_pb2.LEADER)
            except grpc.aio.AioRpcError:
                return False  # the new leader has not taken the partition yet
            return True

        await cluster.wait_until(published, BOUND, "the new leader to take a write")

        async def committed() -> bool:
            request = api_pb2.FetchPartitionMetadataRequest(stream="sealed", partition=0)
            return bool((await successor.FetchPartitionMetadata(request)).metadata.highWatermark >= 5)

        await cluster.wait_until(committed, BOUND, "the write to be committed (the ISR shrinks first)")
        values = [m.value for m in await read_until_stop(successor, "sealed")]
        assert values == [SECRET + b"%d" % i for i in range(6)]
        on_disk = stored(cluster.broker(after.leader).data_dir, "sealed")
        assert SECRET not in on_disk
        last = list(iter_batches(on_disk))[-1][0]
        assert KEY_ID.unpack_from(on_disk, last + HEADER_SIZE)[0] == 1  # sealed with the rotated key
