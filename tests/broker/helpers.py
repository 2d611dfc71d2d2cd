"""What tests against a running broker do again and again: create streams, publish, read back, expect errors.

Also what several broker test modules share: a partition for NATS ingest tests (:func:`open_partition`,
:func:`stored_batches`), Liftbridge envelopes and ack inboxes, transactional appends over the wire
(:func:`begin`, :func:`records`), and a stream whose batch :data:`DAMAGED` rots on disk (:func:`rot`).

Every wait is bounded by :data:`BOUND`, so a broker that never answers fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import crc32c
import grpc

from tests.helpers import BOUND
from tidelog.broker.partitions.partition import Partition
from tidelog.client import Consumer, Producer
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.envelope import MessageType, encode_envelope, parse_envelope
from tidelog.protocol.messages import AppendPhase, AppendRequest
from tidelog.protocol.records import (
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    HEADER_SIZE,
    LENGTH_FIELD_END,
    PREFIX,
    BatchBuilder,
    decode_records,
    iter_batches,
)
from tidelog.server import Broker
from tidelog.storage.config import LogConfig
from tidelog.storage.log import Log

T = TypeVar("T")

Stub = api_pb2_grpc.APIStub


async def bounded(awaitable: Awaitable[T], bound: float = BOUND) -> T:
    return await asyncio.wait_for(awaitable, bound)


async def rpc_error(awaitable: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The gRPC error the call ends with (failing the test if it succeeds)."""
    try:
        result = await bounded(awaitable)
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError(f"expected a gRPC error, got {result!r}")


async def expect_code(code: grpc.StatusCode, awaitable: Awaitable[Any]) -> str:
    """Assert the call fails with ``code``; return the error's details."""
    exc = await rpc_error(awaitable)
    assert exc.code() == code, f"expected {code.name}, got {exc.code().name}: {exc.details()}"
    return exc.details() or ""


async def create_stream(stub: Stub, name: str, subject: str | None = None, **fields: Any) -> None:
    await bounded(stub.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=subject or name, **fields)))


async def publish(stub: Stub, stream: str, value: bytes, **fields: Any) -> api_pb2.PublishResponse:
    response: api_pb2.PublishResponse = await bounded(
        stub.Publish(api_pb2.PublishRequest(stream=stream, value=value, **fields))
    )
    return response


async def partition_metadata(stub: Stub, stream: str, partition: int = 0) -> api_pb2.PartitionMetadata:
    response = await bounded(
        stub.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition))
    )
    metadata: api_pb2.PartitionMetadata = response.metadata
    return metadata


async def read_until_stop(stub: Stub, stream: str, partition: int = 0, **fields: Any) -> list[api_pb2.Message]:
    """Subscribe (default: from EARLIEST to STOP_LATEST) and return what arrives before the stop.

    Checks the subscription the way a Liftbridge client relies on it: the empty handshake message first, and
    the end signalled by ``RESOURCE_EXHAUSTED``.
    """
    fields.setdefault("startPosition", api_pb2.EARLIEST)
    fields.setdefault("stopPosition", api_pb2.STOP_LATEST)
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream=stream, partition=partition, **fields))
    messages: list[api_pb2.Message] = []

    async def read() -> None:
        assert await call.read() == api_pb2.Message(), "the first message must be the empty handshake"
        while True:
            try:
                message = await call.read()
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                return
            assert message is not grpc.aio.EOF, "the subscription ended without RESOURCE_EXHAUSTED"
            messages.append(message)

    try:
        await bounded(read())
    finally:
        call.cancel()
    return messages


async def subscribed(nc: Any) -> None:
    """Return once the NATS server has processed every subscription ``nc`` made so far.

    One ``flush()`` is not enough with nats-py: its PING goes straight to the socket while a SUB may still wait
    in the client's buffer. After the first round trip the SUB has been written; the second PING follows it.
    """
    await bounded(nc.flush())
    await bounded(nc.flush())


def values(messages: list[api_pb2.Message]) -> list[bytes]:
    return [m.value for m in messages]


def offsets(messages: list[api_pb2.Message]) -> list[int]:
    return [m.offset for m in messages]


