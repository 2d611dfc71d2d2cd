"""The Liftbridge ``proto.API`` as a Liftbridge client sees it: every RPC through generated stubs, one real broker.

The broker (with its embedded nats-server and etcd) is shared by the module; every test works on streams named
after itself. Assertions follow ``liftbridge-api.md``: status codes, the subscription handshake and stop
signal, the -1 meaning of empty offsets, acks per policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import msgspec
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.broker.helpers import (
    Stub,
    bounded,
    create_stream,
    expect_code,
    offsets,
    partition_metadata,
    publish,
    read_until_stop,
    subscribed,
    subscription,
    values,
)
from tests.helpers import BOUND
from tidelog.metadata.records import BrokerRecord, Keys, encode
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, parse_envelope
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_MESSAGE = 64 * 1024
ACK_TIMEOUT = 2.0

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"max_message_bytes": MAX_MESSAGE, "default_ack_timeout_ms": int(ACK_TIMEOUT * 1000)}


async def fetch_metadata(stub: Stub, *streams: str) -> api_pb2.FetchMetadataResponse:
    response: api_pb2.FetchMetadataResponse = await bounded(
        stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=list(streams)))
    )
    return response


async def stream_metadata(stub: Stub, name: str) -> api_pb2.StreamMetadata:
    response = await fetch_metadata(stub, name)
    assert len(response.streamMetadata) == 1
    found: api_pb2.StreamMetadata = response.streamMetadata[0]
    return found


async def fill(stub: Stub, name: str, count: int, partition: int = 0) -> list[api_pb2.Message]:
    """Publish ``m0``..``m{count-1}`` one at a time and return them as a subscriber reads them."""
    for i in range(count):
        await publish(stub, name, b"m%d" % i, partition=partition)
    messages = await read_until_stop(stub, name, partition)
    assert values(messages) == [b"m%d" % i for i in range(count)]
    return messages


@contextlib.asynccontextmanager
async def ghost_broker(broker: Broker, name: str = "ghost") -> AsyncIterator[None]:
    """A registered broker with no process behind it: a live ISR member that never fetches. Without the
    registration the controller would take it out of the ISR at once, as it does with any dead follower."""
    assert broker.etcd is not None
    lease = await broker.etcd.lease(30)
    record = BrokerRecord(name, "127.0.0.1", 1, 1, time.time_ns())
    await broker.etcd.put(Keys().broker(name), encode(record), lease=lease)
    try:
        yield
    finally:
        await lease.revoke()


async def set_isr(broker: Broker, stream: str, isr: tuple[str, ...]) -> None:
    """Rewrite a partition's ISR in etcd, as the controller would, and wait until the broker acted on it."""
    assert broker.mirror is not None and broker.store is not None
    current = broker.mirror.snapshot.partition(stream, 0)
    assert current is not None
    wanted = msgspec.structs.replace(current, isr=isr)
    assert await broker.store.update_partition(current, wanted)
    await broker.mirror.wait_for(lambda snap: snap.partition(stream, 0) == wanted, BOUND)


# ---------------------------------------------------------------------------------------------- CreateStream


async def test_create_stream_with_partitions(stub: Stub, broker: Broker, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=3)

    stream = await stream_metadata(stub, stream_name)
    assert (stream.name, stream.subject, stream.error) == (stream_name, stream_name, api_pb2.StreamMetadata.OK)
    assert sorted(stream.partitions) == [0, 1, 2]
    for pid, partition in stream.partitions.items():
        assert partition.id == pid
        assert partition.leader == broker.id
        assert list(partition.replicas) == [broker.id] and list(partition.isr) == [broker.id]

    # Each partition is a log of its own ...
    for pid in range(3):
        response = await publish(stub, stream_name, b"to %d" % pid, partition=pid)
        assert response.ack.offset == 0
    for pid in range(3):
        assert values(await read_until_stop(stub, stream_name, pid)) == [b"to %d" % pid]

    # ... and partition i > 0 listens on NATS subject "<subject>.i".
    response = await bounded(
        stub.PublishToSubject(api_pb2.PublishToSubjectRequest(subject=f"{stream_name}.2", value=b"by subject"))
    )
    assert (response.ack.stream, response.ack.partitionSubject, response.ack.offset) == (
        stream_name,
        f"{stream_name}.2",
        1,
    )
    assert values(await read_until_stop(stub, stream_name, 2)) == [b"to 2", b"by subject"]


