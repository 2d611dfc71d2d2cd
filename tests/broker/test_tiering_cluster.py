"""Tiered storage on three broker processes (a LocalCluster) and a real S3-compatible server.

- The leader is killed while it uploads and deletes: the new leader resumes from the list in etcd, and the list
  names every offset exactly once (contiguous from 0), each in an object that is in the store; a consumer reads
  every acknowledged record once, from offset 0, across the store and the brokers' disks.
- A follower stopped while the leader offloads and deletes catches up from far behind (below the leader's local
  log start), then leads and serves the offloaded history from the store.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import obstore
import pytest
import pytest_asyncio
from obstore.store import S3Store

from tests.broker.helpers import partition_metadata, read_until_stop
from tests.helpers import BOUND
from tidelog.launch.object_store import S3Server
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.remote_segments import RemoteSegmentList, RemoteSegmentLists
from tidelog.protocol._gen import api_pb2, api_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
    "tiered_interval_ms": "100",
    "cleaner_interval_ms": "200",
    "segment_max_bytes": "16384",
    "max_message_bytes": "4096",
    "local_retention_bytes": "40960",
    "tiered_store_timeout_ms": "5000",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def s3(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory, s3: S3Server) -> AsyncIterator[LocalCluster]:
    settings = {**SETTINGS, **s3.settings()}
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=settings) as running:
        yield running


def value(i: int) -> bytes:
    return f"{i:06d}".encode() * 80


async def stub_of(cluster: LocalCluster, broker_id: str) -> tuple[grpc.aio.Channel, api_pb2_grpc.APIStub]:
    channel = grpc.aio.insecure_channel(cluster.broker(broker_id).grpc_address)
    return channel, api_pb2_grpc.APIStub(channel)


async def leader_of(cluster: LocalCluster, stream: str, alive: list[str]) -> str:
    """The partition's leader once one of ``alive`` is it (bounded)."""
    async with asyncio.timeout(BOUND):
        while True:
            for broker_id in alive:
                channel, stub = await stub_of(cluster, broker_id)
                try:
                    meta = await partition_metadata(stub, stream)
                    if meta.leader in alive:
                        return str(meta.leader)
                except grpc.aio.AioRpcError:
                    pass
                finally:
                    await channel.close()
            await asyncio.sleep(0.1)


async def publish(cluster: LocalCluster, stream: str, values: range, alive: list[str]) -> None:
    """Publish each value with acks ALL, to whoever leads, retrying across a failover (a retry may store a value
    twice: at-least-once; the checks below read the list of the store, not the count of values)."""
    leader = await leader_of(cluster, stream, alive)
    channel, stub = await stub_of(cluster, leader)
    try:
        for i in values:
            async with asyncio.timeout(BOUND):
                while True:
                    try:
                        await stub.Publish(api_pb2.PublishRequest(stream=stream, value=value(i), ackPolicy=api_pb2.ALL))
                        break
                    except grpc.aio.AioRpcError:
                        await channel.close()
                        leader = await leader_of(cluster, stream, alive)
                        channel, stub = await stub_of(cluster, leader)
    finally:
        await channel.close()


async def remote_list(cluster: LocalCluster, stream: str) -> RemoteSegmentList:
    client = await cluster.etcd_client()
    try:
        return (await RemoteSegmentLists(client, cluster.keys).read(stream, 0)).segments
    finally:
        await client.close()


async def until_listed(cluster: LocalCluster, stream: str, end: int) -> RemoteSegmentList:
    async with asyncio.timeout(BOUND * 2):
        while True:
            listed = await remote_list(cluster, stream)
            if (listed.end_offset or 0) >= end:
                return listed
            await asyncio.sleep(0.1)


async def read_all(cluster: LocalCluster, stream: str, broker_id: str) -> list[api_pb2.Message]:
    channel, stub = await stub_of(cluster, broker_id)
    try:
        return await read_until_stop(stub, stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST)
    finally:
        await channel.close()


async def check_store(s3: S3Server, listed: RemoteSegmentList) -> None:
    """Contiguous from 0, each offset in exactly one listed segment, each listed object in the store."""
    segments = listed.segments
    assert segments[0].base_offset == 0
    assert all(a.end_offset == b.base_offset for a, b in itertools.pairwise(segments)), [
        (s.base_offset, s.end_offset) for s in segments
    ]
    store = S3Store(
        s3.bucket,
        endpoint=s3.endpoint,
        region="us-east-1",
        access_key_id=s3.access_key_id,
        secret_access_key=s3.secret_access_key,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True},
    )
    for segment in segments:
        meta = await obstore.head_async(store, segment.log_name)
        assert meta["size"] == segment.size
        await obstore.head_async(store, segment.manifest_name)


async def create(cluster: LocalCluster, stream: str) -> None:
    channel, stub = await stub_of(cluster, cluster.brokers[0].id)
    try:
        await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream, name=stream, replicationFactor=3))
    finally:
        await channel.close()


async def test_leader_killed_during_uploads_loses_or_duplicates_nothing_in_the_store(
    cluster: LocalCluster, s3: S3Server
) -> None:
    stream = "tier-failover"
    ids = [b.id for b in cluster.brokers]
    await create(cluster, stream)
    await publish(cluster, stream, range(0, 300), ids)
    await until_listed(cluster, stream, 1)
    old = await leader_of(cluster, stream, ids)
    writer = asyncio.create_task(publish(cluster, stream, range(300, 700), [b for b in ids if b != old]))
    await cluster.kill(old)
    await writer
    alive = [b for b in ids if b != old]
    new = await leader_of(cluster, stream, alive)
    messages = await read_all(cluster, stream, new)
    listed = await until_listed(cluster, stream, messages[-1].offset - 60)  # the tail stays in the active segment
    await check_store(s3, listed)
    offsets = [m.offset for m in messages]
    assert offsets == list(range(len(offsets)))
    published = {m.value for m in messages}
    assert published == {value(i) for i in range(700)}  # every acknowledged value, at least once
    await cluster.restart(old)


async def test_a_follower_far_behind_catches_up_then_serves_the_offloaded_history(
    cluster: LocalCluster, s3: S3Server
) -> None:
    stream = "tier-catch-up"
    ids = [b.id for b in cluster.brokers]
    await create(cluster, stream)
    leader = await leader_of(cluster, stream, ids)
    behind = next(b for b in ids if b != leader)
    await cluster.stop_broker(behind)
    others = [b for b in ids if b != behind]
    await publish(cluster, stream, range(0, 600), others)
    await until_listed(cluster, stream, 400)
    await cluster.restart(behind)
    async with asyncio.timeout(BOUND * 2):  # back in the ISR: caught up from below the leader's local log start
        while True:
            channel, stub = await stub_of(cluster, await leader_of(cluster, stream, others))
            try:
                meta = await partition_metadata(stub, stream)
                if behind in meta.isr:
                    break
            except grpc.aio.AioRpcError:
                pass
            finally:
                await channel.close()
            await asyncio.sleep(0.1)
    for broker_id in others:  # only the caught-up follower is left to lead
        await cluster.stop_broker(broker_id)
    try:
        assert await leader_of(cluster, stream, [behind]) == behind
        messages = await read_all(cluster, stream, behind)
        assert [m.value for m in messages] == [value(i) for i in range(600)]
    finally:
        for broker_id in others:
            await cluster.restart(broker_id)