class Subscription:
    """An open subscription, read one message at a time (for waiting at the tail)."""

    def __init__(self, call: Any) -> None:
        self._call = call

    async def next(self) -> api_pb2.Message:
        message = await bounded(self._call.read())
        assert message is not grpc.aio.EOF, "the subscription ended"
        assert isinstance(message, api_pb2.Message)
        return message

    async def take(self, count: int) -> list[api_pb2.Message]:
        return [await self.next() for _ in range(count)]


@asynccontextmanager
async def subscription(stub: Stub, stream: str, partition: int = 0, **fields: Any) -> AsyncIterator[Subscription]:
    """Subscribe, check the handshake, and cancel the call on the way out."""
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream=stream, partition=partition, **fields))
    try:
        assert await bounded(call.read()) == api_pb2.Message(), "the first message must be the empty handshake"
        yield Subscription(call)
    finally:
        call.cancel()


MiB = 1024 * 1024


async def open_partition(path: Path, config: LogConfig) -> Partition:
    stream = StreamRecord("s", "s", "", 1, 1, 1)
    record = PartitionRecord("s", 0, ("b1",), "b1", ("b1",))
    return Partition(stream, record, await Log.open_async(path, config), "b1", min_isr=1)


def stored_batches(partition: Partition) -> list[list[bytes]]:
    """Every committed batch, as the list of its record values."""
    batches: list[list[bytes]] = []
    offset = 0
    while data := partition.read_committed(offset, 64 * MiB):
        for position, header in iter_batches(data):
            batches.append([r.value or b"" for r in decode_records(data, position, header=header)])
            offset = header.next_offset
    return batches


def garble_first_record(path: Path, position: int, size: int, *, fix_crc: bool) -> None:
    """Make the first record of the batch at ``position`` undecodable (its length a run of 0xFF); with ``fix_crc``
    the batch's CRC still matches. The rest of the record, its Nats-Msg-Id header too, is left in place."""
    data = bytearray(path.read_bytes())
    data[position + HEADER_SIZE : position + HEADER_SIZE + 10] = b"\xff" * 10
    if fix_crc:
        crc = crc32c.crc32c(bytes(data[position + CRC_START : position + size]))
        CRC_FIELD.pack_into(data, position + CRC_POS, crc)
    path.write_bytes(bytes(data))


def envelope(*, with_crc: bool = True, **fields: Any) -> bytes:
    """A Liftbridge client's NATS publish: a protobuf ``Message`` in the envelope."""
    return encode_envelope(MessageType.PUBLISH, api_pb2.Message(**fields).SerializeToString(), with_crc)


async def receive(stub: Stub, stream: str, count: int, partition: int = 0) -> list[api_pb2.Message]:
    """Subscribe from the earliest message and wait for ``count`` messages."""
    async with subscription(stub, stream, partition, startPosition=api_pb2.EARLIEST) as tail:
        return await tail.take(count)


@contextlib.asynccontextmanager
async def inbox(nc: Any, subject: str) -> AsyncIterator[asyncio.Queue[bytes]]:
    """A NATS subscription whose messages land in a queue."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_message(msg: Any) -> None:
        queue.put_nowait(msg.data)

    sub = await nc.subscribe(subject, cb=on_message)
    await subscribed(nc)
    try:
        yield queue
    finally:
        await sub.unsubscribe()


def parse_ack(data: bytes) -> api_pb2.Ack:
    env = parse_envelope(data)
    assert env is not None and env.msg_type is MessageType.ACK, data
    return api_pb2.Ack.FromString(bytes(env.payload))


async def connect(broker: Broker) -> Connection:
    assert broker.wire is not None
    return await Connection.open("127.0.0.1", broker.wire.port)


def records(count: int, size: int = 1000, first: int = 0) -> tuple[bytes, int]:
    builder = BatchBuilder(1_000)
    for _ in range(first):
        builder.append(b"")
    builder.drain()
    for _ in range(count):
        builder.append(os.urandom(size))
    return builder.drain(), builder.first_timestamp


def begin(append_id: int, stream: str, **fields: Any) -> AppendRequest:
    return AppendRequest(append_id, AppendPhase.BEGIN, stream, 0, first_timestamp=1_000, **fields)


async def consumed_values(address: str, stream: str) -> list[bytes | None]:
    """Every record value of ``stream`` partition 0, read with the client's consumer up to the end."""
    async with Consumer(address, stream, stop_at_end=True) as consumer:
        async with asyncio.timeout(BOUND):
            return [record.value async for record in consumer]


