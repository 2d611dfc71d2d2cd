"""A running broker applies a stream's retention by itself, in the background."""

from __future__ import annotations

from typing import Any

import pytest

from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.server import Broker

from .helpers import bounded, create_stream, read_until_stop

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"cleaner_interval_ms": 100, "segment_max_bytes": 16 * 1024, "max_message_bytes": 4096}


async def test_retention_by_messages_runs_without_being_asked(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str
) -> None:
    await create_stream(stub, stream_name, retentionMaxMessages=api_pb2.NullableInt64(value=50))
    request = api_pb2.PublishRequest(stream=stream_name, value=b"x" * 512, ackPolicy=api_pb2.ALL)
    for _ in range(400):
        await stub.Publish(request)
    assert broker.manager is not None
    partition = broker.manager.leader_of(stream_name, 0)

    assert broker.cleaner is not None
    await bounded(broker.cleaner.wait_for_passes(2))  # one pass may have started before the last publish
    assert 50 <= 400 - partition.log_start < 400  # kept at least the limit, dropped whole old segments
    messages = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    assert [m.offset for m in messages] == list(range(partition.log_start, 400))
