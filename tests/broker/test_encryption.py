"""Encryption at rest on a real broker: nothing of an encrypted stream's values on disk, every reader unchanged,
compaction, restarts, key rotation, and a broker without the master key that refuses and loses nothing."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from tests.broker.conftest import broker_config
from tests.broker.helpers import (
    SECRET,
    Stub,
    bounded,
    create_stream,
    expect_code,
    publish,
    read_until_stop,
    stored,
)
from tests.helpers import BOUND
from tidelog.client import Admin, Consumer, Producer
from tidelog.client.appender import Appender
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import EncryptionError, InvalidArgumentError
from tidelog.protocol.labels import LabelSet
from tidelog.protocol.records import ENCRYPTED_FLAG, iter_batches
from tidelog.server import Broker
from tidelog.storage.encryption import KEY_ID

MASTER = base64.b64encode(os.urandom(32)).decode()
ENCRYPTED = {"encryption": api_pb2.NullableBool(value=True)}


@asynccontextmanager
async def running(data_dir: Path, **settings: Any) -> AsyncIterator[tuple[Broker, Stub]]:
    broker = Broker(broker_config(data_dir, **settings))
    await broker.start()
    try:
        assert broker.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), BOUND)
            yield broker, api_pb2_grpc.APIStub(channel)
    finally:
        await broker.stop()


def wire(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def native_values(broker: Broker, stream: str) -> list[bytes | None]:
    async with Consumer(wire(broker), stream, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            return [record.value async for record in consumer]


async def test_an_encrypted_stream_keeps_no_value_on_disk_and_reads_back_unchanged(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    async with running(data_dir, encryption_key=MASTER) as (broker, stub):
        await create_stream(stub, "sealed", **ENCRYPTED)
        await create_stream(stub, "plain")
        for stream in ("sealed", "plain"):
            for i in range(5):
                await publish(stub, stream, SECRET + b"%d" % i, key=b"the-key-%d" % i, ackPolicy=api_pb2.ALL)
        expected = [SECRET + b"%d" % i for i in range(5)]
        assert [m.value for m in await read_until_stop(stub, "sealed")] == expected  # gRPC Subscribe
        assert await native_values(broker, "sealed") == expected  # the native consumer's wire fetch
        from_time = await read_until_stop(stub, "sealed", startPosition=api_pb2.TIMESTAMP, startTimestamp=1)
        assert [m.value for m in from_time] == expected  # a timestamp lookup opens the batch it lands in
        await broker.manager.leader_of("sealed", 0).log.flush()  # type: ignore[union-attr]
    sealed, plain = stored(data_dir, "sealed"), stored(data_dir, "plain")
    assert sealed and SECRET not in sealed and b"the-key-" not in sealed
    assert SECRET in plain  # the same test finds it where it is not encrypted
    assert all(header.attributes & ENCRYPTED_FLAG for _, header in iter_batches(sealed))


async def test_restart_rotation_and_a_broker_without_the_master_key(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    async with running(data_dir, encryption_key=MASTER) as (broker, stub):
        await create_stream(stub, "sealed", **ENCRYPTED)
        await publish(stub, "sealed", b"before-rotation", ackPolicy=api_pb2.ALL)
        async with Admin(wire(broker)) as admin:
            await admin.rotate_key("sealed")
            await create_stream(stub, "plain")
            with pytest.raises(InvalidArgumentError, match="not encrypted"):
                await admin.rotate_key("plain")
        assert broker.mirror is not None
        assert len(broker.mirror.snapshot.partition("sealed", 0).data_keys) == 2  # type: ignore[union-attr]
        await publish(stub, "sealed", b"after-rotation", ackPolicy=api_pb2.ALL)
    on_disk = stored(data_dir, "sealed")
    key_ids = [KEY_ID.unpack_from(on_disk, p + 61)[0] for p, _ in iter_batches(on_disk)]
    assert key_ids == [0, 1]  # new data is sealed with the new key

    async with running(data_dir) as (broker, stub):  # no master key
        details = await expect_code(
            grpc.StatusCode.FAILED_PRECONDITION, publish(stub, "sealed", b"refused", ackPolicy=api_pb2.ALL)
        )
        assert "encryption_key" in details
        call = stub.Subscribe(api_pb2.SubscribeRequest(stream="sealed", startPosition=api_pb2.EARLIEST))
        try:
            assert await bounded(call.read()) == api_pb2.Message()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await bounded(call.read())
            assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            call.cancel()
        with pytest.raises(EncryptionError):
            await native_values(broker, "sealed")
        await publish(stub, "plain", b"plain streams still work", ackPolicy=api_pb2.ALL)
    assert stored(data_dir, "sealed") == on_disk  # nothing lost, nothing rewritten

    async with running(data_dir, encryption_key=MASTER) as (broker, stub):  # the key back: all of it reads
        assert [m.value for m in await read_until_stop(stub, "sealed")] == [b"before-rotation", b"after-rotation"]


async def test_compaction_of_an_encrypted_stream(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"
    async with running(data_dir, encryption_key=MASTER) as (broker, stub):
        await create_stream(
            stub,
            "sealed",
            compactEnabled=api_pb2.NullableBool(value=True),
            segmentMaxBytes=api_pb2.NullableInt64(value=2048),
            **ENCRYPTED,
        )
        for i in range(40):
            await publish(stub, "sealed", SECRET + b"%d" % i, key=b"key-%d" % (i % 4), ackPolicy=api_pb2.ALL)
        partition = broker.manager.leader_of("sealed", 0)  # type: ignore[union-attr]
        assert broker.cleaner is not None
        _, compacted = await broker.cleaner.clean_once([partition])
        assert compacted > 0
        values = [m.value for m in await read_until_stop(stub, "sealed")]
        assert len(values) < 40
        assert values[-4:] == [SECRET + b"%d" % i for i in range(36, 40)]  # the newest per key survive
        await partition.log.flush()
    on_disk = stored(data_dir, "sealed")
    assert SECRET not in on_disk and b"key-" not in on_disk


async def test_the_broker_default_and_a_stream_that_needs_a_key_this_broker_lacks(tmp_path: Path) -> None:
    async with running(tmp_path / "a", encryption_key=MASTER, default_encryption=True) as (broker, stub):
        await create_stream(stub, "by-default")
        await create_stream(stub, "opted-out", encryption=api_pb2.NullableBool(value=False))
        assert broker.mirror is not None
        snap = broker.mirror.snapshot
        assert snap.stream("by-default").config.encryption is True  # type: ignore[union-attr]
        assert snap.stream("opted-out").config.encryption is False  # type: ignore[union-attr]
        assert not snap.stream("__cursors") or not snap.stream("__cursors").config.encryption  # type: ignore[union-attr]
    async with running(tmp_path / "b") as (_, stub):
        details = await expect_code(grpc.StatusCode.FAILED_PRECONDITION, create_stream(stub, "sealed", **ENCRYPTED))
        assert "master key" in details


async def test_every_way_in_is_sealed(tmp_path: Path) -> None:
    """The native producer (idempotent, zstd), transactional appends (small, and large enough to be spooled to a
    file), a gRPC publish and plain NATS messages all land sealed, and read back in order."""
    data_dir = tmp_path / "b"
    async with running(data_dir, encryption_key=MASTER) as (broker, stub):
        await create_stream(stub, "sealed", **ENCRYPTED)
        expected: list[bytes] = []
        async with Producer(wire(broker)) as producer:
            for i in range(3):
                await producer.send_and_wait("sealed", SECRET + b"produced%d" % i)
                expected.append(SECRET + b"produced%d" % i)
        large = [SECRET + os.urandom(1000) for _ in range(600)]
        async with Appender(wire(broker), chunk_bytes=64 * 1024) as appender:
            await appender.append("sealed", 0, [SECRET + b"appended"], union_registers=LabelSet.of(("owner", "a")))
            await appender.append("sealed", 0, large)
        expected += [SECRET + b"appended", *large]
        await publish(stub, "sealed", SECRET + b"published", ackPolicy=api_pb2.ALL)
        expected.append(SECRET + b"published")
        nc = await nats.connect(broker.nats_urls, connect_timeout=BOUND)
        try:
            await nc.publish("sealed", SECRET + b"nats")
            await nc.flush()
        finally:
            await nc.close()
        expected.append(SECRET + b"nats")
        partition = broker.manager.leader_of("sealed", 0)  # type: ignore[union-attr]
        async with asyncio.timeout(BOUND):
            while partition.high_watermark < len(expected):
                await partition.wait_for_data(partition.high_watermark, BOUND)
        assert await native_values(broker, "sealed") == expected
        await partition.log.flush()
    on_disk = stored(data_dir, "sealed")
    assert SECRET not in on_disk
    assert all(header.attributes & ENCRYPTED_FLAG for _, header in iter_batches(on_disk))


async def test_the_spark_reader_reads_an_encrypted_stream(tmp_path: Path) -> None:
    """The Spark source's task reader (what each Spark task runs; no JVM needed to call it) gets the values."""
    pytest.importorskip("pyarrow")
    from tidelog.spark.options import parse_options
    from tidelog.spark.planning import OffsetRange
    from tidelog.spark.reading import read_range

    async with running(tmp_path / "b", encryption_key=MASTER) as (broker, stub):
        await create_stream(stub, "sealed", **ENCRYPTED)
        for i in range(3):
            await publish(stub, "sealed", SECRET + b"%d" % i, ackPolicy=api_pb2.ALL)
        options = parse_options({"brokers": wire(broker), "streams": "sealed"})
        task = OffsetRange("sealed", 0, 0, 3, "sealed")
        tables = await asyncio.wait_for(asyncio.to_thread(lambda: list(read_range(options, task))), BOUND)
    values = [value for table in tables for value in table.column("value").to_pylist()]
    assert values == [SECRET + b"%d" % i for i in range(3)]


