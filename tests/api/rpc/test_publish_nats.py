"""API publishes are NATS messages (issue 18, item 7): a gRPC ``Publish``/``PublishAsync`` reaches every stream bound
to the subject and every plain NATS subscriber, and its target stores it exactly once.

How each test knows it waited long enough, with no timed wait: the broker publishes a message's copy before it
answers, and the test publishes a plain ``end`` message after the answer. The other stream bound to the subject
stores the copies and ``end`` in the order the one NATS server handled them; once it holds ``end``, so did the
target's ingest see every copy before ``end``, and a copy it failed to leave out would be stored before ``end``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.broker.conftest import broker, broker_settings, nc, stream_name, stub
from tests.broker.helpers import (
    Stub,
    bounded,
    create_stream,
    inbox,
    partition_metadata,
    publish,
    read_until_stop,
    receive,
    subscription,
    values,
)
from tests.helpers import BOUND
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, parse_envelope
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "nc", "stream_name", "stub"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


def message_of(data: bytes) -> api_pb2.Message:
    """What a plain NATS subscriber receives from an API publish: Liftbridge's envelope of the message."""
    env = parse_envelope(data)
    assert env is not None and env.msg_type is MessageType.PUBLISH, data[:40]
    return api_pb2.Message.FromString(bytes(env.payload))


async def through_end(stub: Stub, stream: str) -> list[api_pb2.Message]:
    """Everything ``stream`` holds up to and including its first ``end`` (waiting for it at the tail). Not
    ``read_until_stop``: the target's own ingest may commit ``end`` after the other stream did, and a read that
    stops at the high watermark of that moment would miss it."""
    held: list[api_pb2.Message] = []
    async with subscription(stub, stream, startPosition=api_pb2.EARLIEST) as tail:
        for _ in range(10_000):
            held.append(await tail.next())
            if held[-1].value == b"end":
                return held
    raise AssertionError(f"{stream} holds no end in its first 10,000 messages")


async def stored_once(stub: Stub, nc: Any, target: str, other: str, expected: list[bytes]) -> None:
    """``end`` after ``expected``; the other stream holds all of them; the target holds each exactly once."""
    await nc.publish(target, b"end")
    everything = [*expected, b"end"]
    assert sorted(values(await receive(stub, other, len(everything)))) == sorted(everything)
    held = await through_end(stub, target)
    assert sorted(values(held)) == sorted(everything)  # every offset counted: nothing twice
    assert [m.offset for m in held] == list(range(len(everything)))


async def test_publish_reaches_subscribers_and_other_streams(stub: Stub, nc: Any, stream_name: str) -> None:
    other = f"{stream_name}-other"
    await create_stream(stub, stream_name)
    await create_stream(stub, other, subject=stream_name)
    async with inbox(nc, stream_name) as seen:
        for i in range(3):
            response = await publish(stub, stream_name, f"v{i}".encode(), key=b"k", headers={"h": b"x"})
            assert response.ack.offset == i
        copies = [message_of(await bounded(seen.get())) for _ in range(3)]
    assert [c.value for c in copies] == [b"v0", b"v1", b"v2"]
    assert {(c.key, c.headers["h"], c.ackInbox) for c in copies} == {(b"k", b"x", "")}  # no ack asked of others
    await stored_once(stub, nc, stream_name, other, [b"v0", b"v1", b"v2"])
    kept = await receive(stub, other, 1)
    assert (kept[0].key, kept[0].headers["h"]) == (b"k", b"x")  # the other stream keeps key and headers


async def test_publish_async_stores_each_once(stub: Stub, nc: Any, stream_name: str) -> None:
    other = f"{stream_name}-other"
    await create_stream(stub, stream_name)
    await create_stream(stub, other, subject=stream_name)
    sent = [f"m{i}".encode() for i in range(50)]

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i, value in enumerate(sent):
            yield api_pb2.PublishRequest(stream=stream_name, value=value, correlationId=str(i))

    call = stub.PublishAsync(requests())
    answered = 0
    async for response in call:
        assert not response.HasField("asyncError"), response
        answered += 1
        if answered == len(sent):
            break
    call.cancel()
    await stored_once(stub, nc, stream_name, other, sent)


