"""Producer and consumer against a real broker: byte-identical round trips, start positions, ordering, tailing."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest

from tests.helpers import BOUND
from tidelog.client import Acks, Admin, AtTimestamp, Codec, Consumer, ConsumerRecord, Producer, RecordMetadata
from tidelog.protocol.errors import OffsetOutOfRangeError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

T0 = 1_750_000_000_000_000_000

Sent = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]

SAMPLES: list[Sent] = [
    (b"plain", None, (), T0),
    (None, b"tombstone-key", (), T0 + 1),
    (b"", b"", (), T0 + 2),
    (bytes(range(256)) * 400, b"big", (("h", b"1"),), T0 + 3),  # 100 KiB
    (b"with headers", b"k", (("ü-ñ", b"\x00\xff"), ("dup", b"1"), ("dup", b"2"), ("", b"")), T0 - 5),
    *((b"v%d" % i, b"key-%d" % (i % 7), (), T0 + 10 + i) for i in range(200)),
]


async def create(address: str, name: str, partitions: int = 1) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(name, partitions=partitions)


async def produce(address: str, stream: str, records: list[Sent], **options: object) -> list[RecordMetadata]:
    async with Producer(address, **options) as producer:  # type: ignore[arg-type]
        futures = [
            await producer.send(stream, value, key=key, headers=headers, timestamp=ts)
            for value, key, headers, ts in records
        ]
        await producer.flush()
        return [await asyncio.wait_for(f, BOUND) for f in futures]


async def read_all(address: str, stream: str, **options: object) -> list[ConsumerRecord]:
    async with Consumer(address, stream, stop_at_end=True, **options) as consumer:  # type: ignore[arg-type]
        async with asyncio.timeout(BOUND):
            return [record async for record in consumer]


def as_sent(record: ConsumerRecord) -> Sent:
    return (record.value, record.key, record.headers, record.timestamp)


@pytest.mark.parametrize("codec", list(Codec))
async def test_records_come_back_byte_identical(address: str, stream_name: str, codec: Codec) -> None:
    await create(address, stream_name)
    acked = await produce(address, stream_name, SAMPLES, compression=codec, batch_size=8 * 1024)
    assert [m.offset for m in acked] == list(range(len(SAMPLES)))
    assert [m.timestamp for m in acked] == [ts for *_, ts in SAMPLES]
    records = await read_all(address, stream_name)
    assert [as_sent(r) for r in records] == SAMPLES
    assert [r.offset for r in records] == list(range(len(SAMPLES)))
    assert {(r.stream, r.partition) for r in records} == {(stream_name, 0)}


async def test_every_start_position(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    records: list[Sent] = [(b"r%d" % i, None, (), T0 + 1000 * i) for i in range(30)]
    # Several batches, so starting inside one exercises the skip of records before the start offset.
    await produce(address, stream_name, records, batch_size=200)

    async def values_from(start: object) -> list[bytes | None]:
        return [r.value for r in await read_all(address, stream_name, start=start)]

    assert await values_from("earliest") == [r[0] for r in records]
    assert await values_from(17) == [r[0] for r in records[17:]]
    assert await values_from(AtTimestamp(T0 + 10_000)) == [r[0] for r in records[10:]]
    assert await values_from(AtTimestamp(T0 + 5_001)) == [r[0] for r in records[6:]]
    assert await values_from(AtTimestamp(T0 + 10**12)) == []
    assert await values_from("latest") == []


async def test_latest_sees_only_new_records_and_the_tail_wakes_at_once(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    await produce(address, stream_name, [(b"old", None, (), T0)])
    # The long-poll is far longer than the bound: only the new record can end this wait in time.
    async with Consumer(address, stream_name, start="latest", max_wait_ms=600_000) as consumer:
        records = aiter(consumer)
        waiting = asyncio.ensure_future(anext(records))
        await asyncio.sleep(0)
        assert not waiting.done()
        started = time.monotonic()
        await produce(address, stream_name, [(b"new", None, (), T0 + 1)])
        record = await asyncio.wait_for(waiting, BOUND)
        assert (record.offset, record.value) == (1, b"new")
        assert time.monotonic() - started < BOUND


async def test_acks_resolve_in_send_order_with_many_requests_in_flight(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    completed: list[int] = []
    async with Producer(address, max_records=3, max_in_flight=8, compression=Codec.NONE) as producer:
        futures = []
        for i in range(600):
            future = await producer.send(stream_name, b"%d" % i)
            future.add_done_callback(lambda _, i=i: completed.append(i))
            futures.append(future)
        await producer.flush()
    assert completed == list(range(600))
    assert [f.result().offset for f in futures] == list(range(600))
    assert [r.value for r in await read_all(address, stream_name)] == [b"%d" % i for i in range(600)]


async def test_a_burst_of_sends_is_acknowledged_while_it_still_runs(address: str, stream_name: str) -> None:
    """An asyncio producer has no I/O thread: ``send()`` yields a turn of the loop when it fills a batch that
    must wait for a slot, so responses come in and later batches go out while the application keeps sending.
    Without that, no acknowledgement could arrive before the loop below gives up."""
    await create(address, stream_name)
    async with Producer(address, max_records=10, max_in_flight=1, compression=Codec.NONE) as producer:
        futures = [await producer.send(stream_name, b"0")]
        deadline = time.monotonic() + 10
        while not futures[0].done() and len(futures) < 200_000 and time.monotonic() < deadline:
            futures.append(await producer.send(stream_name, b"%d" % len(futures)))
        acknowledged_during = futures[0].done()
        await producer.flush()
    assert acknowledged_during, f"no acknowledgement during a burst of {len(futures)} sends"
    assert [f.result().offset for f in futures] == list(range(len(futures)))


async def test_keys_choose_partitions_and_each_partition_keeps_its_order(address: str, stream_name: str) -> None:
    await create(address, stream_name, partitions=3)
    records: list[Sent] = [(b"%d" % i, b"user-%d" % (i % 11), (), T0 + i) for i in range(300)]
    acked = await produce(address, stream_name, records, max_records=16)
    for (_, key, _, _), meta in zip(records, acked, strict=True):
        assert key is not None and meta.partition == zlib.crc32(key) % 3
    got = await read_all(address, stream_name)
    assert sorted(r.value for r in got if r.value) == sorted(r[0] for r in records if r[0])
    for partition in range(3):
        mine = [r for r in got if r.partition == partition]
        expected = [v for (v, *_), m in zip(records, acked, strict=True) if m.partition == partition]
        assert [r.value for r in mine] == expected
        assert [r.offset for r in mine] == list(range(len(mine)))


async def test_keyless_records_spread_round_robin(address: str, stream_name: str) -> None:
    await create(address, stream_name, partitions=2)
    acked = await produce(address, stream_name, [(b"x", None, (), T0)] * 10)
    assert sorted(m.partition for m in acked) == [0] * 5 + [1] * 5


async def test_acks_none_gives_no_offsets_but_stores_in_order(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    records: list[Sent] = [(b"%d" % i, None, (), T0 + i) for i in range(50)]
    acked = await produce(address, stream_name, records, acks=Acks.NONE, max_records=5)
    assert {m.offset for m in acked} == {-1}
    # Acks NONE does not wait for the write: read until all fifty are there (the long-poll wakes on each).
    async with Consumer(address, stream_name, max_wait_ms=int(BOUND * 1000)) as consumer:
        got: list[bytes | None] = []
        async with asyncio.timeout(BOUND):
            async for record in consumer:
                got.append(record.value)
                if len(got) == len(records):
                    break
    assert got == [r[0] for r in records]


async def test_fetch_batches_counts_without_decoding(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    await produce(address, stream_name, [(b"v", None, (), T0)] * 1000, max_records=64)
    async with Consumer(address, stream_name, stop_at_end=True, start=100, max_bytes=512) as consumer:
        total = 0
        async for batch in consumer.fetch_batches():
            total += batch.record_count
        assert consumer.position(0) == 1000 == consumer.high_watermark(0)
    assert total == 900


async def test_an_offset_past_the_end_resets_or_raises(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    await produce(address, stream_name, [(b"a", None, (), T0), (b"b", None, (), T0)])
    assert [r.value for r in await read_all(address, stream_name, start=1000)] == [b"a", b"b"]
    with pytest.raises(OffsetOutOfRangeError):
        await read_all(address, stream_name, start=1000, auto_offset_reset="error")
