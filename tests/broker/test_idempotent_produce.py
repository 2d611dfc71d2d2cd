"""Idempotent producers over the wire protocol, against one real broker: hand-built batches carrying producer
ids, epochs and sequences, as a producer sends them, and the exact answers and log contents that result.

Also INIT_PRODUCER (ids and epochs from the broker's etcd), a broker restart (the dedupe state comes back from
the producer snapshot and the log after it), and Liftbridge's ``expectedOffset`` made atomic with the append.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.broker.partitions.partition import Appended
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import (
    DuplicateInFlightError,
    IncorrectOffsetError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UnknownProducerError,
)
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
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.server import Broker

from .conftest import broker_config
from .helpers import bounded, create_stream

pytestmark = pytest.mark.asyncio(loop_scope="module")


def batch(producer_id: int, epoch: int, sequence: int, *values: bytes) -> bytes:
    """One batch of ``values`` stamped with a producer's id, epoch and first sequence."""
    builder = BatchBuilder(time.time_ns())
    for value in values or (b"v%d" % sequence,):
        builder.append(value)
    return builder.build(producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)


async def produce(conn: Connection, stream: str, payload: bytes, acks: Acks = Acks.ALL) -> tuple[int, int]:
    response = await conn.request(ProduceRequest(stream, 0, acks), payload, timeout=BOUND)
    assert isinstance(response.header, ProduceResponse) and response.header.error is None
    return response.header.base_offset, response.header.last_offset


async def init_producer(conn: Connection, name: str = "") -> tuple[int, int]:
    response = await conn.request(InitProducerRequest(name), timeout=BOUND)
    assert isinstance(response.header, InitProducerResponse)
    return response.header.producer_id, response.header.producer_epoch


async def stored_values(conn: Connection, stream: str) -> list[bytes]:
    response = await conn.request(FetchRequest(stream, 0, 0, max_wait_ms=0), timeout=BOUND)
    assert isinstance(response.header, FetchResponse)
    values: list[bytes] = []
    for position, header in iter_batches(response.payload):
        values += [r.value or b"" for r in decode_records(response.payload, position, header=header)]
    return values


async def led(broker: Broker, stream: str) -> None:
    """Wait until ``broker`` leads partition 0 of ``stream`` (the mirror's listeners, the manager among them,
    have acted on a snapshot before ``wait_for`` sees it)."""
    assert broker.mirror is not None

    def leads(snapshot: MetadataSnapshot) -> bool:
        record = snapshot.partition(stream, 0)
        return record is not None and record.leader == broker.id

    await broker.mirror.wait_for(leads, BOUND)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def conn(broker: Broker) -> AsyncIterator[Connection]:
    assert broker.wire is not None
    connection = await Connection.open("127.0.0.1", broker.wire.port)
    try:
        yield connection
    finally:
        await connection.close()


@pytest_asyncio.fixture(loop_scope="module")
async def stream(stub: api_pb2_grpc.APIStub, broker: Broker, stream_name: str) -> str:
    await create_stream(stub, stream_name)
    await led(broker, stream_name)
    return stream_name


async def test_a_retried_batch_gets_its_original_offsets_and_is_stored_once(conn: Connection, stream: str) -> None:
    pid, epoch = await init_producer(conn)
    await produce(conn, stream, batch(-1, -1, -1, b"plain"))  # a plain batch first: offsets do not start at 0
    first = batch(pid, epoch, 0, b"a", b"b")
    assert await produce(conn, stream, first) == (1, 2)
    assert await produce(conn, stream, batch(pid, epoch, 2, b"c")) == (3, 3)
    assert await produce(conn, stream, first) == (1, 2)  # the retry: acknowledged, not written
    assert await produce(conn, stream, first, Acks.LEADER) == (1, 2)
    assert await stored_values(conn, stream) == [b"plain", b"a", b"b", b"c"]


async def test_a_gap_is_out_of_order(conn: Connection, stream: str) -> None:
    pid, epoch = await init_producer(conn)
    await produce(conn, stream, batch(pid, epoch, 0))
    with pytest.raises(OutOfOrderSequenceError, match="expected 1"):
        await produce(conn, stream, batch(pid, epoch, 2))
    assert await stored_values(conn, stream) == [b"v0"]


async def test_an_unknown_producer_must_start_at_sequence_zero(conn: Connection, stream: str) -> None:
    pid, epoch = await init_producer(conn)
    with pytest.raises(UnknownProducerError):
        await produce(conn, stream, batch(pid, epoch, 5))


async def test_anonymous_producers_get_distinct_ids(conn: Connection) -> None:
    got = [await init_producer(conn) for _ in range(5)]
    assert len({pid for pid, _ in got}) == 5 and {epoch for _, epoch in got} == {0}
    concurrent = await asyncio.gather(*(init_producer(conn) for _ in range(10)))  # CAS races in etcd
    assert len({pid for pid, _ in [*got, *concurrent]}) == 15


async def test_a_named_producer_bumps_its_epoch_and_fences_the_older_instance(conn: Connection, stream: str) -> None:
    old_pid, old_epoch = await init_producer(conn, f"{stream}-writer")
    assert await produce(conn, stream, batch(old_pid, old_epoch, 0, b"old")) == (0, 0)
    pid, epoch = await init_producer(conn, f"{stream}-writer")
    assert (pid, epoch) == (old_pid, old_epoch + 1)
    assert await produce(conn, stream, batch(pid, epoch, 0, b"new")) == (1, 1)
    with pytest.raises(ProducerFencedError):
        await produce(conn, stream, batch(old_pid, old_epoch, 1, b"zombie"))
    assert await stored_values(conn, stream) == [b"old", b"new"]


