"""Admin operations and the errors every client object surfaces, against a real broker."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import BOUND
from tidelog.client import Admin, Cluster, ConnectionClosedError, Consumer, Producer
from tidelog.protocol.errors import (
    InvalidArgumentError,
    ReadonlyError,
    StreamExistsError,
    UnknownPartitionError,
    UnknownStreamError,
)
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def test_create_list_describe_delete(address: str, stream_name: str, broker: Broker) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(
            stream_name, f"{stream_name}.subject", partitions=2, config={"retention.max.bytes": 1 << 30}
        )
        summaries = await admin.list_streams(prefix=stream_name)
        assert [(s.name, s.subject, s.partitions) for s in summaries] == [(stream_name, f"{stream_name}.subject", 2)]

        async with Producer(cluster=admin.cluster) as producer:
            for i in range(7):
                await producer.send(stream_name, b"%d" % i, partition=1)
            await producer.flush()
        info = await admin.describe_stream(stream_name)
        assert [p.id for p in info.partitions] == [0, 1]
        assert all(p.leader == broker.id and p.isr == (broker.id,) for p in info.partitions)
        assert [(p.log_start, p.high_watermark, p.log_end) for p in info.partitions] == [(0, 0, 0), (0, 7, 7)]

        meta = await admin.metadata([stream_name, "no-such-stream"])
        assert [b.id for b in meta.brokers] == [broker.id]
        assert meta.brokers[0].port == broker.wire.port  # type: ignore[union-attr]
        known, unknown = meta.streams
        assert known.error is None and unknown.error is not None

        await admin.delete_stream(stream_name)
        assert await admin.list_streams(prefix=stream_name) == []
        with pytest.raises(UnknownStreamError):
            await admin.describe_stream(stream_name)


async def test_admin_errors(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
        with pytest.raises(StreamExistsError):
            await admin.create_stream(stream_name, "another.subject")
        with pytest.raises(UnknownStreamError):
            await admin.delete_stream(f"{stream_name}-missing")
        with pytest.raises(InvalidArgumentError, match="unknown stream setting"):
            await admin.create_stream(f"{stream_name}-2", config={"no.such.setting": 1})
        with pytest.raises(InvalidArgumentError, match="bad stream setting"):
            await admin.create_stream(f"{stream_name}-3", config={"retention.max.bytes": "lots"})
        with pytest.raises(InvalidArgumentError):
            await admin.create_stream("bad name with spaces")


async def test_producing_to_an_unknown_stream_or_partition(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    async with Producer(address) as producer:
        with pytest.raises(UnknownStreamError):
            await producer.send(f"{stream_name}-missing", b"x")  # the metadata lookup says so
        future = await producer.send(stream_name, b"x", partition=5)
        with pytest.raises(UnknownPartitionError):
            await asyncio.wait_for(future, BOUND)
        assert (await producer.send_and_wait(stream_name, b"fine")).offset == 0  # the producer carries on


async def test_consuming_an_unknown_stream(address: str, stream_name: str) -> None:
    with pytest.raises(UnknownStreamError):
        async with Consumer(address, f"{stream_name}-missing"):
            pass


async def test_unreachable_brokers_fail_fast_with_a_retriable_error() -> None:
    from tidelog.launch.ports import free_port

    cluster = Cluster(f"127.0.0.1:{free_port()}", connect_timeout=BOUND)
    with pytest.raises(ConnectionClosedError) as info:
        await cluster.any_connection()
    assert info.value.retriable
    await cluster.close()


async def test_pause_resume_and_read_only(address: str, stream_name: str) -> None:
    async with Admin(address) as admin, Producer(cluster=admin.cluster) as producer:
        await admin.create_stream(stream_name, partitions=2)
        await admin.set_stream_state(stream_name, [1], paused=True)
        info = await admin.describe_stream(stream_name)
        assert [p.paused for p in info.partitions] == [False, True]

        await admin.set_stream_state(stream_name, readonly=True)
        assert all(p.readonly for p in (await admin.describe_stream(stream_name)).partitions)
        with pytest.raises(ReadonlyError):
            await producer.send_and_wait(stream_name, b"refused", partition=0)

        await admin.set_stream_state(stream_name, readonly=False)
        assert (await producer.send_and_wait(stream_name, b"accepted", partition=1)).offset == 0
        info = await admin.describe_stream(stream_name)
        assert [(p.paused, p.readonly) for p in info.partitions] == [(False, False), (False, False)]  # resumed

        with pytest.raises(UnknownStreamError):
            await admin.set_stream_state(f"{stream_name}-missing", paused=True)
