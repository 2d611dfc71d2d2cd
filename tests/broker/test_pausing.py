"""Pause and resume as Liftbridge does them, on one real broker (embedded NATS and etcd).

A paused partition holds no open segment file and no NATS subscription (counted in ``/proc/<pid>/fd`` and on
nats-server's ``/subsz``), stores no plain NATS message, stays paused across a restart, and resumes on a publish
(gRPC or wire), a Subscribe with ``resume``, a native consumer's read, or ``tidelog stream resume``'s request.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.broker.helpers import (
    Stub,
    bounded,
    consumed_values,
    create_stream,
    expect_code,
    nats_subscriptions,
    open_files_under,
    partition_metadata,
    publish,
    read_until_stop,
    subscription,
    values,
)
from tests.helpers import BOUND
from tidelog.broker.config import BrokerConfig
from tidelog.client import Admin, Producer
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")


def partition_dir(broker: Broker, stream: str, partition: int = 0) -> Path:
    assert broker.manager is not None and broker.mirror is not None
    return broker.manager.path_of(broker.mirror.snapshot.streams[stream], partition)


def monitor_of(broker: Broker) -> str:
    assert broker.embedded_nats is not None
    return broker.embedded_nats.monitor_url


def wire_of(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def pause(stub: Stub, stream: str, **fields: Any) -> None:
    await bounded(stub.PauseStream(api_pb2.PauseStreamRequest(name=stream, **fields)))


async def assert_open(broker: Broker, stream: str, subject: str) -> None:
    assert open_files_under(os.getpid(), partition_dir(broker, stream)) > 0
    assert await nats_subscriptions(monitor_of(broker), subject) == 1
    assert broker.manager is not None and broker.manager.local(stream, 0) is not None


async def assert_closed(broker: Broker, stream: str, subject: str) -> None:
    assert open_files_under(os.getpid(), partition_dir(broker, stream)) == 0, "segment files still open"
    assert await nats_subscriptions(monitor_of(broker), subject) == 0, "still subscribed to NATS"
    assert broker.manager is not None and broker.manager.local(stream, 0) is None


async def test_pause_closes_the_log_and_unsubscribes_then_a_publish_reopens(
    broker: Broker, stub: Stub, nc: Any, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"before")
    await assert_open(broker, stream_name, stream_name)

    await pause(stub, stream_name)
    await assert_closed(broker, stream_name, stream_name)
    meta = await partition_metadata(stub, stream_name)
    assert meta.paused and meta.highWatermark == 0 and meta.newestOffset == 0  # as it was when paused

    await nc.publish(stream_name, b"plain NATS while paused")  # nobody subscribes: not stored (as Liftbridge)
    await bounded(nc.flush())

    assert (await publish(stub, stream_name, b"after")).ack.offset == 1  # resumes it first
    await assert_open(broker, stream_name, stream_name)
    assert not (await partition_metadata(stub, stream_name)).paused
    assert values(await read_until_stop(stub, stream_name)) == [b"before", b"after"]


async def test_subscribe_resumes_only_with_resume_set(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"kept")
    await pause(stub, stream_name)

    details = await expect_code(grpc.StatusCode.FAILED_PRECONDITION, read_until_stop(stub, stream_name))
    assert "paused" in details
    await assert_closed(broker, stream_name, stream_name)

    assert values(await read_until_stop(stub, stream_name, resume=True)) == [b"kept"]
    await assert_open(broker, stream_name, stream_name)


async def test_a_subscription_open_when_paused_ends_with_failed_precondition(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as sub:
        await publish(stub, stream_name, b"one")
        assert (await sub.next()).value == b"one"
        await pause(stub, stream_name)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await sub.next()
        assert ended.value.code() == grpc.StatusCode.FAILED_PRECONDITION, ended.value.details()


async def test_resume_all_reopens_every_partition(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=3)
    await pause(stub, stream_name, resumeAll=True)
    for pid in range(3):
        assert open_files_under(os.getpid(), partition_dir(broker, stream_name, pid)) == 0

    await publish(stub, stream_name, b"wakes all", partition=2)
    assert broker.manager is not None
    assert all(broker.manager.local(stream_name, pid) is not None for pid in range(3))
    assert all(open_files_under(os.getpid(), partition_dir(broker, stream_name, pid)) for pid in range(3))


async def test_the_native_producer_and_consumer_resume(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await pause(stub, stream_name)
    async with Producer(wire_of(broker)) as producer:
        await producer.send(stream_name, b"by produce")
        await bounded(producer.flush())
    await assert_open(broker, stream_name, stream_name)

    await pause(stub, stream_name)
    assert await consumed_values(wire_of(broker), stream_name) == [b"by produce"]  # its reads resume it
    await assert_open(broker, stream_name, stream_name)


async def test_resume_through_the_admin_request_of_the_cli(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    async with Admin(wire_of(broker)) as admin:
        await bounded(admin.set_stream_state(stream_name, (), paused=True))
        await assert_closed(broker, stream_name, stream_name)
        await bounded(admin.set_stream_state(stream_name, (), paused=False))
    await assert_open(broker, stream_name, stream_name)


async def test_deleting_a_paused_stream_deletes_its_data(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"x")
    directory = partition_dir(broker, stream_name)
    await pause(stub, stream_name)
    await bounded(stub.DeleteStream(api_pb2.DeleteStreamRequest(name=stream_name)))
    assert not directory.exists()


async def test_a_restarted_broker_keeps_the_partition_paused(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path, port=0, wire_port=0, embedded_nats_port=0)
    first = Broker(config)
    await first.start()
    try:
        assert first.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{first.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await create_stream(stub, "kept-paused")
            await publish(stub, "kept-paused", b"before the restart")
            await pause(stub, "kept-paused")
    finally:
        await first.stop()

    second = Broker(config)
    await second.start()
    try:
        await assert_closed(second, "kept-paused", "kept-paused")  # not opened, not subscribed
        assert second.manager is not None and second.manager.paused() == [("kept-paused", 0)]
        assert second.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{second.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            assert (await partition_metadata(stub, "kept-paused")).paused
            await publish(stub, "kept-paused", b"after")
            await assert_open(second, "kept-paused", "kept-paused")
            assert values(await read_until_stop(stub, "kept-paused")) == [b"before the restart", b"after"]
    finally:
        await asyncio.wait_for(second.stop(), BOUND)


async def test_publish_async_resumes_the_partition_it_targets(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    await pause(stub, stream_name)

    async def requests() -> Any:
        yield api_pb2.PublishRequest(stream=stream_name, partition=1, value=b"async", correlationId="c1")

    call = stub.PublishAsync(requests())
    response = await bounded(call.read())
    assert response.correlationId == "c1" and not response.HasField("asyncError"), response
    assert response.ack.offset == 0
    assert not (await partition_metadata(stub, stream_name, 1)).paused
    assert (await partition_metadata(stub, stream_name, 0)).paused  # only the partition written to
    assert open_files_under(os.getpid(), partition_dir(broker, stream_name, 0)) == 0
