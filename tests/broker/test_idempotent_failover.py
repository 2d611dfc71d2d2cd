"""A producer's retry after the leader died: three real broker processes (a LocalCluster), the leader killed with
SIGKILL, the same batches sent again to the new leader. They are acknowledged with their original offsets and
stored once, because every follower rebuilt the producer state from the batches it replicated.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
import pytest_asyncio

from tests.broker.helpers import create_stream
from tests.helpers import BOUND
from tidelog.local.cluster import LocalCluster
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import TidelogError
from tidelog.protocol.messages import (
    Acks,
    FetchRequest,
    FetchResponse,
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidelog.protocol.records import BatchBuilder, decode_records, iter_batches
from tidelog.replication.follower.leader_link import split_address

pytestmark = pytest.mark.asyncio(loop_scope="module")

T = TypeVar("T")
SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


def batch(producer_id: int, epoch: int, sequence: int, value: bytes) -> bytes:
    builder = BatchBuilder(time.time_ns())
    builder.append(value)
    return builder.build(producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


async def connect(cluster: LocalCluster, broker_id: str) -> Connection:
    host, port = split_address(cluster.broker(broker_id).wire_address)
    return await Connection.open(host, port)


async def until_accepted(what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """Retry while the answer is retriable (NOT_LEADER while the metadata moves, UNAVAILABLE…), as a producer."""
    deadline = time.monotonic() + BOUND
    while True:
        try:
            return await attempt()
        except TidelogError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise AssertionError(f"{what}: {exc!r}") from exc
        await asyncio.sleep(0.1)


async def produce(conn: Connection, stream: str, payload: bytes) -> tuple[int, int]:
    response = await conn.request(ProduceRequest(stream, 0, Acks.ALL), payload, timeout=BOUND)
    assert isinstance(response.header, ProduceResponse) and response.header.error is None
    return response.header.base_offset, response.header.last_offset


async def test_a_retry_after_leader_failover_gets_its_original_offsets(cluster: LocalCluster) -> None:
    stream = "failover-dedupe"
    channel = grpc.aio.insecure_channel(cluster.broker("b0").grpc_address)
    await create_stream(api_pb2_grpc.APIStub(channel), stream, replicationFactor=3)
    await channel.close()

    async def full_isr() -> bool:
        record = await cluster.partition_record(stream, 0)
        return record is not None and len(record.isr) == 3 and bool(record.leader)

    await cluster.wait_until(full_isr, BOUND, "three in-sync replicas")
    record = await cluster.partition_record(stream, 0)
    assert record is not None
    old_leader = record.leader
    assert old_leader is not None

    conn = await connect(cluster, old_leader)
    response = await conn.request(InitProducerRequest(), timeout=BOUND)
    assert isinstance(response.header, InitProducerResponse)
    pid, epoch = response.header.producer_id, response.header.producer_epoch
    sent = [batch(pid, epoch, seq, b"m%d" % seq) for seq in range(3)]
    offsets = [await until_accepted("first attempt", lambda b=b: produce(conn, stream, b)) for b in sent]
    assert offsets == [(0, 0), (1, 1), (2, 2)]  # acks ALL: every ISR member holds them
    await conn.close()

    await cluster.kill(old_leader)

    async def new_leader() -> bool:
        record = await cluster.partition_record(stream, 0)
        return record is not None and record.leader not in (None, old_leader)

    await cluster.wait_until(new_leader, BOUND, "a new leader")
    record = await cluster.partition_record(stream, 0)
    assert record is not None and record.leader is not None
    conn = await connect(cluster, record.leader)
    try:
        # The producer never saw the acknowledgements (say): it retries what is still in its window.
        for payload, original in zip(sent, offsets, strict=True):
            assert await until_accepted("retry", lambda p=payload: produce(conn, stream, p)) == original
        assert await until_accepted("next", lambda: produce(conn, stream, batch(pid, epoch, 3, b"m3"))) == (3, 3)
        fetched = await conn.request(FetchRequest(stream, 0, 0, max_wait_ms=0), timeout=BOUND)
        assert isinstance(fetched.header, FetchResponse)
        values = [
            r.value
            for position, header in iter_batches(fetched.payload)
            for r in decode_records(fetched.payload, position, header=header)
        ]
        assert values == [b"m0", b"m1", b"m2", b"m3"]
    finally:
        await conn.close()