async def test_a_retry_while_the_first_attempt_is_written_is_in_flight(broker: Broker, stream: str) -> None:
    assert broker.manager is not None
    partition = broker.manager.leader_of(stream, 0)
    pid = 10**12  # an id INIT_PRODUCER has not reached: the partition treats it like any other
    first = batch(pid, 0, 0)
    attempt = asyncio.ensure_future(partition.append(first, Acks.LEADER, BOUND))  # reserved, not yet written
    await asyncio.sleep(0)
    retry = asyncio.ensure_future(partition.append(first, Acks.LEADER, BOUND))
    with pytest.raises(DuplicateInFlightError):
        await bounded(retry)
    appended = await bounded(attempt)
    again = await partition.append(first, Acks.LEADER, BOUND)
    assert (again.base_offset, again.last_offset, again.duplicate) == (appended.base_offset, appended.last_offset, True)


async def test_a_cancelled_caller_still_leaves_its_batch_recorded(broker: Broker, stream: str) -> None:
    assert broker.manager is not None
    partition = broker.manager.leader_of(stream, 0)
    first = batch(10**12 + 1, 0, 0)
    attempt = asyncio.ensure_future(partition.append(first, Acks.LEADER, BOUND))
    await asyncio.sleep(0)  # the append task is started, its caller goes away before it answers
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt

    async def retry() -> Appended:
        while True:  # as a producer does: DUPLICATE_IN_FLIGHT until the first attempt has landed
            try:
                return await partition.append(first, Acks.LEADER, BOUND)
            except DuplicateInFlightError:
                await asyncio.sleep(0.005)

    again = await bounded(retry())
    assert again.duplicate and partition.log_end == again.last_offset + 1


async def test_expected_offset_publishes_are_atomic_with_the_append(stub: api_pb2_grpc.APIStub, broker: Broker) -> None:
    name = "occ-stream"
    await create_stream(stub, name, optimisticConcurrencyControl=api_pb2.NullableBool(value=True))
    await led(broker, name)

    async def publish_at(offset: int, value: bytes) -> api_pb2.PublishResponse:
        request = api_pb2.PublishRequest(stream=name, value=value, expectedOffset=offset, ackPolicy=api_pb2.LEADER)
        response: api_pb2.PublishResponse = await bounded(stub.Publish(request))
        return response

    responses = await asyncio.gather(*(publish_at(0, b"w%d" % i) for i in range(8)))
    winners = [r for r in responses if r.ack.ackError == 0]
    assert len(winners) == 1 and winners[0].ack.offset == 0
    assert all(r.ack.ackError == api_pb2.Ack.INCORRECT_OFFSET for r in responses if r is not winners[0])


async def test_expected_offset_appends_queued_behind_the_log_lock_do_not_both_land(broker: Broker, stream: str) -> None:
    """The lock is held by a retention run or a compaction in real life: appends queue behind it, and a check
    made before queueing would pass for all of them."""
    assert broker.manager is not None
    partition = broker.manager.leader_of(stream, 0)
    end = partition.log_end
    async with partition.log._lock:  # stands in for an exclusive log operation in progress
        attempts = [
            asyncio.ensure_future(partition.append(batch(-1, -1, -1), Acks.LEADER, BOUND, expected_offset=end))
            for _ in range(5)
        ]
        await asyncio.sleep(0.01)
    results = await asyncio.gather(*attempts, return_exceptions=True)
    landed = [r for r in results if isinstance(r, Appended)]
    assert len(landed) == 1 and landed[0].base_offset == end
    assert all(isinstance(r, IncorrectOffsetError) for r in results if r is not landed[0])
    assert partition.log_end == end + 1


async def test_a_restarted_broker_still_dedupes(tmp_path: Path) -> None:
    """The state comes back from the snapshot written at close and from the log after it (a scan)."""
    data_dir = tmp_path / "restart"
    first = Broker(broker_config(data_dir))
    await first.start()
    try:
        assert first.wire is not None and first.grpc is not None and first.manager is not None
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{first.grpc.port}")
        await create_stream(api_pb2_grpc.APIStub(channel), "kept")
        await channel.close()
        await led(first, "kept")
        conn = await Connection.open("127.0.0.1", first.wire.port)
        pid, epoch = await init_producer(conn)
        early, late = batch(pid, epoch, 0, b"early"), batch(pid, epoch, 1, b"late")
        assert await produce(conn, "kept", early) == (0, 0)
        first.manager.leader_of("kept", 0).snapshot_producers()  # a snapshot holding "early" only...
        assert await produce(conn, "kept", late) == (1, 1)  # ...and "late" only in the log after it
        await conn.close()
    finally:
        await first.stop()
    snapshots = ProducerSnapshots(next((data_dir / "streams").glob("kept@*")) / "0")
    assert snapshots.offsets() == [1, 2]  # the one taken above, and the one written at close
    snapshots.delete_above(1)  # as if the broker had died before closing: "late" must come from the log

    second = Broker(broker_config(data_dir))
    await second.start()
    try:
        assert second.wire is not None and second.manager is not None
        await led(second, "kept")
        conn = await Connection.open("127.0.0.1", second.wire.port)
        assert await produce(conn, "kept", early) == (0, 0)
        assert await produce(conn, "kept", late) == (1, 1)
        assert await produce(conn, "kept", batch(pid, epoch, 2, b"next")) == (2, 2)
        with pytest.raises(OutOfOrderSequenceError):
            await produce(conn, "kept", batch(pid, epoch, 9))
        assert await stored_values(conn, "kept") == [b"early", b"late", b"next"]
        await conn.close()
    finally:
        await second.stop()
