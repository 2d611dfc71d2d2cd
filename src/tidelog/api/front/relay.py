"""A front hands a call to the broker's gRPC service unparsed: requests and responses as bytes, the caller's
metadata and deadline with it, the broker's status and details back as they were.

Used for every ``proto.API``, ``tidelog.v1.Appender`` and ``tidelog.v1.Admin`` method but ``PublishAsync`` (which
the front batches, :mod:`tidelog.api.front.publish`): metadata and stream administration, cursors, consumer
groups, ``Publish``, ``Subscribe`` (its handshake and every message as the broker sends them), transactional
appends and the cluster reshaping calls. Whatever the
broker answers is what the caller gets, errors included, so these calls behave exactly as on the broker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from tidelog.protocol._gen import api_pb2
from tidelog.protocol._gen.tidelog.v1 import admin_pb2, append_pb2

_HOP_BY_HOP = ("user-agent", "grpc-", ":")
"""Metadata the channel to the broker sets itself: not copied from the caller's call."""


def _metadata(context: Any) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(
        (key, value) for key, value in (context.invocation_metadata() or ()) if not key.startswith(_HOP_BY_HOP)
    )


async def _abort(context: Any, error: grpc.aio.AioRpcError) -> None:
    await context.abort(error.code(), error.details() or "")


def _unary_unary(channel: grpc.aio.Channel, path: str) -> Callable[[bytes, Any], Any]:
    call = channel.unary_unary(path)

    async def relay(request: bytes, context: Any) -> bytes:
        try:
            response: bytes = await call(request, timeout=context.time_remaining(), metadata=_metadata(context))
        except grpc.aio.AioRpcError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable: abort raises") from exc
        return response

    return relay


def _unary_stream(channel: grpc.aio.Channel, path: str) -> Callable[[bytes, Any], AsyncIterator[bytes]]:
    call = channel.unary_stream(path)

    async def relay(request: bytes, context: Any) -> AsyncIterator[bytes]:
        answers = call(request, timeout=context.time_remaining(), metadata=_metadata(context))
        try:
            async for response in answers:
                yield response
        except grpc.aio.AioRpcError as exc:
            await _abort(context, exc)
        finally:
            answers.cancel()  # the caller went away: so does the broker's call

    return relay


def _stream_unary(channel: grpc.aio.Channel, path: str) -> Callable[[AsyncIterator[bytes], Any], Any]:
    call = channel.stream_unary(path)

    async def relay(requests: AsyncIterator[bytes], context: Any) -> bytes:
        try:
            response: bytes = await call(requests, timeout=context.time_remaining(), metadata=_metadata(context))
        except grpc.aio.AioRpcError as exc:
            await _abort(context, exc)
            raise AssertionError("unreachable: abort raises") from exc
        return response

    return relay


def _stream_stream(channel: grpc.aio.Channel, path: str) -> Callable[[AsyncIterator[bytes], Any], Any]:
    call = channel.stream_stream(path)

    async def relay(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        answers = call(requests, timeout=context.time_remaining(), metadata=_metadata(context))
        try:
            async for response in answers:
                yield response
        except grpc.aio.AioRpcError as exc:
            await _abort(context, exc)
        finally:
            answers.cancel()

    return relay


def relayed_service(
    channel: grpc.aio.Channel, service: Any, own: dict[str, grpc.RpcMethodHandler]
) -> grpc.GenericRpcHandler:
    """Every method of ``service`` (a protobuf service descriptor) relayed to the broker over ``channel``, but
    those in ``own`` (by method name), which the front serves itself."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        if method.name in own:
            handlers[method.name] = own[method.name]
            continue
        path = f"/{service.full_name}/{method.name}"
        if method.client_streaming and method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(_stream_stream(channel, path))
        elif method.client_streaming:
            handlers[method.name] = grpc.stream_unary_rpc_method_handler(_stream_unary(channel, path))
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(_unary_stream(channel, path))
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(_unary_unary(channel, path))
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


API_SERVICE = api_pb2.DESCRIPTOR.services_by_name["API"]
APPENDER_SERVICE = append_pb2.DESCRIPTOR.services_by_name["Appender"]
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
