"""Cursors across three real broker processes: ``__cursors`` with replication factor 3, the wrong broker answering
as Liftbridge does, and offsets that survive SIGKILL of the leader of their ``__cursors`` partition — served by
the new leader, which rebuilt its cache from the replicated log."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import create_stream, expect_code
from tests.helpers import BOUND
from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.cursor_messages import SetCursorRequest
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.errors import NotLeaderError
from tidelog.replication.follower.leader_link import split_address

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

T = TypeVar("T")
PARTITIONS = 2
SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
    "cursors_stream_partitions": str(PARTITIONS),
    "cursors_stream_replication_factor": "3",
}
Code = grpc.StatusCode
RETRIABLE = (Code.FAILED_PRECONDITION, Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


def cursor_partition(cursor_id: str, stream: str, partition: int = 0) -> int:
    return zlib.crc32(f"{cursor_id},{stream},{partition}".encode()) % PARTITIONS


async def cursors_record(cluster: LocalCluster, pid: int, in_sync: int = 3) -> PartitionRecord:
    """The ``__cursors`` partition once it has a leader and ``in_sync`` replicas in sync."""
    found: list[PartitionRecord] = []

    async def ready() -> bool:
        record = await cluster.partition_record(CURSORS_STREAM, pid)
        if record is None or not record.leader or len(record.isr) < in_sync:
            return False
        found.append(record)
        return True

    await cluster.wait_until(ready, BOUND, f"{CURSORS_STREAM}/{pid} to have a leader and {in_sync} in-sync replicas")
    return found[-1]


async def with_stub(cluster: LocalCluster, broker_id: str, call: Callable[[api_pb2_grpc.APIStub], Awaitable[T]]) -> T:
    async with grpc.aio.insecure_channel(cluster.broker(broker_id).grpc_address) as channel:
        return await asyncio.wait_for(call(api_pb2_grpc.APIStub(channel)), BOUND)


async def until_served(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Retry while the answer is a failover in progress (not the leader yet, unavailable), bounded."""
    deadline = time.monotonic() + BOUND
    while True:
        try:
            return await attempt()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRIABLE or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {exc.code().name} {exc.details()}") from exc
        await asyncio.sleep(0.1)


async def fetch_from_leader(cluster: LocalCluster, stream: str, cursor_id: str) -> int:
    """The cursor's offset as the current leader of its ``__cursors`` partition answers, through a failover."""

    async def attempt() -> api_pb2.FetchCursorResponse:
        leader = (await cursors_record(cluster, cursor_partition(cursor_id, stream), in_sync=2)).leader
        return await with_stub(cluster, leader, lambda stub: stub.FetchCursor(fetch_request(stream, cursor_id)))

    response = await until_served(f"fetching {cursor_id} from its leader", attempt)
    return response.offset


async def set_on_leader(cluster: LocalCluster, stream: str, cursor_id: str, offset: int) -> None:
    async def attempt() -> None:
        leader = (await cursors_record(cluster, cursor_partition(cursor_id, stream), in_sync=2)).leader
        await with_stub(cluster, leader, lambda stub: stub.SetCursor(set_request(stream, cursor_id, offset)))

    await until_served(f"setting {cursor_id} on its leader", attempt)


async def create_everywhere(cluster: LocalCluster, stream: str) -> None:
    """Create ``stream`` (3 replicas) and wait until every broker's metadata has it: cursor requests check the
    stream where they arrive, and a broker's view of etcd may lag the one that answered the create."""
    await with_stub(cluster, "b0", lambda stub: create_stream(stub, stream, replicationFactor=3))
    for broker in cluster.brokers:

        async def knows(broker_id: str = broker.id) -> bool:
            request = api_pb2.FetchMetadataRequest(streams=[stream])
            response = await with_stub(cluster, broker_id, lambda stub: stub.FetchMetadata(request))
            return all(m.error == api_pb2.StreamMetadata.OK for m in response.streamMetadata)

        await cluster.wait_until(knows, BOUND, f"broker {broker.id} to know stream {stream}")


def set_request(stream: str, cursor_id: str, offset: int) -> api_pb2.SetCursorRequest:
    return api_pb2.SetCursorRequest(stream=stream, partition=0, cursorId=cursor_id, offset=offset)


def fetch_request(stream: str, cursor_id: str) -> api_pb2.FetchCursorRequest:
    return api_pb2.FetchCursorRequest(stream=stream, partition=0, cursorId=cursor_id)


async def test_the_cursors_stream_has_the_configured_replicas(cluster: LocalCluster) -> None:
    for pid in range(PARTITIONS):
        record = await cursors_record(cluster, pid)
        assert sorted(record.replicas) == ["b0", "b1", "b2"]


