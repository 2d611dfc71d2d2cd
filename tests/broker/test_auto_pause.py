"""Auto-pause on one real broker: the broker default (``auto_pause_time_ms``), a stream's own ``autoPauseTime``
(0: never) and ``autoPauseDisableIfSubscribers``, and ``__cursors``, which pauses when idle and resumes for the
next cursor request (Liftbridge's defaults, shortened here to a second). Nothing here measures time: each test
waits (bounded) for a pause, and compares partitions the same sweep judged together."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tests.broker.helpers import Stub, bounded, create_stream, open_files_under, publish, subscription
from tests.helpers import BOUND
from tidelog.metadata.activity import ACTIVITY_STREAM
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"auto_pause_time_ms": 1000, "cursors_stream_auto_pause_time_ms": 1000}


def paused(broker: Broker, stream: str, partition: int = 0) -> bool:
    assert broker.mirror is not None
    record = broker.mirror.snapshot.partition(stream, partition)
    return record is not None and record.paused


async def until_paused(broker: Broker, stream: str, partition: int = 0) -> None:
    assert broker.mirror is not None

    def done(snap: MetadataSnapshot) -> bool:
        record = snap.partition(stream, partition)
        return record is not None and record.paused

    await broker.mirror.wait_for(done, BOUND)


async def test_the_broker_default_pauses_an_idle_partition(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"then nothing")
    await until_paused(broker, stream_name)
    assert broker.manager is not None and broker.mirror is not None
    directory = broker.manager.path_of(broker.mirror.snapshot.streams[stream_name], 0)
    assert open_files_under(os.getpid(), directory) == 0

    assert (await publish(stub, stream_name, b"wakes it")).ack.offset == 1
    assert not paused(broker, stream_name)


async def test_a_stream_auto_pause_time_of_zero_never_pauses(broker: Broker, stub: Stub, stream_name: str) -> None:
    never = f"{stream_name}-never"
    await create_stream(stub, never, autoPauseTime=api_pb2.NullableInt64(value=0))
    await create_stream(stub, stream_name)  # created after: due no earlier than the other would be
    await until_paused(broker, stream_name)
    assert not paused(broker, never)
    assert broker.pauses is not None
    assert all(p.stream.name != never for p in broker.pauses.idle())


async def test_subscribers_keep_a_partition_from_pausing_when_asked(
    broker: Broker, stub: Stub, stream_name: str
) -> None:
    read = f"{stream_name}-read"
    keep = api_pb2.NullableBool(value=True)
    await create_stream(stub, read, autoPauseDisableIfSubscribers=keep)
    async with subscription(stub, read, startPosition=api_pb2.EARLIEST):
        await create_stream(stub, stream_name)  # the control: the same idle time, no subscriber
        await until_paused(broker, stream_name)
        assert not paused(broker, read)
    await until_paused(broker, read)  # once the subscriber left


async def test_cursors_pause_when_idle_and_the_next_request_resumes_them(
    broker: Broker, stub: Stub, stream_name: str
) -> None:
    assert broker.mirror is not None
    await create_stream(stub, stream_name)
    await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)
    request = api_pb2.SetCursorRequest(stream=stream_name, partition=0, cursorId="idle", offset=7)
    await bounded(stub.SetCursor(request))
    await until_paused(broker, CURSORS_STREAM)

    fetch = api_pb2.FetchCursorRequest(stream=stream_name, partition=0, cursorId="idle")
    assert (await bounded(stub.FetchCursor(fetch))).offset == 7  # resumed, and read again from the log
    assert not paused(broker, CURSORS_STREAM)


async def test_the_activity_stream_never_auto_pauses(broker: Broker) -> None:
    """The controller appends to ``__activity`` itself (no publish resumes it), so the broker default leaves it be:
    idle for longer than ``auto_pause_time_ms``, it is never due to pause."""
    assert broker.pauses is not None and broker.manager is not None
    activity = [p for p in broker.manager.partitions() if p.stream.name == ACTIVITY_STREAM]
    assert activity, "this broker leads __activity"
    partition = activity[0]

    def idle_ns() -> int:
        return partition.clock.now_ns() - max(partition.latest_received_ns, partition.led_since_ns)

    await asyncio.sleep(max(0.0, 1.5 - idle_ns() / 1e9))  # waiting out the 1 s default is what is tested
    assert idle_ns() >= 1_000_000_000, "nothing was appended to __activity meanwhile"
    assert all(p.stream.name != ACTIVITY_STREAM for p in broker.pauses.idle())
    assert not paused(broker, ACTIVITY_STREAM)