async def test_create_stream_without_partitions_has_one(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    assert sorted((await stream_metadata(stub, stream_name)).partitions) == [0]


async def test_create_stream_segment_override_is_applied(stub: Stub, broker: Broker, stream_name: str) -> None:
    assert broker.manager is not None
    small, default = f"{stream_name}-small", f"{stream_name}-default"
    await create_stream(stub, small, segmentMaxBytes=api_pb2.NullableInt64(value=2048))
    await create_stream(stub, default)
    for name in (small, default):
        for i in range(10):
            await publish(stub, name, bytes([i]) * 1000)

    small_log = broker.manager.leader_of(small, 0).log
    default_log = broker.manager.leader_of(default, 0).log
    assert len(small_log.segments) >= 5  # ~1 KB records, segments of at most 2 KB
    assert len(list(small_log.directory.glob("*.log"))) == len(small_log.segments)
    assert len(default_log.segments) == 1
    assert len(await read_until_stop(stub, small)) == 10  # reads cross the segment boundaries


@pytest.mark.parametrize(
    "override",
    [
        {"retentionMaxAge": api_pb2.NullableInt64(value=-1)},
        {"segmentMaxBytes": api_pb2.NullableInt64(value=10)},
        {"minIsr": api_pb2.NullableInt32(value=2)},  # above the replication factor of 1
    ],
    ids=["negative-duration", "tiny-segment", "min-isr-above-rf"],
)
async def test_create_stream_refuses_impossible_overrides(stub: Stub, stream_name: str, override: Any) -> None:
    await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, stream_name, **override))
    stream = await stream_metadata(stub, stream_name)
    assert stream.error == api_pb2.StreamMetadata.UNKNOWN_STREAM


async def test_create_stream_of_a_taken_name_is_already_exists_and_changes_nothing(
    stub: Stub, stream_name: str
) -> None:
    """Liftbridge answers ALREADY_EXISTS whenever the name is taken, even by the same stream (its clients map it
    to ErrStreamExists and go on); the stream and its records stay as they were."""
    await create_stream(stub, stream_name, partitions=2)
    created = (await stream_metadata(stub, stream_name)).creationTimestamp
    await publish(stub, stream_name, b"kept")

    await expect_code(Code.ALREADY_EXISTS, create_stream(stub, stream_name, partitions=2))

    again = await stream_metadata(stub, stream_name)
    assert again.creationTimestamp == created
    assert values(await read_until_stop(stub, stream_name)) == [b"kept"]


async def test_create_stream_refuses_a_taken_name_on_another_subject(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    details = await expect_code(Code.ALREADY_EXISTS, create_stream(stub, stream_name, subject=f"{stream_name}-other"))
    assert stream_name in details
    assert (await stream_metadata(stub, stream_name)).subject == stream_name


@pytest.mark.parametrize("name", ["", "has space", "a/b", "x" * 250, "star*", "gt>", "tab\tname"])
async def test_create_stream_refuses_bad_names(stub: Stub, name: str) -> None:
    await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, name, subject="bad.names"))


@pytest.mark.parametrize("subject", ["", "a b", "a..b", ".a", "a.", "a.>.b", "a.b*", "a.*b"])
async def test_create_stream_refuses_bad_subjects(stub: Stub, stream_name: str, subject: str) -> None:
    await expect_code(
        Code.INVALID_ARGUMENT, stub.CreateStream(api_pb2.CreateStreamRequest(name=stream_name, subject=subject))
    )
    assert (await stream_metadata(stub, stream_name)).error == api_pb2.StreamMetadata.UNKNOWN_STREAM


@pytest.mark.parametrize(
    ("subject", "partitions", "what"),
    [
        ("x" * 5000, 1, "the limit is 1024"),
        ("x" * 1022, 11, "partition 10 would listen on"),  # 'subject.10' is 1025 bytes
        ("wild.>", 2, "'>' before its last token"),  # partition 1 would listen on 'wild.>.1'
    ],
    ids=["too-long", "suffix-too-long", "gt-with-partitions"],
)
async def test_create_stream_refuses_subjects_its_partitions_cannot_subscribe_to(
    stub: Stub, stream_name: str, subject: str, partitions: int, what: str
) -> None:
    details = await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, stream_name, subject, partitions=partitions))
    assert what in details and len(details) < 400
    assert (await stream_metadata(stub, stream_name)).error == api_pb2.StreamMetadata.UNKNOWN_STREAM


async def test_a_subject_at_the_limit_is_subscribed_to(stub: Stub, nc: Any, stream_name: str) -> None:
    subject = "s" * 1021  # partition 1 listens on 's...s.1': 1023 bytes
    await create_stream(stub, stream_name, subject, partitions=2)
    await nc.publish(subject, b"zero")
    await nc.publish(f"{subject}.1", b"one")
    async with subscription(stub, stream_name, 0, startPosition=api_pb2.EARLIEST) as tail:
        assert (await tail.next()).value == b"zero"
    async with subscription(stub, stream_name, 1, startPosition=api_pb2.EARLIEST) as tail:
        assert (await tail.next()).value == b"one"


