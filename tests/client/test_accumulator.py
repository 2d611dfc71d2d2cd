"""The producer's accumulator alone: when batches seal, when they are due, and in what order they are taken."""

from __future__ import annotations

import asyncio

from tidelog.client.accumulator import Accumulator, PartitionBuffer, RecordMetadata
from tidelog.protocol.records import HEADER_SIZE, decode_records

NOW = 1_700_000_000_000_000_000


def make(woken: list[PartitionBuffer], **limits: float) -> Accumulator:
    settings = {"batch_size": 1 << 20, "max_records": 1000, "linger_ms": 0.0, **limits}
    return Accumulator(
        batch_size=int(settings["batch_size"]),
        max_records=int(settings["max_records"]),
        linger_ms=settings["linger_ms"],
        wake=woken.append,
    )


async def test_a_batch_seals_at_max_records_and_at_batch_size() -> None:
    woken: list[PartitionBuffer] = []
    acc = make(woken, max_records=3, batch_size=100)
    for i in range(3):
        acc.append("s", 0, b"%d" % i, None, (), NOW + i)
    buffer = acc.buffers[("s", 0)]
    assert woken == [buffer] and len(buffer.ready) == 1 and buffer.open is None
    acc.append("s", 0, b"x" * 200, None, (), NOW)  # one record above batch_size still makes a batch
    assert len(buffer.ready) == 2 and woken == [buffer, buffer]
    first, second = buffer.take(), buffer.take()
    assert first is not None and second is not None
    data = first.builder.build()
    assert [r.value for r in decode_records(data)] == [b"0", b"1", b"2"]
    assert [r.timestamp for r in decode_records(data)] == [NOW, NOW + 1, NOW + 2]


async def test_without_linger_an_open_batch_is_due_on_the_next_loop_turn() -> None:
    woken: list[PartitionBuffer] = []
    acc = make(woken)
    for i in range(5):
        acc.append("s", 1, b"%d" % i, b"k", (("h", b"v"),), NOW)
    buffer = acc.buffers[("s", 1)]
    assert woken == [] and buffer.take() is None  # records sent in one burst share the batch
    await asyncio.sleep(0)
    assert woken == [buffer]
    batch = buffer.take()
    assert batch is not None and batch.builder.count == 5 and buffer.open is None


async def test_linger_holds_an_open_batch_back_until_its_time() -> None:
    woken: list[PartitionBuffer] = []
    acc = make(woken, linger_ms=10_000)
    acc.append("s", 0, b"a", None, (), NOW)
    buffer = acc.buffers[("s", 0)]
    await asyncio.sleep(0)
    assert woken == [] and buffer.take() is None
    assert acc.make_all_due() == [buffer]  # what flush does
    assert buffer.take() is not None and buffer.linger is None


async def test_completion_resolves_records_in_order_and_releases_memory() -> None:
    woken: list[PartitionBuffer] = []
    acc = make(woken)
    futures = [acc.append("s", 0, b"v%d" % i, None, (), NOW + i) for i in range(4)]
    assert acc.buffered == HEADER_SIZE + acc.buffers[("s", 0)].open.builder.size  # type: ignore[union-attr]
    await asyncio.sleep(0)
    batch = acc.buffers[("s", 0)].take()
    assert batch is not None
    batch.complete("s", 0, 40)
    await asyncio.sleep(0)  # done-callbacks run on the next loop turn
    assert [f.result() for f in futures] == [RecordMetadata("s", 0, 40 + i, NOW + i) for i in range(4)]
    assert acc.buffered == 0 and not acc.incomplete


async def test_retries_go_first_but_only_once_nothing_is_in_flight() -> None:
    woken: list[PartitionBuffer] = []
    acc = make(woken, max_records=1)
    acc.append("s", 0, b"a", None, (), NOW)
    acc.append("s", 0, b"b", None, (), NOW)
    buffer = acc.buffers[("s", 0)]
    a, b = buffer.take(), buffer.take()
    assert a is not None and b is not None
    buffer.in_flight = 1
    buffer.retry.append(a)
    assert buffer.take() is None  # b is still out: resending a now could land it after b
    buffer.in_flight = 0
    assert buffer.take() is a