async def test_the_nats_msg_id_window_is_rebuilt_from_sealed_batches(tmp_path: Path) -> None:
    data_dir = tmp_path / "b"

    async def send(broker: Broker, value: bytes, msg_id: str) -> None:
        nc = await nats.connect(broker.nats_urls, connect_timeout=BOUND)
        try:
            await nc.publish("sealed", value, headers={"Nats-Msg-Id": msg_id})
            await nc.flush()
        finally:
            await nc.close()

    async def committed(broker: Broker, count: int) -> None:
        partition = broker.manager.leader_of("sealed", 0)  # type: ignore[union-attr]
        async with asyncio.timeout(BOUND):
            while partition.high_watermark < count:
                await partition.wait_for_data(partition.high_watermark, BOUND)

    async with running(data_dir, encryption_key=MASTER) as (broker, stub):
        await create_stream(stub, "sealed", **ENCRYPTED)
        await send(broker, b"first", "id-1")
        await committed(broker, 1)
    async with running(data_dir, encryption_key=MASTER) as (broker, stub):  # the window comes from the log
        await send(broker, b"first again", "id-1")
        await send(broker, b"second", "id-2")
        await committed(broker, 2)
        assert [m.value for m in await read_until_stop(stub, "sealed")] == [b"first", b"second"]
