"""The peer of ``benchmarks.liftbridge_api``: a servicer of the same ``proto.API`` that does nothing, on stock
``grpc.aio`` with uvloop, run as its own process (``python -m benchmarks._bare_liftbridge --port N --stream S``).

It stores nothing and reads nothing. ``Subscribe`` sends the handshake, then the same pre-built ``Message`` (a value
of ``--value-bytes``) with rising offsets until the client cancels. ``PublishAsync`` answers every request with an
``Ack`` carrying its correlation id, in order. ``FetchMetadata`` names this process as the leader of every stream
asked for (``--stream`` when none is), so a Liftbridge client written by others (gufo-liftbridge) finds it.
What it costs per message is the serving stack's own floor: protobuf, HTTP/2 and the event loop.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
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
        self._value = b"v" * value_bytes

    async def FetchMetadata(self, request: Any, context: Any) -> Any:
        response = api_pb2.FetchMetadataResponse(brokers=[self._broker])
        for name in list(request.streams) or [self._stream]:
            meta = response.streamMetadata.add(name=name, subject=name)
            meta.partitions[0].CopyFrom(api_pb2.PartitionMetadata(id=0, leader=BROKER_ID, isr=[BROKER_ID]))
        return response

    async def CreateStream(self, request: Any, context: Any) -> Any:
        return api_pb2.CreateStreamResponse()

    async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield api_pb2.Message()  # the handshake
        offset = 0
        now = time.time_ns()
        while True:
            yield api_pb2.Message(
                offset=offset,
                value=self._value,
                timestamp=now,
                stream=request.stream,
                partition=request.partition,
                subject=request.stream,
            )
            offset += 1

    async def PublishAsync(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        offset = 0
        async for request in request_iterator:
            now = time.time_ns()
            yield api_pb2.PublishResponse(
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
            offset += 1


async def serve(host: str, port: int, stream: str, value_bytes: int) -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_APIServicer_to_server(BareService(host, port, stream, value_bytes), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"cannot listen on {host}:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.stream, args.value_bytes))


if __name__ == "__main__":
    main()
