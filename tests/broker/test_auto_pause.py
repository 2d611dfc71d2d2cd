"""Auto-pause on one real broker: the broker default (``auto_pause_time_ms``), a stream's own ``autoPauseTime``
(0: never) and ``autoPauseDisableIfSubscribers``, and ``__cursors``, which pauses when idle and resumes for the
next cursor request (Liftbridge's defaults, shortened here to a second). Nothing here measures time: each test
waits (bounded) for a pause, and compares partitions the same sweep judged together."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.broker.helpers import Stub, bounded, create_stream, open_files_under, publish, subscription
from tests.helpers import BOUND
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