async def test_acks_all_still_means_committed(stub: Stub, nc: Any, stream_name: str) -> None:
    other = f"{stream_name}-other"
    await create_stream(stub, stream_name)
    await create_stream(stub, other, subject=stream_name)
    response = await publish(stub, stream_name, b"all", ackPolicy=api_pb2.AckPolicy.ALL)
    assert response.ack.offset == 0 and response.ack.commitTimestamp > 0
    assert (await partition_metadata(stub, stream_name)).highWatermark >= response.ack.offset
    await stored_once(stub, nc, stream_name, other, [b"all"])


async def test_a_queue_group_stores_a_publish_once(stub: Stub, nc: Any, stream_name: str) -> None:
    """Two streams of one group on one subject: NATS hands the copy to one of them, which leaves it out."""
    other = f"{stream_name}-other"
    watcher = f"{stream_name}-watcher"
    await create_stream(stub, stream_name, group="g")
    await create_stream(stub, other, subject=stream_name, group="g")
    await create_stream(stub, watcher, subject=stream_name)
    for i in range(5):
        await publish(stub, stream_name, f"g{i}".encode())
    await nc.publish(stream_name, b"end")
    await receive(stub, watcher, 6)  # the copies and end went through NATS
    # The group member NATS gave ``end`` to may commit it a little after the watcher did: read until it has.
    deadline = asyncio.get_running_loop().time() + BOUND
    while True:
        in_group = values(await read_until_stop(stub, stream_name)) + values(await read_until_stop(stub, other))
        if b"end" in in_group or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert sorted(in_group) == sorted([f"g{i}".encode() for i in range(5)] + [b"end"])


async def test_a_plain_message_claiming_another_stream_is_stored(stub: Stub, nc: Any, stream_name: str) -> None:
    """The header is compared exactly: it names the target stream and partition, not merely any stream."""
    await create_stream(stub, stream_name)
    await nc.publish(stream_name, b"claims other", headers={"Tidelog-Stored-In": f"{stream_name}-x/0"})
    await nc.publish(stream_name, b"claims partition 1", headers={"Tidelog-Stored-In": f"{stream_name}/1"})
    await nc.publish(stream_name, b"end")
    assert values(await receive(stub, stream_name, 3)) == [b"claims other", b"claims partition 1", b"end"]


GUFO = """
import asyncio, sys
from gufo.liftbridge.client import LiftbridgeClient

async def main(address, stream):
    async with LiftbridgeClient([address]) as client:
        for value in (b"gufo-1", b"gufo-2"):
            await client.publish(value, stream=stream, partition=0)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("gufo") is None or importlib.util.find_spec("gufo.liftbridge") is None,
    reason="gufo-liftbridge is not installed (the dev extra)",
)
async def test_gufo_liftbridge_publishes_reach_nats(broker: Broker, stub: Stub, nc: Any, stream_name: str) -> None:
    """A Liftbridge client written by others (in a process of its own: its protobuf descriptors clash with ours)."""
    assert broker.grpc is not None
    other = f"{stream_name}-other"
    await create_stream(stub, stream_name)
    await create_stream(stub, other, subject=stream_name)
    async with inbox(nc, stream_name) as seen:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", GUFO, f"127.0.0.1:{broker.grpc.port}", stream_name, stderr=asyncio.subprocess.PIPE
        )
        try:
            _, err = await asyncio.wait_for(process.communicate(), BOUND)
        except TimeoutError:
            process.kill()  # by its PID
            await process.wait()
            raise AssertionError("the gufo-liftbridge client did not finish in time") from None
        assert process.returncode == 0, err.decode(errors="replace")[-2000:]
        got = [message_of(await bounded(seen.get())).value for _ in range(2)]
    assert got == [b"gufo-1", b"gufo-2"]
    await stored_once(stub, nc, stream_name, other, [b"gufo-1", b"gufo-2"])
