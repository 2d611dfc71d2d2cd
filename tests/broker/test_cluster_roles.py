"""A three-broker cluster as users meet it: any broker takes any request, replicas follow their leaders, and a
broker that is stopped hands its leaderships off first.

Real processes (a LocalCluster: one NATS, one etcd, three ``tidelog serve``), Liftbridge gRPC stubs and the
tidelog client. Timings are shortened so that balancing and failover happen within a test.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import bounded, create_stream, expect_code, publish, read_until_stop
from tests.helpers import BOUND
from tidelog.client import Cluster, Consumer
from tidelog.client.admin import Admin
from tidelog.client.producer import Producer
from tidelog.client.records import batches_of
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import NotLeaderError
from tidelog.protocol.messages import FetchRequest, FetchResponse

pytestmark = pytest.mark.asyncio(loop_scope="module")

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
    "leader_balance_interval_ms": "1500",
}
_names = itertools.count()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


def stub_for(cluster: LocalCluster, broker_id: str) -> api_pb2_grpc.APIStub:
    channel = grpc.aio.insecure_channel(cluster.broker(broker_id).grpc_address)
    return api_pb2_grpc.APIStub(channel)


async def record_of(cluster: LocalCluster, stream: str) -> PartitionRecord:
    record = await cluster.partition_record(stream, 0)
    assert record is not None
    return record


async def full_isr(cluster: LocalCluster, stream: str) -> PartitionRecord:
    """The stream's record once its ISR is full and its leader has applied it: the record in etcd names the
    leader before that broker's own metadata (its watch) does, and until then it refuses to lead."""

    async def ready() -> bool:
        record = await cluster.partition_record(stream, 0)
        if record is None or len(record.isr) != 3 or not record.leader:
            return False
        request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=0)
        try:
            seen = await stub_for(cluster, record.leader).FetchPartitionMetadata(request)
        except grpc.aio.AioRpcError:
            return False  # the leader has not heard of the stream yet
        return bool(seen.metadata.leader == record.leader)

    await cluster.wait_until(ready, BOUND, f"{stream}: three in-sync replicas, the leader serving")
    return await record_of(cluster, stream)


async def new_stream(cluster: LocalCluster, via: str) -> str:
    name = f"roles{next(_names)}"
    await create_stream(stub_for(cluster, via), name, replicationFactor=3)
    return name


async def test_any_broker_creates_streams_and_publishes(cluster: LocalCluster) -> None:
    controller = await cluster.controller_id()
    other = next(b.id for b in cluster.brokers if b.id != controller)
    stream = await new_stream(cluster, via=other)  # forwarded to the controller
    record = await full_isr(cluster, stream)
    assert sorted(record.replicas) == ["b0", "b1", "b2"]

    follower = next(r for r in record.replicas if r != record.leader)
    stub = stub_for(cluster, follower)
    acks = [(await publish(stub, stream, b"v%d" % i, ackPolicy=api_pb2.ALL)).ack.offset for i in range(5)]
    assert acks == [0, 1, 2, 3, 4]  # forwarded to the leader, acknowledged once the ISR has them

    leader_stub = stub_for(cluster, record.leader)
    assert [m.value for m in await read_until_stop(leader_stub, stream)] == [b"v%d" % i for i in range(5)]


async def test_publish_async_through_a_follower_reaches_the_leader_in_order(cluster: LocalCluster) -> None:
    """A follower forwards a PublishAsync run to the leader as one produce (api/rpc/publish_batches.py): every
    message acknowledged in request order with its own offset, a bad one answered alone."""
    controller = await cluster.controller_id()
    stream = await new_stream(cluster, via=controller)
    record = await full_isr(cluster, stream)
    follower = next(r for r in record.replicas if r != record.leader)
    requests = [
        api_pb2.PublishRequest(stream=stream, value=b"f%d" % i, correlationId=f"c{i}", ackPolicy=api_pb2.ALL)
        for i in range(20)
    ]
    requests.insert(5, api_pb2.PublishRequest(stream=stream, value=b"bad", correlationId="bad", ackPolicy=7))  # type: ignore[arg-type]
    call = stub_for(cluster, follower).PublishAsync(iter(requests))
    try:
        responses = await bounded(collect(call))
    finally:
        call.cancel()
    got = [(r.correlationId, r.asyncError.code if r.HasField("asyncError") else r.ack.offset) for r in responses]
    expected = [(f"c{i}", i) for i in range(20)]
    expected.insert(5, ("bad", api_pb2.PublishAsyncError.BAD_REQUEST))
    assert got == expected
    leader_stub = stub_for(cluster, record.leader)
    assert [m.value for m in await read_until_stop(leader_stub, stream)] == [b"f%d" % i for i in range(20)]


async def collect(call: Any) -> list[api_pb2.PublishResponse]:
    return [response async for response in call]


async def test_isr_replicas_serve_subscribers_that_ask(cluster: LocalCluster) -> None:
    stream = await new_stream(cluster, via="b0")
    record = await full_isr(cluster, stream)
    for i in range(3):
        await publish(stub_for(cluster, record.leader), stream, b"m%d" % i, ackPolicy=api_pb2.ALL)
    follower = next(r for r in record.replicas if r != record.leader)
    stub = stub_for(cluster, follower)
    await expect_code(grpc.StatusCode.FAILED_PRECONDITION, read_until_stop(stub, stream))  # not the leader

    async def caught_up() -> bool:  # the follower learns the HW with its next fetch
        got = await read_until_stop(stub, stream, readISRReplica=True)
        return [m.value for m in got] == [b"m0", b"m1", b"m2"]

    await cluster.wait_until(caught_up, BOUND, "the follower to serve every committed message")