async def test_create_stream_refuses_a_group_nats_cannot_carry(stub: Stub, stream_name: str) -> None:
    for group in ("has space", "g" * 1025):
        details = await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, stream_name, group=group))
        assert "group" in details and len(details) < 400
    assert (await stream_metadata(stub, stream_name)).error == api_pb2.StreamMetadata.UNKNOWN_STREAM


async def test_errors_never_echo_a_huge_input_whole(stub: Stub) -> None:
    """A 10,000-character name is quoted in part: the error still fits gRPC's metadata and names the problem."""
    name = "n" * 10_000
    details = await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, name, subject="huge.names"))
    assert "invalid stream name" in details and "10000 characters" in details and len(details) < 400
    details = await expect_code(Code.NOT_FOUND, publish(stub, name, b"v"))  # echoed by a message not written for it
    assert "more bytes cut" in details and len(details.encode()) <= 1024


@pytest.mark.parametrize("partitions", [-1, 10_001])
async def test_create_stream_refuses_bad_partition_counts(stub: Stub, stream_name: str, partitions: int) -> None:
    await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, stream_name, partitions=partitions))
    assert (await stream_metadata(stub, stream_name)).error == api_pb2.StreamMetadata.UNKNOWN_STREAM


async def test_create_stream_replication_factor(stub: Stub, broker: Broker, stream_name: str) -> None:
    details = await expect_code(Code.INVALID_ARGUMENT, create_stream(stub, stream_name, replicationFactor=2))
    assert "replicationFactor" in details
    assert (await stream_metadata(stub, stream_name)).error == api_pb2.StreamMetadata.UNKNOWN_STREAM

    await create_stream(stub, stream_name, replicationFactor=-1)  # -1: every broker, here the one
    assert list((await stream_metadata(stub, stream_name)).partitions[0].replicas) == [broker.id]


# ---------------------------------------------------------------------------------------------- DeleteStream


async def test_delete_stream(stub: Stub, broker: Broker, stream_name: str) -> None:
    assert broker.manager is not None
    await create_stream(stub, stream_name, partitions=2)
    await publish(stub, stream_name, b"gone soon")
    directory = broker.manager.leader_of(stream_name, 0).log.directory
    assert directory.is_dir()

    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as tail:
        assert (await tail.next()).value == b"gone soon"
        await bounded(stub.DeleteStream(api_pb2.DeleteStreamRequest(name=stream_name)))
        # A subscriber waiting at the tail is not left hanging.
        with pytest.raises(grpc.aio.AioRpcError):
            await tail.next()

    assert (await stream_metadata(stub, stream_name)).error == api_pb2.StreamMetadata.UNKNOWN_STREAM
    await expect_code(Code.NOT_FOUND, publish(stub, stream_name, b"x"))
    await expect_code(Code.NOT_FOUND, partition_metadata(stub, stream_name))
    await expect_code(Code.NOT_FOUND, read_until_stop(stub, stream_name))
    await expect_code(Code.NOT_FOUND, stub.DeleteStream(api_pb2.DeleteStreamRequest(name=stream_name)))
    assert not directory.exists()

    # The name is free again, and the new stream starts empty.
    await create_stream(stub, stream_name)
    assert await read_until_stop(stub, stream_name) == []
    assert (await publish(stub, stream_name, b"new")).ack.offset == 0


# ---------------------------------------------------------------------------------------------- PauseStream


async def test_pause_stream_then_a_publish_resumes_it(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    await publish(stub, stream_name, b"before")

    await bounded(stub.PauseStream(api_pb2.PauseStreamRequest(name=stream_name)))
    for pid in (0, 1):
        meta = await partition_metadata(stub, stream_name, pid)
        assert meta.paused
        assert meta.pauseTimestamps.firstTimestamp > 0

    await publish(stub, stream_name, b"after")

    assert not (await partition_metadata(stub, stream_name, 0)).paused
    assert (await partition_metadata(stub, stream_name, 1)).paused  # only the partition written to resumes
    assert values(await read_until_stop(stub, stream_name)) == [b"before", b"after"]


async def test_pause_stream_resume_all(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=3)
    await bounded(stub.PauseStream(api_pb2.PauseStreamRequest(name=stream_name, resumeAll=True)))
    assert all([(await partition_metadata(stub, stream_name, pid)).paused for pid in range(3)])

    await publish(stub, stream_name, b"wakes all", partition=1)

    assert not any([(await partition_metadata(stub, stream_name, pid)).paused for pid in range(3)])


async def test_pause_stream_selected_partitions(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    await bounded(stub.PauseStream(api_pb2.PauseStreamRequest(name=stream_name, partitions=[1])))
    assert not (await partition_metadata(stub, stream_name, 0)).paused
    assert (await partition_metadata(stub, stream_name, 1)).paused

    await expect_code(Code.NOT_FOUND, stub.PauseStream(api_pb2.PauseStreamRequest(name=stream_name, partitions=[2])))
    await expect_code(Code.NOT_FOUND, stub.PauseStream(api_pb2.PauseStreamRequest(name=f"{stream_name}-none")))


# ---------------------------------------------------------------------------------------------- SetStreamReadonly


async def test_set_stream_readonly(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"a")

    await bounded(stub.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=stream_name, readonly=True)))
    meta = await partition_metadata(stub, stream_name)
    assert meta.readonly and meta.readonlyTimestamps.firstTimestamp > 0
    await expect_code(Code.FAILED_PRECONDITION, publish(stub, stream_name, b"refused"))
    assert values(await read_until_stop(stub, stream_name)) == [b"a"]  # still readable

    await bounded(stub.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=stream_name, readonly=False)))
    assert not (await partition_metadata(stub, stream_name)).readonly
    assert (await publish(stub, stream_name, b"b")).ack.offset == 1  # nothing was stored while read-only
    assert values(await read_until_stop(stub, stream_name)) == [b"a", b"b"]


