"""The idempotent producer against a real broker: a cut connection loses nothing and duplicates nothing, and a
named producer's new instance fences the old one."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import BOUND
from tidelog.client import Admin, Codec, Consumer, ConsumerRecord, Producer
from tidelog.protocol.errors import ProducerFencedError
from tidelog.protocol.records import BatchHeader
from tidelog.replication.idempotence.producer_state import Duplicate, ProducerStateTable, Verdict

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def create(address: str, name: str, partitions: int = 1) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(name, partitions=partitions)


async def read_all(address: str, stream: str) -> list[ConsumerRecord]:
    async with Consumer(address, stream, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            return [record async for record in consumer]


@pytest.mark.parametrize("cuts", [1, 3])
async def test_a_connection_cut_mid_flight_stores_every_record_once(
    address: str, stream_name: str, cuts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches are written to the socket and the connection closed at once: the broker writes them, their
    answers are lost, and the producer resends them on a new connection — the broker answers those with the
    original offsets, so the log holds each record once, in order."""
    duplicates: list[Verdict] = []
    reserve_all = ProducerStateTable.reserve_all

    def counting(self: ProducerStateTable, headers: list[BatchHeader]) -> Verdict:
        verdict = reserve_all(self, headers)
        if isinstance(verdict, Duplicate):
            duplicates.append(verdict)
        return verdict

    monkeypatch.setattr(ProducerStateTable, "reserve_all", counting)
    await create(address, stream_name, partitions=2)
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    futures = []
    async with Producer(address, max_records=4, compression=Codec.NONE, retry_backoff_ms=10) as producer:
        for partition in (0, 1):  # reach both leaders before cutting
            sent[partition].append(b"first-%d" % partition)
            await producer.send_and_wait(stream_name, sent[partition][-1], partition=partition)
        for cut in range(cuts):
            for i in range(40):
                partition = i % 2
                sent[partition].append(b"c%d-r%d" % (cut, i))
                futures.append(await producer.send(stream_name, sent[partition][-1], partition=partition))
            connection = await producer.cluster.leader_connection(stream_name, 0)
            await connection.close()  # what was written to the socket still reaches the broker
            assert connection.closed
        await producer.flush()
        async with asyncio.timeout(BOUND):
            acked = [await f for f in futures]
    for partition in (0, 1):
        offsets = [m.offset for m in acked if m.partition == partition]
        assert offsets == list(range(1, len(sent[partition])))
    records = await read_all(address, stream_name)
    for partition in (0, 1):
        stored = [r.value for r in records if r.partition == partition]
        assert stored == sent[partition]
    assert duplicates  # some resent batches had been written: the broker answered them, wrote nothing


async def test_a_named_producer_is_fenced_by_its_next_instance(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    name = f"{stream_name}-writer"
    old = Producer(address, producer_name=name)
    try:
        await old.send_and_wait(stream_name, b"old-1")
        async with Producer(address, producer_name=name) as new:
            assert new.stamp is not None and old.stamp is not None
            assert new.stamp.producer_id == old.stamp.producer_id
            assert new.stamp.epoch == old.stamp.epoch + 1
            await new.send_and_wait(stream_name, b"new-1")
        with pytest.raises(ProducerFencedError):
            await old.send_and_wait(stream_name, b"old-2")
        with pytest.raises(ProducerFencedError):
            await old.send(stream_name, b"old-3")
    finally:
        await old.close()
    assert [r.value for r in await read_all(address, stream_name)] == [b"old-1", b"new-1"]


async def test_anonymous_producers_get_distinct_ids(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    async with Producer(address) as a, Producer(address) as b:
        assert a.stamp is not None and b.stamp is not None
        assert a.stamp.producer_id != b.stamp.producer_id
        await a.send_and_wait(stream_name, b"a")
        await b.send_and_wait(stream_name, b"b")
    assert [r.value for r in await read_all(address, stream_name)] == [b"a", b"b"]