async def test_wire_fetches_marked_isr_read_are_served_by_the_follower(cluster: LocalCluster) -> None:
    """The wire protocol's ``isr_read`` (the Spark source's ``readFrom``): a follower serves the fetch from its copy,
    below the HW it knows; unmarked, it refuses (NOT_LEADER). The consumer's ``replica`` reads there."""
    stream = await new_stream(cluster, via="b2")
    record = await full_isr(cluster, stream)
    for i in range(3):
        await publish(stub_for(cluster, record.leader), stream, b"w%d" % i, ackPolicy=api_pb2.ALL)
    follower = next(r for r in record.replicas if r != record.leader)
    client = Cluster(cluster.broker(follower).wire_address)
    try:
        await client.metadata([stream])
        connection = await client.broker_connection(follower)
        with pytest.raises(NotLeaderError):
            await connection.request(FetchRequest(stream, 0, 0, max_wait_ms=0), timeout=BOUND)

        async def served() -> bool:  # the follower learns the HW with its next fetch
            response = await connection.request(FetchRequest(stream, 0, 0, max_wait_ms=0, isr_read=True), timeout=BOUND)
            assert isinstance(response.header, FetchResponse) and response.header.error is None
            return len(batches_of(response.payload, stream, 0, 0)) == 3

        await cluster.wait_until(served, BOUND, "the follower to serve every committed record")
        async with Consumer(cluster=client, stream=stream, replica=follower, stop_at_end=True) as consumer:
            assert [r.value async for r in consumer] == [b"w0", b"w1", b"w2"]
    finally:
        await client.close()


async def test_pause_and_readonly_through_any_broker(cluster: LocalCluster) -> None:
    stream = await new_stream(cluster, via="b1")
    record = await full_isr(cluster, stream)
    follower = next(r for r in record.replicas if r != record.leader)
    stub = stub_for(cluster, follower)
    await bounded(stub.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=stream, readonly=True)))
    assert (await record_of(cluster, stream)).readonly
    await expect_code(grpc.StatusCode.FAILED_PRECONDITION, publish(stub, stream, b"refused"))
    await bounded(stub.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=stream, readonly=False)))
    # The call returns once the broker it was sent to applied the change; the leader applies it from its own
    # watch a moment later (as in Liftbridge: stream state is eventually consistent across brokers).
    leader = stub_for(cluster, record.leader)

    async def writable_at_the_leader() -> bool:
        request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=0)
        return not (await leader.FetchPartitionMetadata(request)).metadata.readonly

    await cluster.wait_until(writable_at_the_leader, BOUND, "the leader to apply read-write")
    await bounded(stub.PauseStream(api_pb2.PauseStreamRequest(name=stream)))
    assert (await record_of(cluster, stream)).paused

    async def paused_at_the_leader() -> bool:
        request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=0)
        return (await leader.FetchPartitionMetadata(request)).metadata.paused

    await cluster.wait_until(paused_at_the_leader, BOUND, "the leader to apply the pause")
    await publish(stub, stream, b"resumes it", ackPolicy=api_pb2.ALL)

    async def resumed() -> bool:
        return not (await record_of(cluster, stream)).paused

    await cluster.wait_until(resumed, BOUND, "the write to resume the partition")


async def test_stopped_leader_hands_off_then_regains_leadership(cluster: LocalCluster) -> None:
    stream = await new_stream(cluster, via="b2")
    record = await full_isr(cluster, stream)
    preferred = record.replicas[0]
    assert record.leader == preferred

    assert await cluster.stop_broker(preferred) == 0  # SIGTERM: controlled shutdown, then a clean exit
    moved = await record_of(cluster, stream)
    assert moved.leader not in ("", preferred), "leadership must move before the broker exits"
    assert moved.leader_epoch == record.leader_epoch + 1
    assert preferred not in moved.isr

    others = [b.wire_address for b in cluster.brokers if b.id != preferred]
    producer = Producer(others)
    await producer.start()
    try:
        first = await bounded(producer.send_and_wait(stream, b"while it is away"))
    finally:
        await producer.close()

    await cluster.restart(preferred)
    rejoined = await full_isr(cluster, stream)
    assert preferred in rejoined.isr

    async def balanced() -> bool:
        return (await record_of(cluster, stream)).leader == preferred

    await cluster.wait_until(balanced, BOUND, "leadership to return to the preferred replica")
    stub = stub_for(cluster, preferred)
    assert [m.value for m in await read_until_stop(stub, stream)][first.offset] == b"while it is away"


async def test_all_writes_refused_below_min_isr(cluster: LocalCluster) -> None:
    stream = await new_stream(cluster, via="b0")
    record = await full_isr(cluster, stream)
    followers = [r for r in record.replicas if r != record.leader]
    for broker in followers:
        assert await cluster.stop_broker(broker) == 0
    try:

        async def shrunk() -> bool:
            return (await record_of(cluster, stream)).isr == (record.leader,)

        await cluster.wait_until(shrunk, BOUND, "the ISR to shrink to the leader")
        stub = stub_for(cluster, record.leader)
        details = await expect_code(grpc.StatusCode.UNAVAILABLE, publish(stub, stream, b"x", ackPolicy=api_pb2.ALL))
        assert "min_isr" in details
        admin = Admin([cluster.broker(record.leader).wire_address])
        try:
            described = await bounded(admin.describe_stream(stream))
        finally:
            await admin.close()
        assert described.partitions[0].high_watermark == 0  # nothing was stored for the refused write
    finally:
        for broker in followers:
            await cluster.restart(broker)
    await full_isr(cluster, stream)
