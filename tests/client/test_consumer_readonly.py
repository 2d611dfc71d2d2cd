"""The native consumer at the end of a read-only partition: that partition is not fetched any more
(``at_readonly_end``), and iteration ends once every partition read has ended, instead of waiting forever."""

from __future__ import annotations

import asyncio

import pytest

from tests.broker.helpers import until
from tests.client.group_helpers import Reader, produce
from tests.helpers import BOUND
from tidelog.client import Admin, Consumer, GroupConsumer, Producer

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_iteration_ends_at_the_end_of_a_readonly_stream(address: str, stream_name: str) -> None:
    async with Admin(address) as admin, Producer(address) as producer:
        await admin.create_stream(stream_name, partitions=2)
        for i in range(6):
            await producer.send(stream_name, b"v%d" % i, partition=i % 2)
        await producer.flush()
        await admin.set_stream_state(stream_name, (), readonly=True)
    async with Consumer(address, stream_name) as consumer:
        async with asyncio.timeout(BOUND):
            got = sorted([record.value async for record in consumer])
        assert got == [b"v%d" % i for i in range(6)]
        assert consumer.at_readonly_end(0) and consumer.at_readonly_end(1)


async def test_a_tailing_consumer_ends_when_the_stream_becomes_readonly(address: str, stream_name: str) -> None:
    async with Admin(address) as admin, Producer(address) as producer:
        await admin.create_stream(stream_name)
        await producer.send(stream_name, b"first")
        await producer.flush()
        async with Consumer(address, stream_name, max_wait_ms=200) as consumer:
            records = consumer.records()
            async with asyncio.timeout(BOUND):
                assert (await anext(records)).value == b"first"
                await admin.set_stream_state(stream_name, (), readonly=True)
                assert [record.value async for record in records] == []  # ends instead of waiting forever
            assert consumer.at_readonly_end(0)


async def test_a_group_member_at_a_readonly_end_reads_on_once_it_is_writable_again(
    address: str, stream_name: str
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
        await produce(address, stream_name, [0], 3)
        await admin.set_stream_state(stream_name, (), readonly=True)
        consumer = GroupConsumer(
            address, stream_name, group_id=f"g-{stream_name}", consumer_id="a", auto_offset_reset="earliest"
        )
        reader = Reader(consumer)
        await reader.start()
        try:
            await until(lambda: len(reader.seen) == 3, "the member to read the read-only partition to its end")
            await admin.set_stream_state(stream_name, (), readonly=False)
            await produce(address, stream_name, [0], 2, first=3)
            await until(lambda: reader.offsets(0) == [0, 1, 2, 3, 4], "the member to read on once writable")
        finally:
            await reader.stop()