async def test_a_broker_that_does_not_lead_the_cursor_answers_failed_precondition(cluster: LocalCluster) -> None:
    stream = "wrong-broker"
    await create_everywhere(cluster, stream)
    pid = cursor_partition("c", stream)
    leader = (await cursors_record(cluster, pid)).leader
    other = next(b.id for b in cluster.brokers if b.id != leader)

    said = await with_stub(
        cluster, other, lambda stub: expect_code(Code.FAILED_PRECONDITION, stub.SetCursor(set_request(stream, "c", 5)))
    )
    assert f"not the leader of {CURSORS_STREAM} partition {pid}" in said and repr(leader) in said
    await with_stub(
        cluster, other, lambda stub: expect_code(Code.FAILED_PRECONDITION, stub.FetchCursor(fetch_request(stream, "c")))
    )
    # bad input is answered where it arrives, before any question of leadership
    await with_stub(
        cluster, other, lambda stub: expect_code(Code.INVALID_ARGUMENT, stub.SetCursor(set_request(stream, "", 5)))
    )

    # the wire protocol answers the same: NOT_LEADER, naming the leader
    host, port = split_address(cluster.broker(other).wire_address)
    connection = await Connection.open(host, port)
    try:
        with pytest.raises(NotLeaderError, match=repr(leader)):
            await connection.request(SetCursorRequest(stream, 0, "c", 5), timeout=BOUND)
    finally:
        await connection.close()

    await with_stub(cluster, leader, lambda stub: stub.SetCursor(set_request(stream, "c", 5)))
    response = await with_stub(cluster, leader, lambda stub: stub.FetchCursor(fetch_request(stream, "c")))
    assert response.offset == 5


async def test_a_write_that_timed_out_is_read_back_from_the_log(cluster: LocalCluster) -> None:
    """A SetCursor whose record reached the leader's log but not the ISR in time fails with DEADLINE_EXCEEDED;
    its record commits later (once the stalled follower leaves the ISR), and a read then answers what the log
    holds, not the position cached before the write."""
    stream = "timed-out-write"
    await create_everywhere(cluster, stream)
    pid = cursor_partition("slow", stream)
    record = await cursors_record(cluster, pid)
    await set_on_leader(cluster, stream, "slow", 1)
    stalled = next(r for r in record.replicas if r != record.leader)
    await cluster.pause(stalled)
    try:
        async with grpc.aio.insecure_channel(cluster.broker(record.leader).grpc_address) as channel:
            call = api_pb2_grpc.APIStub(channel).SetCursor(set_request(stream, "slow", 2), timeout=0.5)
            await expect_code(Code.DEADLINE_EXCEEDED, call)
        assert await fetch_from_leader(cluster, stream, "slow") == 2
    finally:
        await cluster.resume(stalled)
    await cursors_record(cluster, pid)  # the follower is back in the ISR for the tests that follow


async def test_offsets_survive_killing_the_leader_of_their_cursors_partition(cluster: LocalCluster) -> None:
    stream = "kept-through-failover"
    await create_everywhere(cluster, stream)
    cursor_ids = [f"consumer-{i}" for i in range(6)]
    pid = cursor_partition(cursor_ids[0], stream)
    before = await cursors_record(cluster, pid)
    on_killed = [c for c in cursor_ids if cursor_partition(c, stream) == pid]
    for number, cursor_id in enumerate(cursor_ids):
        await set_on_leader(cluster, stream, cursor_id, 100 + number)

    await cluster.kill(before.leader)

    async def failed_over() -> bool:
        record = await cluster.partition_record(CURSORS_STREAM, pid)
        return record is not None and record.leader not in ("", before.leader)

    await cluster.wait_until(failed_over, BOUND, f"{CURSORS_STREAM}/{pid} to get a new leader")
    for number, cursor_id in enumerate(cursor_ids):
        assert await fetch_from_leader(cluster, stream, cursor_id) == 100 + number

    # the new leader takes writes, and the native client finds it by itself
    moved = on_killed[0]
    await set_on_leader(cluster, stream, moved, 500)
    live = [b.wire_address for b in cluster.brokers if b.id != before.leader]
    async with Admin(live) as admin:
        assert await admin.fetch_cursor(stream, 0, moved) == 500
        await admin.set_cursor(stream, 0, moved, 501)
        assert await admin.fetch_cursor(stream, 0, moved) == 501

    # the old leader comes back (and may take the lead again as the preferred replica): nothing stale is served
    await cluster.restart(before.leader)
    await cursors_record(cluster, pid)
    assert await fetch_from_leader(cluster, stream, moved) == 501
