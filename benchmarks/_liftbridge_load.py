"""One load-generating client of ``benchmarks.liftbridge_api``, run as its own process so that several of them
load one server without sharing a GIL: ``python -m benchmarks._liftbridge_load KIND RPC ADDRESS STREAM COUNT``.

The conversation with the parent is three lines: this process prints ``ready`` once connected (a tailing
subscription: once its handshake arrived), waits for a line on stdin (the go), runs, and prints one JSON object
``{"count", "errors", "started", "ended"}`` (``time.monotonic()`` seconds, one clock for every process).

Kinds:

- ``raw``: ``grpc.aio`` on uvloop with the bytes passed through unparsed (no serializer on either side), the
  requests built before the go: the cheapest Python gRPC client, so the server is what gets measured.
- ``gufo``: ``gufo-liftbridge``'s ``LiftbridgeClient`` (``publish_bulk``, ``subscribe``), a Liftbridge client
  written by others. It brings its own generated ``api.proto``, which cannot share a protobuf descriptor pool with
  tidelog's: this module imports neither at the top.

RPCs: ``publish`` (``PublishAsync``, ``COUNT`` requests, at most ``--window`` without their ack), ``catchup``
(``Subscribe`` from the earliest offset, ``COUNT`` messages) and ``tail`` (``Subscribe`` to new messages only,
``COUNT`` of them, published by the parent after the go).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

SUBSCRIBE = "/proto.API/Subscribe"
PUBLISH_ASYNC = "/proto.API/PublishAsync"
ASYNC_ERROR_TAG = 0x12  # PublishResponse field 2 (asyncError), length-delimited: a response that opens with it
EARLIEST, NEW_ONLY = 2, 0  # StartPosition


async def go_signal() -> None:
    """Block (off the loop) until the parent writes the go line."""
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def announce(what: str) -> None:
    print(what, flush=True)


async def raw(
    rpc: str, address: str, stream: str, count: int, value: bytes, ack_policy: int, window: int
) -> dict[str, Any]:
    from tidelog.protocol._gen import api_pb2  # only to build the requests, before the go

    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        if rpc == "publish":
            requests = [
                api_pb2.PublishRequest(
                    value=value,
                    stream=stream,
                    partition=0,
                    correlationId=str(i),
                    ackPolicy=ack_policy,  # type: ignore[arg-type]
                ).SerializeToString()
                for i in range(count)
            ]
            announce("ready")
            await go_signal()
            return await _raw_publish(channel, requests, window)
        position = EARLIEST if rpc == "catchup" else NEW_ONLY
        subscription = api_pb2.SubscribeRequest(stream=stream, partition=0)
        subscription.startPosition = position  # type: ignore[assignment]
        request = subscription.SerializeToString()
        subscribe = channel.unary_stream(SUBSCRIBE)
        if rpc == "tail":
            call = subscribe(request)
            await call.read()  # the handshake: subscribed
            announce("ready")
            await go_signal()
        else:
            announce("ready")
            await go_signal()
            call = subscribe(request)
            await call.read()
        started = time.monotonic()
        got = 0
        while got < count:
            message = await call.read()
            if message is grpc.aio.EOF:
                break
            got += 1
        ended = time.monotonic()
        call.cancel()
        return {"count": got, "errors": count - got, "started": started, "ended": ended}


async def _raw_publish(channel: grpc.aio.Channel, requests: list[bytes], window: int) -> dict[str, Any]:
    room = asyncio.Semaphore(window)

    async def send() -> AsyncIterator[bytes]:
        for request in requests:
            await room.acquire()
            yield request

    started = time.monotonic()
    call = channel.stream_stream(PUBLISH_ASYNC)(send())
    got = errors = 0
    async for response in call:
        got += 1
        if response[:1] == bytes((ASYNC_ERROR_TAG,)):
            errors += 1
        room.release()
        if got == len(requests):
            break
    ended = time.monotonic()
    call.cancel()
    return {"count": got - errors, "errors": len(requests) - got + errors, "started": started, "ended": ended}


async def gufo(rpc: str, address: str, stream: str, count: int, value: bytes, ack_policy: int) -> dict[str, Any]:
    from gufo.liftbridge.client import LiftbridgeClient
    from gufo.liftbridge.types import AckPolicy, StartPosition

    # gufo cancels a PublishAsync call whose acks lag its last request by publish_async_ack_timeout (10 s by
    # default): with every request sent at once, a server slower than the client would end the measurement there.
    async with LiftbridgeClient([address], publish_async_ack_timeout=600.0) as client:
        await client.get_metadata(stream, wait_for_stream=True)
        if rpc == "publish":
            policy = AckPolicy(ack_policy)
            requests = [
                client.get_publish_request(value, stream=stream, partition=0, ack_policy=policy, correlation_id=str(i))
                for i in range(count)
            ]
            announce("ready")
            await go_signal()
            started = time.monotonic()
            got = 0
            async for _ack in client.publish_bulk(requests, wait=True):
                got += 1
                if got == count:  # timed to the last ack: publish_bulk may hold the call open a while after it
                    break
            return {"count": got, "errors": count - got, "started": started, "ended": time.monotonic()}
        announce("ready")
        await go_signal()
        started = time.monotonic()
        got = 0
        position = StartPosition.EARLIEST if rpc == "catchup" else StartPosition.NEW_ONLY
        async for _message in client.subscribe(stream, partition=0, start_position=position):
            got += 1
            if got >= count:
                break
        return {"count": got, "errors": count - got, "started": started, "ended": time.monotonic()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("raw", "gufo"))
    parser.add_argument("rpc", choices=("publish", "catchup", "tail"))
    parser.add_argument("address")
    parser.add_argument("stream")
    parser.add_argument("count", type=int)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--ack-policy", type=int, default=0, help="AckPolicy number: 0 LEADER, 1 ALL")
    parser.add_argument("--window", type=int, default=1024, help="raw publish: acks outstanding at most")
    args = parser.parse_args()
    value = b"v" * args.value_bytes
    if args.kind == "raw":
        run = raw(args.rpc, args.address, args.stream, args.count, value, args.ack_policy, args.window)
    else:
        run = gufo(args.rpc, args.address, args.stream, args.count, value, args.ack_policy)
    print(json.dumps(uvloop.run(run)), flush=True)


if __name__ == "__main__":
    main()
