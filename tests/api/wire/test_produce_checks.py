"""A real broker refuses produced batches its readers could not read, with a precise error, and the partition
keeps serving every record stored before and after (issue 15, item 1; item 11 for timestamps)."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from typing import Any

import pytest

from tests.broker.conftest import broker, broker_settings, stream_name, stub
from tests.broker.helpers import read_until_stop
from tests.helpers import BOUND
from tidelog.api.wire import produce_turns
from tidelog.api.wire.produce_turns import INLINE_ALONE
from tidelog.client import Admin, Codec, Consumer, Producer
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import DiskFullError, InvalidArgumentError, MessageTooLargeError
from tidelog.protocol.messages import Acks, ProduceRequest
from tidelog.protocol.records import BatchBuilder, NewRecord, build_batch, frame
from tidelog.server import Broker
from tidelog.storage.checkpoint import CheckpointFile

__all__ = ["broker", "broker_settings", "stream_name", "stub"]

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

HOUR_NS = 3_600_000_000_000


@pytest.fixture
def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


def garbage_batch(records: int = 3) -> bytes:
    """A batch whose header and CRC are right and whose record section is 0xFF bytes."""
    now = time.time_ns()
    return frame(
        b"\xff" * 300,
        base_offset=0,
        leader_epoch=0,
        attributes=0,
        last_offset_delta=records - 1,
        first_timestamp=now,
        max_timestamp=now,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=records,
    )


async def send_values(address: str, stream: str, values: list[bytes]) -> None:
    async with Producer(address) as producer:
        futures = [await producer.send(stream, value) for value in values]
        await producer.flush()
        await asyncio.wait_for(asyncio.gather(*futures), BOUND)


async def read_values(address: str, stream: str) -> list[bytes | None]:
    async with Consumer(address, stream, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            return [record.value async for record in consumer]


async def test_bad_batches_are_refused_and_the_partition_keeps_serving(
    broker: Broker, address: str, stream_name: str, stub: Any
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    before = [b"before-%d" % i for i in range(20)]
    await send_values(address, stream_name, before)

    assert broker.wire is not None
    connection = await Connection.open("127.0.0.1", broker.wire.port)
    try:
        for acks in (Acks.ALL, Acks.NONE):  # refused before anything is stored, whatever the ack policy
            with pytest.raises(InvalidArgumentError, match="not a valid record batch: record 0") as refused:
                await connection.request(ProduceRequest(stream_name, 0, acks), garbage_batch())
            assert not refused.value.retriable
    finally:
        await connection.close()

    # The official producer, its default zstd, one 80 MiB record: compressed it is tiny; the broker stops
    # decompressing at the batch limit and says why.
    async with Producer(address, compression=Codec.ZSTD, max_message_bytes=128 << 20) as producer:
        future = await producer.send(stream_name, bytes(80 << 20))
        with pytest.raises(MessageTooLargeError, match=r"max_message_bytes \(1048576\)") as too_large:
            await asyncio.wait_for(future, BOUND)
        assert not too_large.value.retriable
        # A record stamped two hours ahead (item 11): refused rather than pinning retention by age.
        ahead = await producer.send(stream_name, b"from the future", timestamp=time.time_ns() + 2 * HOUR_NS)
        with pytest.raises(InvalidArgumentError, match=r"max_timestamp_ahead_ms \(3600000\)"):
            await asyncio.wait_for(ahead, BOUND)
        # The same (idempotent) producer goes on: its refused batches do not poison the ones after them.
        following = await producer.send(stream_name, b"after-refusals")
        assert (await asyncio.wait_for(following, BOUND)).offset == len(before)

    after = [b"after-refusals"] + [b"after-%d" % i for i in range(20)]
    await send_values(address, stream_name, after[1:])
    assert await read_values(address, stream_name) == before + after
    assert [m.value for m in await read_until_stop(stub, stream_name)] == before + after  # gRPC Subscribe too


async def test_the_producer_refuses_a_record_too_large_for_itself_alone(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    async with Producer(address) as producer:
        first = await producer.send(stream_name, b"small")
        with pytest.raises(MessageTooLargeError, match=r"record of 1048577 bytes .* max_message_bytes \(1048576\)"):
            await producer.send(stream_name, bytes((1 << 20) + 1))
        with pytest.raises(ValueError, match="negative"):
            await producer.send(stream_name, b"before 1970", timestamp=-1)
        last = await producer.send(stream_name, b"also small")
        await producer.flush()
        assert [(await first).offset, (await last).offset] == [0, 1]
    assert await read_values(address, stream_name) == [b"small", b"also small"]


def irregular_batch(records: int, *, damaged: bool = False) -> bytes:
    """Records of every size: no two alike in a row, so each is checked one by one (off the event loop past
    INLINE_ALONE of them)."""
    builder = BatchBuilder(time.time_ns())
    for i in range(records):
        builder.append(b"v" * (i % 7), None, (), None)
    section = bytearray(builder.drain())
    if damaged:
        section[-1] = 0x05  # the last record's header count: -3
    now = builder.first_timestamp
    return frame(
        bytes(section),
        base_offset=0,
        leader_epoch=0,
        attributes=0,
        last_offset_delta=records - 1,
        first_timestamp=now,
        max_timestamp=now,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=records,
    )


async def test_a_batch_checked_off_the_loop_keeps_its_place(
    broker: Broker, address: str, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Irregular batches are checked in a worker thread; the connection's later batches still land after them."""
    in_threads: list[bool] = []
    check = produce_turns.check_produced

    def spied(*args: Any, **kwargs: Any) -> Any:
        in_threads.append(threading.current_thread() is not threading.main_thread())
        return check(*args, **kwargs)

    monkeypatch.setattr(produce_turns, "check_produced", spied)
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    slow = INLINE_ALONE + 1000
    small = build_batch([NewRecord(b"small")], timestamp=time.time_ns())
    assert broker.wire is not None
    connection = await Connection.open("127.0.0.1", broker.wire.port)
    try:
        request = ProduceRequest(stream_name, 0, Acks.ALL)
        pipelined = [
            connection.send(request, irregular_batch(slow)),
            connection.send(request, small),
            connection.send(request, irregular_batch(slow, damaged=True)),
            connection.send(request, small),
        ]
        outcomes = await asyncio.wait_for(asyncio.gather(*pipelined, return_exceptions=True), BOUND)
    finally:
        await connection.close()
    assert in_threads.count(True) == 2  # the two irregular batches, checked again off the loop
    first, second, refused, last = outcomes
    assert isinstance(refused, InvalidArgumentError) and f"record {slow - 1}" in refused.message
    offsets = [(r.header.base_offset, r.header.last_offset) for r in (first, second, last)]  # type: ignore[union-attr]
    assert offsets == [(0, slow - 1), (slow, slow), (slow + 1, slow + 1)]
    values = await read_values(address, stream_name)
    assert len(values) == slow + 2 and values[-2:] == [b"small", b"small"]


async def test_a_full_disk_at_the_epoch_checkpoint_is_refused_as_disk_full_without_a_traceback(
    broker: Broker, address: str, stream_name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader's first append of its epoch writes the leader-epoch checkpoint; on a full disk the produce is
    refused as DISK_FULL (nothing stored), logged in one line (the nemesis's ENOSPC logged a traceback), and the
    next produce, with space back, is stored."""
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)

    def full(self: CheckpointFile, entries: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    with monkeypatch.context() as patched, caplog.at_level(logging.WARNING, logger="tidelog.api.wire.session"):
        patched.setattr(CheckpointFile, "write", full)
        with pytest.raises(DiskFullError):
            await send_values(address, stream_name, [b"refused"])
    assert "refused: " in caplog.text and "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]
    await send_values(address, stream_name, [b"stored"])
    assert await read_values(address, stream_name) == [b"stored"]
