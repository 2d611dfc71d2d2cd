"""The peer of ``benchmarks.liftbridge_api``: a servicer of the same ``proto.API`` that does nothing, on stock
``grpc.aio`` with uvloop, run as its own process (``python -m benchmarks._bare_liftbridge --port N --stream S``).
``--stack`` serves it on another stack instead, for the comparison of serving stacks: ``aio-asyncio``
(``grpc.aio`` on the default event loop), ``sync`` (``grpc.server`` on a thread pool, one thread per call) or
``grpclib`` (asyncio gRPC on the pure-Python ``h2`` HTTP/2 library, no threads, on uvloop; the ``dev`` extra);
``--reuseport`` lets several such processes share the port (SO_REUSEPORT: the kernel spreads connections).

It stores nothing and reads nothing. ``Subscribe`` sends the handshake, then the same pre-built ``Message`` (a value
of ``--value-bytes``) with rising offsets until the client cancels. ``PublishAsync`` answers every request with an
``Ack`` carrying its correlation id, in order. ``FetchMetadata`` names this process as the leader of every stream
asked for (``--stream`` when none is), so a Liftbridge client written by others (gufo-liftbridge) finds it.
What it costs per message is the serving stack's own floor: protobuf, HTTP/2 and the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any

import grpc
import uvloop

from tidelog.protocol._gen import api_pb2, api_pb2_grpc

BROKER_ID = "bare"


class BareService(api_pb2_grpc.APIServicer):  # type: ignore[misc]
    """``proto.API`` answering without doing any work."""

    def __init__(self, host: str, port: int, stream: str, value_bytes: int) -> None:
        self._broker = api_pb2.Broker(id=BROKER_ID, host=host, port=port)
        self._stream = stream
        self.value = b"v" * value_bytes

    async def FetchMetadata(self, request: Any, context: Any) -> Any:
        return self.metadata(request)

    def metadata(self, request: Any) -> Any:
        response = api_pb2.FetchMetadataResponse(brokers=[self._broker])
        for name in list(request.streams) or [self._stream]:
            meta = response.streamMetadata.add(name=name, subject=name)
            meta.partitions[0].CopyFrom(api_pb2.PartitionMetadata(id=0, leader=BROKER_ID, isr=[BROKER_ID]))
        return response

    async def CreateStream(self, request: Any, context: Any) -> Any:
        return api_pb2.CreateStreamResponse()

    async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for message in messages(request, self.value):
            yield message

    async def PublishAsync(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        offset = 0
        async for request in request_iterator:
            yield response_to(request, offset)
            offset += 1


class SyncBareService(BareService):
    """The same on the sync ``grpc.server``: each call runs on a thread of the pool."""

    def FetchMetadata(self, request: Any, context: Any) -> Any:
        return self.metadata(request)

    def CreateStream(self, request: Any, context: Any) -> Any:
        return api_pb2.CreateStreamResponse()

    def Subscribe(self, request: Any, context: Any) -> Iterator[Any]:  # type: ignore[override]
        yield from messages(request, self.value)

    def PublishAsync(self, request_iterator: Any, context: Any) -> Iterator[Any]:  # type: ignore[override]
        for offset, request in enumerate(request_iterator):
            yield response_to(request, offset)


def messages(request: Any, value: bytes) -> Iterator[Any]:
    """The handshake, then the same message with rising offsets, for ever."""
    yield api_pb2.Message()
    offset = 0
    now = time.time_ns()
    while True:
        yield api_pb2.Message(
            offset=offset,
            value=value,
            timestamp=now,
            stream=request.stream,
            partition=request.partition,
            subject=request.stream,
        )
        offset += 1


def response_to(request: Any, offset: int) -> Any:
    now = time.time_ns()
    return api_pb2.PublishResponse(
        correlationId=request.correlationId,
        ack=api_pb2.Ack(
            stream=request.stream,
            partitionSubject=request.stream,
            msgSubject=request.stream,
            offset=offset,
            correlationId=request.correlationId,
            ackPolicy=request.ackPolicy,
            receptionTimestamp=now,
            commitTimestamp=now,
        ),
    )


STACKS = ("aio-uvloop", "aio-asyncio", "sync", "grpclib")
SERVING = "serving"
"""The line printed once the port is served (the readiness of a process sharing it with others)."""


async def serve(host: str, port: int, stream: str, value_bytes: int, reuseport: bool) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(reuseport))])
    api_pb2_grpc.add_APIServicer_to_server(BareService(host, port, stream, value_bytes), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"cannot listen on {host}:{port}")
    await server.start()
    print(SERVING, flush=True)
    await server.wait_for_termination()


class GrpclibBare:
    """The same on ``grpclib``: a handler per method, each given the call's stream."""

    def __init__(self, service: BareService) -> None:
        self._service = service

    def __mapping__(self) -> dict[str, Any]:
        from grpclib.const import Cardinality, Handler

        return {
            "/proto.API/FetchMetadata": Handler(
                self.fetch_metadata,
                Cardinality.UNARY_UNARY,
                api_pb2.FetchMetadataRequest,
                api_pb2.FetchMetadataResponse,
            ),
            "/proto.API/CreateStream": Handler(
                self.create_stream, Cardinality.UNARY_UNARY, api_pb2.CreateStreamRequest, api_pb2.CreateStreamResponse
            ),
            "/proto.API/Subscribe": Handler(
                self.subscribe, Cardinality.UNARY_STREAM, api_pb2.SubscribeRequest, api_pb2.Message
            ),
            "/proto.API/PublishAsync": Handler(
                self.publish_async, Cardinality.STREAM_STREAM, api_pb2.PublishRequest, api_pb2.PublishResponse
            ),
        }

    async def fetch_metadata(self, stream: Any) -> None:
        await stream.send_message(self._service.metadata(await stream.recv_message()))

    async def create_stream(self, stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(api_pb2.CreateStreamResponse())

    async def subscribe(self, stream: Any) -> None:
        request = await stream.recv_message()
        for message in messages(request, self._service.value):
            await stream.send_message(message)

    async def publish_async(self, stream: Any) -> None:
        offset = 0
        async for request in stream:
            await stream.send_message(response_to(request, offset))
            offset += 1


async def serve_grpclib(host: str, port: int, stream: str, value_bytes: int, reuseport: bool) -> None:
    from grpclib.server import Server

    server = Server([GrpclibBare(BareService(host, port, stream, value_bytes))])
    await server.start(host, port, reuse_port=reuseport)
    print(SERVING, flush=True)
    await server.wait_closed()


def serve_sync(host: str, port: int, stream: str, value_bytes: int, reuseport: bool) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=[("grpc.so_reuseport", int(reuseport))])
    api_pb2_grpc.add_APIServicer_to_server(SyncBareService(host, port, stream, value_bytes), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"cannot listen on {host}:{port}")
    server.start()
    print(SERVING, flush=True)
    server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--stack", choices=STACKS, default=STACKS[0])
    parser.add_argument("--reuseport", action="store_true", help="share the port with other processes")
    args = parser.parse_args()
    where = (args.host, args.port, args.stream, args.value_bytes, args.reuseport)
    if args.stack == "sync":
        serve_sync(*where)
    elif args.stack == "grpclib":
        uvloop.run(serve_grpclib(*where))
    elif args.stack == "aio-asyncio":
        asyncio.run(serve(*where))
    else:
        uvloop.run(serve(*where))


if __name__ == "__main__":
    main()
