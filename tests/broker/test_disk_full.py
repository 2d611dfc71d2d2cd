"""A real broker whose partitions live on a small tmpfs: a full disk refuses writes, it never takes a partition
down, and writes resume without a restart once space is freed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from tidelog.client import Admin, Appender
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import DiskFullError
from tidelog.protocol.labels import LabelSet
from tidelog.server import Broker
from tidelog.testing.small_disk import Ballast, mount_small_disk

from .conftest import broker_config
from .helpers import bounded, create_stream, publish, read_until_stop, rpc_error

SEGMENT_BYTES = 64 * 1024
VALUE_BYTES = 3000


@pytest_asyncio.fixture(params=[0, 4 * 1024 * 1024], ids=["plain", "preallocated"])
async def small_broker(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Broker, Path]]:
    data = tmp_path / "data"
    try:
        mounted = mount_small_disk(data / "streams", 2 * 1024 * 1024)  # the partitions' disk; etcd's stays roomy
        streams = mounted.__enter__()
    except OSError as exc:
        pytest.skip(str(exc))
    try:
        broker = Broker(
            broker_config(
                data,
                segment_max_bytes=SEGMENT_BYTES,
                max_message_bytes=SEGMENT_BYTES // 2,
                segment_preallocate_bytes=request.param,
            )
        )
        await broker.start()
        try:
            yield broker, streams
        finally:
            await broker.stop()
    finally:
        mounted.__exit__(None, None, None)


async def test_a_disk_full_at_a_segment_roll_refuses_writes_until_space_is_freed(
    small_broker: tuple[Broker, Path],
) -> None:
    broker, streams = small_broker
    assert broker.grpc is not None and broker.manager is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await create_stream(stub, "full")
        log = broker.manager.leader_of("full", 0).log
        acknowledged: list[bytes] = []

        async def send(value: bytes) -> None:
            await publish(stub, "full", value, ackPolicy=api_pb2.ALL)
            acknowledged.append(value)

        while log.segments[-1].size + VALUE_BYTES + 200 <= SEGMENT_BYTES:  # up to one message short of a roll
            await send(b"%05d" % len(acknowledged) + b"." * VALUE_BYTES)
        ballast = Ballast(streams / "ballast")
        ballast.fill(keep=4096)  # room for the message that rolls, none for the seal's index files after it
        refused = None
        for _ in range(200):
            value = b"%05d" % len(acknowledged) + b"." * VALUE_BYTES
            try:
                await send(value)
            except grpc.aio.AioRpcError as exc:
                refused = exc
                break
        assert refused is not None, "a full disk never refused a write"
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
        assert "disk is full" in (refused.details() or "") and "once space is freed" in (refused.details() or "")
        again = await rpc_error(stub.Publish(api_pb2.PublishRequest(stream="full", value=value)))
        assert again.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # still full: still refused, nothing else broke

        ballast.free()
        await bounded(send(value))  # the same write, no restart
        await bounded(send(b"after"))
        stored = [message.value for message in await read_until_stop(stub, "full")]
        assert stored == acknowledged  # every acknowledged message, in order; nothing of the refused writes


async def test_a_transactional_append_refused_on_a_full_disk_leaves_the_registers_as_they_were(
    small_broker: tuple[Broker, Path],
) -> None:
    broker, streams = small_broker
    assert broker.wire is not None
    address = f"127.0.0.1:{broker.wire.port}"
    async with Admin(address) as admin:
        await admin.create_stream("txn")
    async with Appender(address) as appender:
        first = await appender.append("txn", 0, [b"a"], union_registers=LabelSet.of(("owner", "one")))
        ballast = Ballast(streams / "ballast")
        ballast.fill()
        with pytest.raises(DiskFullError, match="disk is full"):  # an iterator: the appender does not retry it
            await appender.append(
                "txn", 0, iter([b"x" * VALUE_BYTES] * 5), union_registers=LabelSet.of(("owner", "two"))
            )
        ballast.free()
        after = await appender.append("txn", 0, [b"b", b"c"])
    assert first.registers == after.registers == LabelSet.of(("owner", "one"))  # "two" was never written
    assert (after.base_offset, after.last_offset) == (1, 2)
