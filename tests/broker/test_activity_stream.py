"""The activity stream ``__activity``: one ``ActivityStreamEvent`` per committed metadata change, in commit order,
read through gRPC ``Subscribe`` and through the native consumer (and ``tidelog activity``'s decoding)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.broker.conftest import broker_config
from tests.broker.helpers import bounded, create_stream, publish, read_until_stop, until
from tests.helpers import BOUND
from tidelog.client import Consumer
from tidelog.metadata.activity import ACTIVITY_STREAM, describe, revision_of
from tidelog.protocol._gen import api_pb2 as pb
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.server import Broker

pytestmark = pytest.mark.slow

EXPECTED = [
    ("CREATE_STREAM", "act", "partitions 0"),
    ("PAUSE_STREAM", "act", "partitions 0"),
    ("RESUME_STREAM", "act", "partitions 0"),
    ("JOIN_CONSUMER_GROUP", "g", "consumer c1, streams act"),
    ("LEAVE_CONSUMER_GROUP", "g", "consumer c1"),
    ("SET_STREAM_READONLY", "act", "partitions 0, readonly true"),
    ("DELETE_STREAM", "act", ""),
]


def _mine(events: list[pb.ActivityStreamEvent]) -> list[tuple[str, str, str]]:
    return [describe(e) for e in events if describe(e)[1] in ("act", "g")]


async def _make_changes(stub: Any) -> None:
    await create_stream(stub, "act")
    await bounded(stub.PauseStream(pb.PauseStreamRequest(name="act")))
    await publish(stub, "act", b"wakes it")
    await bounded(stub.JoinConsumerGroup(pb.JoinConsumerGroupRequest(groupId="g", consumerId="c1", streams=["act"])))
    await bounded(stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(groupId="g", consumerId="c1")))
    await bounded(stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="act", readonly=True)))
    await bounded(stub.DeleteStream(pb.DeleteStreamRequest(name="act")))


async def test_changes_arrive_in_order_through_grpc_and_the_native_consumer(tmp_path: Path) -> None:
    import grpc

    broker = Broker(broker_config(tmp_path / "b", id="solo"))
    await broker.start()
    try:
        assert broker.grpc is not None and broker.wire is not None and broker.mirror is not None
        await broker.mirror.wait_for(lambda s: s.stream(ACTIVITY_STREAM) is not None, BOUND)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await _make_changes(stub)
            seen: list[pb.ActivityStreamEvent] = []

            async def all_published() -> bool:
                messages = await read_until_stop(stub, ACTIVITY_STREAM)
                seen[:] = [pb.ActivityStreamEvent.FromString(m.value) for m in messages]
                return len(_mine(seen)) >= len(EXPECTED)

            await until(all_published, "the activity events of every change")
        assert _mine(seen) == EXPECTED
        ids = [e.id for e in seen]
        assert ids == sorted(set(ids)), "ids follow commit order and never repeat"
        assert describe(seen[0])[:2] == ("CREATE_STREAM", ACTIVITY_STREAM), "the stream's own creation comes first"

        native: list[pb.ActivityStreamEvent] = []
        async with Consumer([f"127.0.0.1:{broker.wire.port}"], ACTIVITY_STREAM, stop_at_end=True) as consumer:
            async for record in consumer:
                native.append(pb.ActivityStreamEvent.FromString(record.value or b""))
        assert [e.id for e in native] == ids
        assert all(revision_of(i) > 0 for i in ids)
    finally:
        await broker.stop()


async def test_disabled_means_no_stream(tmp_path: Path) -> None:
    broker = Broker(broker_config(tmp_path / "b", id="quiet", activity_stream_enabled=False))
    await broker.start()
    try:
        assert broker.mirror is not None and broker.activity is None
        await broker.mirror.wait_for(lambda s: s.stream("__cursors") is not None, BOUND)
        assert broker.mirror.snapshot.stream(ACTIVITY_STREAM) is None
    finally:
        await broker.stop()
