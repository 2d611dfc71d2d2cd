"""Subscribe at the end of a read-only partition: the subscription ends with RESOURCE_EXHAUSTED "End of readonly
partition", as Liftbridge's does, instead of waiting for messages that can never come."""

from __future__ import annotations

import grpc
import pytest

from tests.broker.helpers import Stub, bounded, create_stream, publish, subscription
from tidelog.protocol._gen import api_pb2

pytestmark = pytest.mark.asyncio(loop_scope="module")

END = "End of readonly partition"


async def readonly(stub: Stub, stream: str, on: bool = True) -> None:
    await bounded(stub.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=stream, readonly=on)))


async def test_a_subscription_of_a_readonly_partition_ends_after_the_last_message(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    for value in (b"a", b"b"):
        await publish(stub, stream_name, value)
    await readonly(stub, stream_name)
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as sub:
        assert [m.value for m in await sub.take(2)] == [b"a", b"b"]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await sub.next()
    assert (ended.value.code(), ended.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, END)


async def test_a_subscription_waiting_at_the_tail_ends_when_the_partition_becomes_readonly(
    stub: Stub, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as sub:
        await publish(stub, stream_name, b"only")
        assert (await sub.next()).value == b"only"
        await readonly(stub, stream_name)  # the subscription waits at the tail meanwhile
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await sub.next()
    assert (ended.value.code(), ended.value.details()) == (grpc.StatusCode.RESOURCE_EXHAUSTED, END)


async def test_an_empty_readonly_partition_ends_at_once_and_writable_again_waits(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await readonly(stub, stream_name)
    async with subscription(stub, stream_name, startPosition=api_pb2.NEW_ONLY) as sub:
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await sub.next()
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    await readonly(stub, stream_name, on=False)
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as sub:
        await publish(stub, stream_name, b"written again")
        assert (await sub.next()).value == b"written again"
