"""Transactional appends against a real broker: all or nothing, expectations, registers, pipelining."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.helpers import BOUND
from tidelog.client import Admin, Consumer, ConsumerRecord
from tidelog.client.appender import Appender, refusal_details
from tidelog.protocol.errors import IncorrectOffsetError, RegisterMismatchError, UnknownStreamError
from tidelog.protocol.labels import LabelSelector, LabelSet
from tidelog.protocol.records import NewRecord

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


async def create(address: str, name: str, partitions: int = 1) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(name, partitions=partitions)


async def read_all(address: str, stream: str) -> list[ConsumerRecord]:
    async with Consumer(address, stream, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            return [record async for record in consumer]


async def test_an_append_lands_whole_at_contiguous_offsets(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    async with Appender(address) as appender:
        first = await appender.append(stream_name, 0, [b"a", b"b", b"c"])
        second = await appender.append(stream_name, 0, [NewRecord(b"d", key=b"k", headers=[("h", b"1")])])
    assert (first.base_offset, first.last_offset, first.log_end) == (0, 2, 3)
    assert (second.base_offset, second.last_offset, second.log_end) == (3, 3, 4)
    records = await read_all(address, stream_name)
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert records[3].key == b"k" and records[3].headers == (("h", b"1"),)


async def test_a_large_append_streams_in_chunks_and_is_stored_whole(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    values = [os.urandom(1000) for _ in range(3000)]  # ~3 MB: several chunks, spooled to a file
    async with Appender(address, chunk_bytes=256 * 1024) as appender:
        outcome = await appender.append(stream_name, 0, values)
    assert (outcome.base_offset, outcome.last_offset) == (0, 2999)
    assert [r.value for r in await read_all(address, stream_name)] == values


async def test_expected_offset_mismatch_writes_nothing_and_reports_the_end(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    async with Appender(address) as appender:
        await appender.append(stream_name, 0, [b"x", b"y"], expected_offset=0)
        with pytest.raises(IncorrectOffsetError) as refused:
            await appender.append(stream_name, 0, [b"lost"], expected_offset=0)
        details = refusal_details(refused.value)
        assert details is not None and details.log_end == 2
        outcome = await appender.append(stream_name, 0, [b"z"], expected_offset=2)
    assert outcome.base_offset == 2
    assert [r.value for r in await read_all(address, stream_name)] == [b"x", b"y", b"z"]


async def test_two_writers_fence_each_other_with_a_register(address: str, stream_name: str) -> None:
    """Gazette's fencing: each writer checks ``author=<me>`` and takes over with ``union author=<me>``. Once
    B takes over, A's appends are refused and only the holder's land."""
    await create(address, stream_name)
    mine = {name: LabelSet.of(("author", name)) for name in ("a", "b")}
    check = {name: LabelSelector(include=mine[name]) for name in ("a", "b")}
    async with Appender(address) as appender:
        taken = await appender.append(stream_name, 0, [b"a1"], check_registers=check["a"], union_registers=mine["a"])
        assert taken.registers == mine["a"]  # empty registers matched: the first writer takes the lock
        await appender.append(stream_name, 0, [b"a2"], check_registers=check["a"])
        with pytest.raises(RegisterMismatchError) as refused:
            await appender.append(stream_name, 0, [b"b1"], check_registers=check["b"])
        details = refusal_details(refused.value)
        assert details is not None and details.registers == mine["a"] and details.log_end == 2
        # B takes over without a check (an operator's decision, or a lease B knows has expired)
        await appender.append(stream_name, 0, [b"b1"], union_registers=mine["b"])
        with pytest.raises(RegisterMismatchError):
            await appender.append(stream_name, 0, [b"a3"], check_registers=check["a"])
        await appender.append(stream_name, 0, [b"b2"], check_registers=check["b"])
        assert (await appender.registers(stream_name, 0)).registers == mine["b"]
    assert [r.value for r in await read_all(address, stream_name)] == [b"a1", b"a2", b"b1", b"b2"]


async def test_registers_change_only_with_records(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    async with Appender(address) as appender:
        empty = await appender.append(stream_name, 0, [], union_registers=LabelSet.of(("owner", "x")))
        assert (empty.base_offset, empty.log_end) == (-1, 0) and not empty.registers
        assert not (await appender.registers(stream_name, 0)).registers


async def test_pipelined_appends_are_written_in_order(address: str, stream_name: str) -> None:
    await create(address, stream_name)
    async with Appender(address) as appender:
        outcomes = await asyncio.gather(
            *(appender.append(stream_name, 0, [b"%d" % i] * 3, expected_offset=3 * i) for i in range(20))
        )
    assert [o.base_offset for o in outcomes] == [3 * i for i in range(20)]


async def test_an_aborted_append_leaves_nothing_and_uses_no_offsets(address: str, stream_name: str) -> None:
    await create(address, stream_name)

    async def records_then_failure() -> object:
        for i in range(2000):
            yield os.urandom(1000)
            if i == 1500:
                raise RuntimeError("the client's own source failed mid-append")

    async with Appender(address, chunk_bytes=128 * 1024) as appender:
        with pytest.raises(RuntimeError):
            await appender.append(stream_name, 0, records_then_failure())  # type: ignore[arg-type]
        outcome = await appender.append(stream_name, 0, [b"after"])
    assert outcome.base_offset == 0
    assert [r.value for r in await read_all(address, stream_name)] == [b"after"]


async def test_unknown_stream_is_a_clear_error(address: str) -> None:
    async with Appender(address) as appender:
        with pytest.raises(UnknownStreamError):
            await appender.append("no-such-stream-for-appends", 0, [b"x"])


async def test_a_cancelled_append_leaves_nothing_and_uses_no_offsets(address: str, stream_name: str) -> None:
    """The caller's task is cancelled mid-stream (the client gave up): the broker is told to abort, and even if
    it were not, an append without its COMMIT is never written."""
    await create(address, stream_name)
    streamed = asyncio.Event()

    async def slow_records() -> object:
        for i in range(10_000):
            yield os.urandom(1000)
            if i == 600:
                streamed.set()
                await asyncio.sleep(30)

    async with Appender(address, chunk_bytes=64 * 1024) as appender:
        task = asyncio.create_task(appender.append(stream_name, 0, slow_records()))  # type: ignore[arg-type]
        await asyncio.wait_for(streamed.wait(), BOUND)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        outcome = await appender.append(stream_name, 0, [b"after"], expected_offset=0)
    assert outcome.base_offset == 0
    assert [r.value for r in await read_all(address, stream_name)] == [b"after"]
