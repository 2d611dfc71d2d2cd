"""What tests against a running broker do again and again: create streams, publish, read back, expect errors.

Every wait is bounded by :data:`BOUND`, so a broker that never answers fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc

from tidelog.protocol._gen import api_pb2, api_pb2_grpc

T = TypeVar("T")

BOUND = 20.0
"""Upper bound on any single wait, generous for a loaded two-core CI machine."""

Stub = api_pb2_grpc.APIStub


async def bounded(awaitable: Awaitable[T], bound: float = BOUND) -> T:
    return await asyncio.wait_for(awaitable, bound)


async def rpc_error(awaitable: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The gRPC error the call ends with (failing the test if it succeeds)."""
    try:
        result = await bounded(awaitable)
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError(f"expected a gRPC error, got {result!r}")


async def expect_code(code: grpc.StatusCode, awaitable: Awaitable[Any]) -> str:
    """Assert the call fails with ``code``; return the error's details."""
    exc = await rpc_error(awaitable)
    assert exc.code() == code, f"expected {code.name}, got {exc.code().name}: {exc.details()}"
    return exc.details() or ""


async def create_stream(stub: Stub, name: str, subject: str | None = None, **fields: Any) -> None:
    await bounded(stub.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=subject or name, **fields)))


async def publish(stub: Stub, stream: str, value: bytes, **fields: Any) -> api_pb2.PublishResponse:
    response: api_pb2.PublishResponse = await bounded(
        stub.Publish(api_pb2.PublishRequest(stream=stream, value=value, **fields))
    )
    return response


async def partition_metadata(stub: Stub, stream: str, partition: int = 0) -> api_pb2.PartitionMetadata:
    response = await bounded(
        stub.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition))
    )
    metadata: api_pb2.PartitionMetadata = response.metadata
    return metadata


async def read_until_stop(stub: Stub, stream: str, partition: int = 0, **fields: Any) -> list[api_pb2.Message]:
    """Subscribe (default: from EARLIEST to STOP_LATEST) and return what arrives before the stop.

    Checks the subscription the way a Liftbridge client relies on it: the empty handshake message first, and
    the end signalled by ``RESOURCE_EXHAUSTED``.
    """
    fields.setdefault("startPosition", api_pb2.EARLIEST)
    fields.setdefault("stopPosition", api_pb2.STOP_LATEST)
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream=stream, partition=partition, **fields))
    messages: list[api_pb2.Message] = []

    async def read() -> None:
        assert await call.read() == api_pb2.Message(), "the first message must be the empty handshake"
        while True:
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                return
            assert message is not grpc.aio.EOF, "the subscription ended without RESOURCE_EXHAUSTED"
            messages.append(message)

    try:
        await bounded(read())
    finally:
        call.cancel()
    return messages


async def subscribed(nc: Any) -> None:
    """Return once the NATS server has processed every subscription ``nc`` made so far.

    One ``flush()`` is not enough with nats-py: its PING goes straight to the socket while a SUB may still wait
    in the client's buffer. After the first round trip the SUB has been written; the second PING follows it.
    """
    await bounded(nc.flush())
    await bounded(nc.flush())


def values(messages: list[api_pb2.Message]) -> list[bytes]:
    return [m.value for m in messages]


def offsets(messages: list[api_pb2.Message]) -> list[int]:
    return [m.offset for m in messages]


class Subscription:
    """An open subscription, read one message at a time (for waiting at the tail)."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def next(self) -> api_pb2.Message:
        message = await bounded(self._call.read())
        assert message is not grpc.aio.EOF, "the subscription ended"
        assert isinstance(message, api_pb2.Message)
        return message

    async def take(self, count: int) -> list[api_pb2.Message]:
        return [await self.next() for _ in range(count)]


@asynccontextmanager
async def subscription(stub: Stub, stream: str, partition: int = 0, **fields: Any) -> AsyncIterator[Subscription]:
    """Subscribe, check the handshake, and cancel the call on the way out."""
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream=stream, partition=partition, **fields))
    try:
        assert await bounded(call.read()) == api_pb2.Message(), "the first message must be the empty handshake"
        yield Subscription(call)
    finally:
        call.cancel()