async def test_set_stream_readonly_unknown(stub: Stub, stream_name: str) -> None:
    request = api_pb2.SetStreamReadonlyRequest(name=stream_name, readonly=True)
    await expect_code(Code.NOT_FOUND, stub.SetStreamReadonly(request))


# ---------------------------------------------------------------------------------------------- Subscribe


async def test_subscribe_sends_the_handshake_then_waits_at_the_tail(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as tail:
        await publish(stub, stream_name, b"first", key=b"k", headers={"h": b"v"})
        message = await tail.next()
        assert (message.offset, message.key, message.value, dict(message.headers)) == (0, b"k", b"first", {"h": b"v"})
        assert (message.stream, message.partition, message.subject) == (stream_name, 0, stream_name)
        assert message.timestamp > 0

        await publish(stub, stream_name, b"second")
        assert (await tail.next()).offset == 1


async def test_subscribe_new_only(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await fill(stub, stream_name, 3)
    async with subscription(stub, stream_name, startPosition=api_pb2.NEW_ONLY) as tail:
        await publish(stub, stream_name, b"new")
        message = await tail.next()
        assert (message.offset, message.value) == (3, b"new")


async def test_subscribe_from_offset(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await fill(stub, stream_name, 5)
    got = await read_until_stop(stub, stream_name, startPosition=api_pb2.OFFSET, startOffset=2)
    assert offsets(got) == [2, 3, 4]

    # An offset past the newest waits for the next message.
    async with subscription(stub, stream_name, startPosition=api_pb2.OFFSET, startOffset=50) as tail:
        await publish(stub, stream_name, b"next")
        assert (await tail.next()).offset == 5


async def test_subscribe_earliest(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await fill(stub, stream_name, 5)
    assert offsets(await read_until_stop(stub, stream_name, startPosition=api_pb2.EARLIEST)) == [0, 1, 2, 3, 4]


async def test_subscribe_latest(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await fill(stub, stream_name, 5)
    assert offsets(await read_until_stop(stub, stream_name, startPosition=api_pb2.LATEST)) == [4]
    async with subscription(stub, stream_name, startPosition=api_pb2.LATEST) as tail:
        assert (await tail.next()).offset == 4
        await publish(stub, stream_name, b"more")
        assert (await tail.next()).offset == 5


async def test_subscribe_from_timestamp(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    stamps = [m.timestamp for m in await fill(stub, stream_name, 5)]
    assert stamps == sorted(stamps) and len(set(stamps)) == 5

    exact = await read_until_stop(stub, stream_name, startPosition=api_pb2.TIMESTAMP, startTimestamp=stamps[2])
    assert offsets(exact) == [2, 3, 4]
    between = await read_until_stop(stub, stream_name, startPosition=api_pb2.TIMESTAMP, startTimestamp=stamps[1] + 1)
    assert offsets(between) == [2, 3, 4]
    after = await read_until_stop(stub, stream_name, startPosition=api_pb2.TIMESTAMP, startTimestamp=stamps[4] + 1)
    assert after == []


async def test_subscribe_stop_offset(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await fill(stub, stream_name, 5)
    got = await read_until_stop(stub, stream_name, stopPosition=api_pb2.STOP_OFFSET, stopOffset=2)
    assert offsets(got) == [0, 1, 2]

    # A stop offset beyond the newest message is waited for.
    request = api_pb2.SubscribeRequest(
        stream=stream_name, startPosition=api_pb2.OFFSET, startOffset=4, stopPosition=api_pb2.STOP_OFFSET, stopOffset=6
    )
    call = stub.Subscribe(request)
    try:
        assert await bounded(call.read()) == api_pb2.Message()
        assert (await bounded(call.read())).offset == 4
        await publish(stub, stream_name, b"m5")
        await publish(stub, stream_name, b"m6")
        await publish(stub, stream_name, b"m7")
        assert (await bounded(call.read())).offset == 5
        assert (await bounded(call.read())).offset == 6
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await bounded(call.read())
        assert ended.value.code() == Code.RESOURCE_EXHAUSTED
    finally:
        call.cancel()

    # A start after the stop ends at once.
    start_after_stop = {"startPosition": api_pb2.OFFSET, "startOffset": 3, "stopOffset": 1}
    assert await read_until_stop(stub, stream_name, stopPosition=api_pb2.STOP_OFFSET, **start_after_stop) == []


async def test_subscribe_stop_latest(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    assert await read_until_stop(stub, stream_name, stopPosition=api_pb2.STOP_LATEST) == []  # empty: ends at once
    await fill(stub, stream_name, 3)

    request = api_pb2.SubscribeRequest(
        stream=stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    call = stub.Subscribe(request)
    try:
        assert await bounded(call.read()) == api_pb2.Message()
        await publish(stub, stream_name, b"after the subscription")  # past the stop fixed when subscribing
        got = [await bounded(call.read()) for _ in range(3)]
        assert offsets(got) == [0, 1, 2]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await bounded(call.read())
        assert ended.value.code() == Code.RESOURCE_EXHAUSTED
    finally:
        call.cancel()


async def test_subscribe_stop_timestamp(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    stamps = [m.timestamp for m in await fill(stub, stream_name, 5)]
    got = await read_until_stop(stub, stream_name, stopPosition=api_pb2.STOP_TIMESTAMP, stopTimestamp=stamps[2])
    assert offsets(got) == [0, 1, 2]
    got = await read_until_stop(stub, stream_name, stopPosition=api_pb2.STOP_TIMESTAMP, stopTimestamp=stamps[3] - 1)
    assert offsets(got) == [0, 1, 2]


async def test_subscribe_unknown_stream_or_partition(stub: Stub, stream_name: str) -> None:
    await expect_code(Code.NOT_FOUND, read_until_stop(stub, stream_name))
    await create_stream(stub, stream_name, partitions=2)
    await expect_code(Code.NOT_FOUND, read_until_stop(stub, stream_name, partition=2))


# ---------------------------------------------------------------------------------------------- FetchMetadata


async def test_fetch_metadata_describes_the_broker(stub: Stub, broker: Broker, stream_name: str) -> None:
    assert broker.grpc is not None
    await create_stream(stub, stream_name, partitions=2)
    response = await fetch_metadata(stub)  # no names: every stream

    assert [(b.id, b.host, b.port) for b in response.brokers] == [(broker.id, "127.0.0.1", broker.grpc.port)]
    total = sum(len(s.partitions) for s in response.streamMetadata)
    assert total >= 2
    assert response.brokers[0].partitionCount == total
    assert response.brokers[0].leaderCount == total
    assert stream_name in [s.name for s in response.streamMetadata]


async def test_fetch_metadata_of_named_streams(stub: Stub, stream_name: str) -> None:
    before = time.time_ns()
    await create_stream(stub, stream_name, subject=f"{stream_name}.subject")
    after = time.time_ns()
    response = await fetch_metadata(stub, stream_name, f"{stream_name}-missing")

    known, missing = response.streamMetadata
    assert (known.name, known.subject, known.error) == (stream_name, f"{stream_name}.subject", 0)
    assert before <= known.creationTimestamp <= after
    assert (missing.name, missing.error) == (f"{stream_name}-missing", api_pb2.StreamMetadata.UNKNOWN_STREAM)
    assert not missing.partitions


async def test_fetch_metadata_offsets_are_last_offsets_or_minus_one(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    empty = (await stream_metadata(stub, stream_name)).partitions[0]
    assert (empty.highWatermark, empty.newestOffset) == (-1, -1)

    before = time.time_ns()
    await fill(stub, stream_name, 3)
    after = time.time_ns()
    partition = (await stream_metadata(stub, stream_name)).partitions[0]
    assert (partition.highWatermark, partition.newestOffset) == (2, 2)
    received = partition.messagesReceivedTimestamps
    assert before <= received.firstTimestamp <= received.latestTimestamp <= after


async def test_fetch_metadata_unknown_group(stub: Stub) -> None:
    response = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest(groups=["no-such-group"])))
    assert [(g.groupId, g.error) for g in response.groupMetadata] == [
        ("no-such-group", api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP)
    ]


# ---------------------------------------------------------------------------------------------- FetchPartitionMetadata


async def test_fetch_partition_metadata(stub: Stub, broker: Broker, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    await fill(stub, stream_name, 2, partition=1)

    meta = await partition_metadata(stub, stream_name, 1)
    assert (meta.id, meta.leader, list(meta.replicas), list(meta.isr)) == (1, broker.id, [broker.id], [broker.id])
    assert (meta.highWatermark, meta.newestOffset, meta.paused, meta.readonly) == (1, 1, False, False)
    assert 0 < meta.messagesReceivedTimestamps.firstTimestamp <= meta.messagesReceivedTimestamps.latestTimestamp
    other = await partition_metadata(stub, stream_name, 0)
    assert (other.id, other.highWatermark, other.newestOffset) == (0, -1, -1)

    await expect_code(Code.NOT_FOUND, partition_metadata(stub, stream_name, 2))
    await expect_code(Code.NOT_FOUND, partition_metadata(stub, f"{stream_name}-missing"))


# ---------------------------------------------------------------------------------------------- Publish


async def test_publish_ack_describes_the_stored_message(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    for i in range(3):
        before = time.time_ns()
        response = await publish(stub, stream_name, b"v", correlationId=f"c{i}", ackPolicy=api_pb2.ALL)
        ack = response.ack
        assert ack.offset == i
        assert (ack.stream, ack.partitionSubject, ack.msgSubject) == (stream_name, stream_name, stream_name)
        assert (ack.correlationId, response.correlationId, ack.ackPolicy) == (f"c{i}", f"c{i}", api_pb2.ALL)
        assert before <= ack.receptionTimestamp <= ack.commitTimestamp <= time.time_ns()
        assert ack.ackError == api_pb2.Ack.OK


@pytest.mark.parametrize("policy", [api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE], ids=["LEADER", "ALL", "NONE"])
async def test_publish_ack_policies(stub: Stub, stream_name: str, policy: int) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"first")
    response = await publish(stub, stream_name, b"second", ackPolicy=policy, correlationId="c")
    if policy == api_pb2.NONE:
        assert not response.HasField("ack")
    else:
        assert response.ack.offset == 1 and response.ack.ackPolicy == policy
    got = await read_until_stop(stub, stream_name)
    assert values(got) == [b"first", b"second"]  # NONE only means no ack: the message is still stored
    assert got[1].ackPolicy == policy and got[1].correlationId == "c"


async def test_publish_also_acks_on_the_ack_inbox(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    inbox = f"{stream_name}.acks"
    arrived: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def on_ack(msg: Any) -> None:
        if not arrived.done():
            arrived.set_result(msg.data)

    sub = await nc.subscribe(inbox, cb=on_ack)
    try:
        await subscribed(nc)
        response = await publish(stub, stream_name, b"v", ackInbox=inbox, correlationId="c1")
        envelope = parse_envelope(await bounded(arrived))
    finally:
        await sub.unsubscribe()
    assert envelope is not None and envelope.msg_type is MessageType.ACK
    ack = api_pb2.Ack.FromString(bytes(envelope.payload))
    assert (ack.offset, ack.correlationId, ack.ackInbox, ack.stream) == (0, "c1", inbox, stream_name)
    assert ack == response.ack


async def test_publish_key_and_headers_round_trip(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    headers = {"plain": b"text", "binary": bytes(range(256)), "empty": b""}
    await publish(stub, stream_name, b"value", key=b"\x00key\xff", headers=headers)
    await publish(stub, stream_name, b"")  # empty value, no key, no headers
    first, second = await read_until_stop(stub, stream_name)
    assert (first.key, first.value, dict(first.headers)) == (b"\x00key\xff", b"value", headers)
    assert (second.key, second.value, dict(second.headers)) == (b"", b"", {})


async def test_publish_size_limit(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"k" * 16, key=b"x" * 16, headers={"h": b"y" * 16})

    at_limit = MAX_MESSAGE - 10 - 2
    assert (await publish(stub, stream_name, b"v" * at_limit, key=b"k" * 10, headers={"h": b"z"})).ack.offset == 1
    details = await expect_code(
        Code.INVALID_ARGUMENT, publish(stub, stream_name, b"v" * (at_limit + 1), key=b"k" * 10, headers={"h": b"z"})
    )
    assert str(MAX_MESSAGE) in details
    await expect_code(Code.INVALID_ARGUMENT, publish(stub, stream_name, b"v" * (MAX_MESSAGE + 1)))

    assert (await partition_metadata(stub, stream_name)).newestOffset == 1  # nothing of the refused ones stored
    assert [len(v) for v in values(await read_until_stop(stub, stream_name))] == [16, at_limit]


async def test_publish_refuses_reserved_header_names(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    for name in ("_tl.subject", "_tl.anything"):
        details = await expect_code(Code.INVALID_ARGUMENT, publish(stub, stream_name, b"v", headers={name: b"x"}))
        assert name in details
    assert (await partition_metadata(stub, stream_name)).newestOffset == -1
    assert (await publish(stub, stream_name, b"v", headers={"tl.fine": b"x", "_tlfine": b"y"})).ack.offset == 0


async def test_publish_to_unknown_stream_or_partition(stub: Stub, stream_name: str) -> None:
    await expect_code(Code.NOT_FOUND, publish(stub, stream_name, b"v"))
    await create_stream(stub, stream_name)
    await expect_code(Code.NOT_FOUND, publish(stub, stream_name, b"v", partition=1))


async def test_publish_expected_offset(stub: Stub, stream_name: str) -> None:
    occ = f"{stream_name}-occ"
    await create_stream(stub, occ, optimisticConcurrencyControl=api_pb2.NullableBool(value=True))
    assert (await publish(stub, occ, b"a", expectedOffset=0)).ack.offset == 0
    stale = await publish(stub, occ, b"b", expectedOffset=0)
    assert stale.ack.ackError == api_pb2.Ack.INCORRECT_OFFSET
    assert (await publish(stub, occ, b"c", expectedOffset=1)).ack.offset == 1
    assert (await publish(stub, occ, b"d", expectedOffset=-1)).ack.offset == 2  # -1: no expectation
    assert values(await read_until_stop(stub, occ)) == [b"a", b"c", b"d"]

    # Without optimistic concurrency control the expected offset is ignored.
    await create_stream(stub, stream_name)
    assert (await publish(stub, stream_name, b"a", expectedOffset=7)).ack.offset == 0


async def test_publish_all_waits_for_the_isr_within_the_deadline(stub: Stub, broker: Broker, stream_name: str) -> None:
    """With a replica in the ISR that never catches up, nothing commits: LEADER is acked, ALL times out."""
    await create_stream(stub, stream_name)
    async with ghost_broker(broker):
        await _all_waits_for_the_isr(stub, broker, stream_name)


async def _all_waits_for_the_isr(stub: Stub, broker: Broker, stream_name: str) -> None:
    await set_isr(broker, stream_name, (broker.id, "ghost"))

    assert (await publish(stub, stream_name, b"leader", ackPolicy=api_pb2.LEADER)).ack.offset == 0
    meta = await partition_metadata(stub, stream_name)
    assert (meta.newestOffset, meta.highWatermark) == (0, -1)  # written, not committed
    assert await read_until_stop(stub, stream_name) == []  # subscribers see committed messages only

    started = time.monotonic()
    request = api_pb2.PublishRequest(stream=stream_name, value=b"all, 1 s deadline", ackPolicy=api_pb2.ALL)
    await expect_code(Code.DEADLINE_EXCEEDED, stub.Publish(request, timeout=1.0))
    assert time.monotonic() - started < 1.0 + 2.0

    started = time.monotonic()  # no deadline: the broker's default ack timeout applies
    await expect_code(Code.DEADLINE_EXCEEDED, publish(stub, stream_name, b"all, no deadline", ackPolicy=api_pb2.ALL))
    assert ACK_TIMEOUT - 0.2 <= time.monotonic() - started < BOUND

    # Once the ISR is back to the leader alone, everything written commits, timed-out writes included.
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as tail:
        await set_isr(broker, stream_name, (broker.id,))
        assert values(await tail.take(3)) == [b"leader", b"all, 1 s deadline", b"all, no deadline"]
    meta = await partition_metadata(stub, stream_name)
    assert (meta.newestOffset, meta.highWatermark) == (2, 2)


# ---------------------------------------------------------------------------------------------- PublishAsync


async def publish_async(stub: Stub, requests: list[api_pb2.PublishRequest]) -> list[api_pb2.PublishResponse]:
    """Send every request on one PublishAsync stream, close our side, return every response until the end."""
    call = stub.PublishAsync(iter(requests))

    async def collect() -> list[api_pb2.PublishResponse]:
        return [response async for response in call]

    try:
        return await bounded(collect())
    finally:
        call.cancel()


async def test_publish_async_matches_responses_by_correlation_id(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    requests = [
        api_pb2.PublishRequest(stream=stream_name, value=b"v%d" % i, correlationId=f"c{i}", ackPolicy=api_pb2.ALL)
        for i in range(50)
    ]
    responses = await publish_async(stub, requests)

    by_id = {r.correlationId: r for r in responses}
    assert len(responses) == len(by_id) == 50 and set(by_id) == {f"c{i}" for i in range(50)}
    assert all(r.ack.correlationId == r.correlationId and not r.HasField("asyncError") for r in responses)
    assert sorted(r.ack.offset for r in responses) == list(range(50))
    stored = {m.offset: m for m in await read_until_stop(stub, stream_name)}
    for cid, response in by_id.items():
        assert stored[response.ack.offset].correlationId == cid
        assert stored[response.ack.offset].value == b"v" + cid[1:].encode()


async def test_publish_async_errors_do_not_end_the_stream(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)

    def request(cid: str, **fields: Any) -> api_pb2.PublishRequest:
        fields.setdefault("stream", stream_name)
        return api_pb2.PublishRequest(value=fields.pop("value", b"ok"), correlationId=cid, **fields)

    responses = await publish_async(
        stub,
        [
            request("ok-1"),
            request("unknown-stream", stream=f"{stream_name}-missing"),
            request("reserved-header", headers={"_tl.corr": b"x"}),
            request("too-large", value=b"x" * (MAX_MESSAGE + 1)),
            request("unknown-partition", partition=3),
            request("ok-2"),
        ],
    )

    by_id = {r.correlationId: r for r in responses}
    assert set(by_id) == {"ok-1", "unknown-stream", "reserved-header", "too-large", "unknown-partition", "ok-2"}
    codes = {cid: r.asyncError.code for cid, r in by_id.items() if r.HasField("asyncError")}
    assert codes == {
        "unknown-stream": api_pb2.PublishAsyncError.NOT_FOUND,
        "reserved-header": api_pb2.PublishAsyncError.BAD_REQUEST,
        "too-large": api_pb2.PublishAsyncError.BAD_REQUEST,
        "unknown-partition": api_pb2.PublishAsyncError.NOT_FOUND,
    }
    assert all(by_id[cid].asyncError.message for cid in codes)
    assert sorted(by_id[cid].ack.offset for cid in ("ok-1", "ok-2")) == [0, 1]
    assert values(await read_until_stop(stub, stream_name)) == [b"ok", b"ok"]


async def test_publish_async_none_policy_gets_no_response(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    policies = {"leader": api_pb2.LEADER, "none": api_pb2.NONE, "all": api_pb2.ALL}
    responses = await publish_async(
        stub,
        [
            api_pb2.PublishRequest(stream=stream_name, value=cid.encode(), correlationId=cid, ackPolicy=policy)
            for cid, policy in policies.items()
        ],
    )
    assert sorted(r.correlationId for r in responses) == ["all", "leader"]
    assert sorted(values(await read_until_stop(stub, stream_name))) == [b"all", b"leader", b"none"]


# ---------------------------------------------------------------------------------------------- PublishToSubject


async def test_publish_to_subject_returns_the_ack(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await publish(stub, stream_name, b"first")
    for policy in (api_pb2.LEADER, api_pb2.ALL):
        request = api_pb2.PublishToSubjectRequest(
            subject=stream_name, key=b"k", value=b"v", headers={"h": b"x"}, correlationId="c", ackPolicy=policy
        )
        response = await bounded(stub.PublishToSubject(request))
        ack = response.ack
        assert (ack.stream, ack.msgSubject, ack.correlationId, ack.ackPolicy) == (stream_name, stream_name, "c", policy)
    got = await read_until_stop(stub, stream_name)
    assert offsets(got) == [0, 1, 2]
    assert [(m.key, m.value, dict(m.headers)) for m in got[1:]] == [(b"k", b"v", {"h": b"x"})] * 2


async def test_publish_to_subject_none_policy(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    async with subscription(stub, stream_name, startPosition=api_pb2.EARLIEST) as tail:
        request = api_pb2.PublishToSubjectRequest(subject=stream_name, value=b"unacked", ackPolicy=api_pb2.NONE)
        response = await bounded(stub.PublishToSubject(request))
        assert not response.HasField("ack")
        assert (await tail.next()).value == b"unacked"


async def test_publish_to_subject_without_stream_times_out(stub: Stub, stream_name: str) -> None:
    request = api_pb2.PublishToSubjectRequest(subject=f"{stream_name}.nobody", value=b"v")
    started = time.monotonic()
    await expect_code(Code.DEADLINE_EXCEEDED, stub.PublishToSubject(request, timeout=0.5))
    assert time.monotonic() - started < 0.5 + 2.0


async def test_publish_to_subject_refuses_reserved_headers(stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    request = api_pb2.PublishToSubjectRequest(subject=stream_name, value=b"v", headers={"_tl.ack": b"\x01"})
    await expect_code(Code.INVALID_ARGUMENT, stub.PublishToSubject(request))
    assert (await partition_metadata(stub, stream_name)).newestOffset == -1


# ---------------------------------------------------------------------------------------------- health


@pytest.mark.parametrize("service", ["", "proto.API"])
async def test_health_is_serving(broker: Broker, service: str) -> None:
    assert broker.grpc is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        response = await bounded(health.Check(health_pb2.HealthCheckRequest(service=service)))
    assert response.status == health_pb2.HealthCheckResponse.SERVING