# A stream of BATCHES batches of PER_BATCH records (test_bit_rot, test_damage_repair); batch DAMAGED rots.
BATCHES = 12
PER_BATCH = 10
DAMAGED = 5  # the batch whose bytes rot: offsets 50..59
FIRST, LAST = DAMAGED * PER_BATCH, DAMAGED * PER_BATCH + PER_BATCH - 1
EVERY = list(range(BATCHES * PER_BATCH))


async def produce_batches(address: str, name: str) -> None:
    """BATCHES batches of PER_BATCH incompressible records each (segments of 4 KiB roll every other batch)."""
    async with Producer(address) as producer:
        for _ in range(BATCHES):
            for _ in range(PER_BATCH):
                await producer.send(name, os.urandom(150))
            await producer.flush()


def rot(data_dir: Path, name: str) -> Path:
    """Flip one byte inside the records of the batch at FIRST (its header stays sound) in a sealed segment of
    ``name``/0 under a broker's ``data_dir``; returns the segment file."""
    (partition_dir,) = data_dir.glob(f"streams/{name}@*/0")
    for path in sorted(partition_dir.glob("*.log"))[:-1]:  # sealed segments only
        data = path.read_bytes()
        for position, header in iter_batches(data):
            if header.base_offset == FIRST:
                assert header.last_offset == LAST, "the producer made batches of another size"
                flip_at = position + HEADER_SIZE + 5
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, bytes([data[flip_at] ^ 0xFF]), flip_at)
                finally:
                    os.close(fd)
                return path
    raise AssertionError(f"no sealed segment holds a batch at offset {FIRST}")


async def until(check: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Wait (bounded) until ``check`` holds: a condition across brokers, with no event to wait on."""
    deadline = time.monotonic() + BOUND
    while True:
        result = check()
        if result if isinstance(result, bool) else await result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# ---- encryption at rest ----

SECRET = b"secret-value-that-must-not-be-on-disk"
"""A value tests publish to encrypted streams and then look for in the segment files."""


def batches_in(data: bytes) -> list[bytes]:
    """The batches of a segment file's bytes (an active segment may end in zero-filled room)."""
    found = []
    position = 0
    while position + PREFIX.size <= len(data):
        _, length = PREFIX.unpack_from(data, position)
        if length <= 0:
            break
        found.append(data[position : position + LENGTH_FIELD_END + length])
        position += LENGTH_FIELD_END + length
    return found


def stored(data_dir: Path, stream: str) -> bytes:
    """Every batch in the segment files of ``stream`` on this broker, concatenated."""
    files = sorted((data_dir / "streams").glob(f"{stream}*/**/*.log"))
    return b"".join(b"".join(batches_in(p.read_bytes())) for p in files)


def open_files_under(pid: int, directory: Path) -> int:
    """How many file descriptors process ``pid`` holds on files under ``directory`` (a partition's segments)."""
    prefix = f"{directory.resolve()}/"
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed while listed
            if os.readlink(fd).startswith(prefix):
                count += 1
    return count


async def nats_subscriptions(monitor_url: str, subject: str) -> int:
    """How many subscriptions nats-server holds on ``subject`` (its monitoring endpoint ``/subsz?subs=1``)."""

    def get() -> Any:
        with urllib.request.urlopen(f"{monitor_url}/subsz?subs=1&limit=100000", timeout=BOUND) as answer:
            return json.load(answer)

    found = await asyncio.to_thread(get)
    return sum(1 for sub in found.get("subscriptions_list") or () if sub.get("subject") == subject)


@asynccontextmanager
async def producing(broker: Broker, stream: str, value: bytes, partitions: int = 2) -> AsyncIterator[None]:
    """A producer writing ``value`` round-robin to ``partitions`` of ``stream`` until the block ends (with a short
    pause every 50 records, so the loop also serves the broker's other clients)."""
    assert broker.wire is not None
    stop = asyncio.Event()

    async def produce() -> None:
        async with Producer(f"127.0.0.1:{broker.wire.port}") as producer:
            i = 0
            while not stop.is_set():
                await producer.send(stream, value, partition=i % partitions)
                i += 1
                if i % 50 == 0:
                    await producer.flush()
                    await asyncio.sleep(0.01)

    task = asyncio.create_task(produce())
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, BOUND)
