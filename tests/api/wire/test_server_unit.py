"""The wire server in-process, without NATS or etcd: a real ``Partition`` over a real ``Log``, a stub manager.

These pin down the session's own behaviour deterministically: replies leave in request order even when later
requests finish first, a connection over its in-flight limit is not read until replies leave, a long-poll is
woken by an append and by ``stop()``, large fetches go out through ``os.sendfile`` (including a reader too slow
for the socket buffer, which exercises the EAGAIN fallback), and broken byte streams get one error frame before
the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BOUND
from tidelog.api.wire.server import WireServer
from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.frames import FrameDecoder, Kind, Op, encode_frame_bytes
from tidelog.protocol.message_codec import decode_header, encode_message
from tidelog.protocol.messages import (
    Acks,
    ErrorBody,
    FetchRequest,
    FetchResponse,
    Header,
    ProduceRequest,
    ProduceResponse,
)
from tidelog.protocol.records import NewRecord, build_batch, decode_records, iter_batches
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log
from tidelog.testing.fakes import StubManager

NOW = 1_700_000_000_000_000_000


@dataclass
class Served:
    server: WireServer
    partition: Partition

    @property
    def port(self) -> int:
        return self.server.port


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **options: Any) -> AsyncIterator[Served]:
    """A wire server over one real partition (``options`` go to :class:`WireServer`)."""
    log = Log.open(tmp_path / "log", LogConfig(flush_policy=FlushPolicy.NEVER))
    stream = StreamRecord("s", "s", "", 1, 1, NOW)
    record = PartitionRecord("s", 0, ("b",), "b", ("b",))
    partition = Partition(stream, record, log, "b", min_isr=1)
    manager = StubManager({("s", 0): partition})
    config = BrokerConfig(data_dir=tmp_path, port=0, wire_port=0)
    ctx = BrokerContext("b", config, manager, admin=None, mirror=None, nc=None)  # type: ignore[arg-type]
    server = WireServer(ctx, "127.0.0.1", 0, **{"max_frame_bytes": 8 * 1024 * 1024, **options})
    await server.start()
    try:
        yield Served(server, partition)
    finally:
        await server.stop(grace=1.0)
        await partition.close()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(tmp_path) as served:
        yield served


class Peer:
    """A raw client: writes frames, reads frames, knows nothing of the client library."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.frames: list[Any] = []

    @classmethod
    async def connect(cls, port: int, sock: socket.socket | None = None) -> Peer:
        if sock is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            reader, writer = await asyncio.open_connection(sock=sock)
        return cls(reader, writer)

    def send(self, cid: int, header: Header, payload: bytes = b"") -> None:
        self.writer.writelines(encode_message(cid, header, payload))

    async def next(self) -> tuple[Kind, int, Header, bytes]:
        async with asyncio.timeout(BOUND):
            while not self.frames:
                data = await self.reader.read(1 << 20)
                assert data, "the server closed the connection"
                self.frames.extend(self.decoder.feed(data))
        frame = self.frames.pop(0)
        return frame.kind, frame.correlation_id, decode_header(frame.kind, frame.op, frame.header), bytes(frame.payload)

    async def closed(self) -> bool:
        async with asyncio.timeout(BOUND):
            return await self.reader.read(1) == b""

    def close(self) -> None:
        self.writer.close()


def batch(*values: bytes) -> bytes:
    return build_batch([NewRecord(v) for v in values], timestamp=NOW)


async def test_replies_leave_in_request_order_even_when_later_requests_finish_first(served: Served) -> None:
    peer = await Peer.connect(served.port)
    # Request 1 long-polls at the tail (offset 0 of an empty log); requests 2..4 produce and finish at once.
    peer.send(1, FetchRequest("s", 0, 0, max_wait_ms=int(BOUND * 1000)))
    for cid in (2, 3, 4):
        peer.send(cid, ProduceRequest("s", 0, Acks.LEADER), batch(b"r%d" % cid))
    kind, cid, _, payload = await peer.next()
    assert (kind, cid) == (Kind.RESPONSE, 1)
    assert [r.value for r in decode_records(payload)] == [b"r2"]  # woken by the first append
    answers = [await peer.next() for _ in range(3)]
    assert [a[1] for a in answers] == [2, 3, 4]
    assert [(a[2].base_offset, a[2].last_offset) for a in answers] == [(0, 0), (1, 1), (2, 2)]  # type: ignore[attr-defined]
    peer.close()


async def test_a_connection_at_its_in_flight_limit_is_not_read_until_a_reply_leaves(tmp_path: Path) -> None:
    async with serving(tmp_path, max_in_flight=2) as served:
        peer = await Peer.connect(served.port)
        # Two long-polls at the tail fill the connection's limit: a produce sent after them is not read...
        # (even when it arrives in the same read: it waits there, decoded but not admitted)
        peer.send(1, FetchRequest("s", 0, 0, max_wait_ms=700))
        peer.send(2, FetchRequest("s", 0, 0, max_wait_ms=700))
        await asyncio.sleep(0.1)
        peer.send(3, ProduceRequest("s", 0, Acks.LEADER), batch(b"held"))
        await asyncio.sleep(0.35)
        assert served.partition.log_end == 0
        # ...until the long-polls end (empty: nothing was appended) and their replies leave; then it is.
        for cid in (1, 2):
            kind, got, _, payload = await peer.next()
            assert (kind, got, payload) == (Kind.RESPONSE, cid, b"")
        kind, got, header, _ = await peer.next()
        assert (kind, got, header) == (Kind.RESPONSE, 3, ProduceResponse(0, 0))
        assert served.partition.log_end == 1
        peer.close()


async def test_a_long_poll_times_out_empty(served: Served) -> None:
    peer = await Peer.connect(served.port)
    started = time.monotonic()
    peer.send(7, FetchRequest("s", 0, 0, max_wait_ms=50))
    kind, cid, header, payload = await peer.next()
    assert (kind, cid, payload) == (Kind.RESPONSE, 7, b"")
    assert header == FetchResponse(0, 0, 0)
    assert time.monotonic() - started >= 0.04
    peer.close()


async def test_stop_answers_a_waiting_long_poll_at_once(served: Served) -> None:
    waiting = asyncio.Event()
    wait_for_data = served.partition.wait_for_data

    async def spy(offset: int, timeout: float | None) -> bool:
        waiting.set()
        return await wait_for_data(offset, timeout)

    served.partition.wait_for_data = spy  # type: ignore[method-assign]
    peer = await Peer.connect(served.port)
    peer.send(1, FetchRequest("s", 0, 0, max_wait_ms=int(BOUND * 1000)))
    await asyncio.wait_for(waiting.wait(), BOUND)
    started = time.monotonic()
    stopping = asyncio.create_task(served.server.stop(grace=BOUND))
    kind, cid, _, payload = await peer.next()
    assert (kind, cid, payload) == (Kind.RESPONSE, 1, b"")
    await asyncio.wait_for(stopping, BOUND)
    assert time.monotonic() - started < BOUND / 2
    assert await peer.closed()


async def test_a_large_fetch_goes_out_whole_even_to_a_slow_reader(served: Served) -> None:
    # Batches well beyond a socket buffer, read through a tiny receive buffer: sendfile hits EAGAIN and the
    # session falls back to the transport for a chunk at a time, without reordering a single byte.
    value = bytes(range(256)) * 1024  # 256 KiB
    written = [batch(value, b"%d" % i) for i in range(12)]
    for data in written:
        await served.partition.append(data, Acks.LEADER, 5.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", served.port))
    sock.setblocking(False)
    peer = await Peer.connect(served.port, sock=sock)
    peer.send(3, FetchRequest("s", 0, 0, max_bytes=64 * 1024 * 1024))
    peer.send(4, FetchRequest("s", 0, 6, max_bytes=1))  # the next reply must follow the large one intact
    received = b""
    _, cid, header, received = await peer.next()
    assert cid == 3
    assert isinstance(header, FetchResponse) and header.high_watermark == 24
    positions = [h.base_offset for _, h in iter_batches(received)]
    assert positions == list(range(0, 24, 2))
    assert [r.value for r in decode_records(received, 0)] == [value, b"0"]
    _, cid, _, second = await peer.next()
    assert cid == 4 and [h.base_offset for _, h in iter_batches(second)] == [6]
    peer.close()


async def test_unknown_stream_and_unknown_op_are_error_frames_and_the_connection_stays(served: Served) -> None:
    peer = await Peer.connect(served.port)
    peer.send(1, ProduceRequest("nope", 0), batch(b"x"))
    peer.writer.write(encode_frame_bytes(Kind.REQUEST, 999, 2, b"\x90"))
    peer.writer.write(encode_frame_bytes(Kind.REQUEST, Op.FETCH, 3, b"\xc1"))  # 0xc1 is never valid msgpack
    peer.writer.write(encode_frame_bytes(Kind.RESPONSE, Op.FETCH, 4, b""))  # clients send requests
    codes = []
    for expected in (1, 2, 3, 4):
        kind, cid, body, _ = await peer.next()
        assert (kind, cid) == (Kind.ERROR, expected) and isinstance(body, ErrorBody)
        codes.append(ErrorCode(body.code))
    assert codes == [
        ErrorCode.UNKNOWN_STREAM,
        ErrorCode.UNSUPPORTED,
        ErrorCode.INVALID_ARGUMENT,
        ErrorCode.INVALID_ARGUMENT,
    ]
    peer.send(5, ProduceRequest("s", 0, Acks.LEADER), batch(b"still here"))
    kind, cid, header, _ = await peer.next()
    assert (kind, cid) == (Kind.RESPONSE, 5) and isinstance(header, ProduceResponse)
    peer.close()


async def test_a_broken_frame_gets_an_error_frame_then_the_connection_closes(served: Served) -> None:
    peer = await Peer.connect(served.port)
    peer.send(1, FetchRequest("s", 0, 0, max_wait_ms=0))
    assert (await peer.next())[:2] == (Kind.RESPONSE, 1)
    bad_version = bytearray(encode_frame_bytes(Kind.REQUEST, Op.FETCH, 2, b"\x90"))
    bad_version[4] = 99
    peer.writer.write(bytes(bad_version))
    kind, cid, body, _ = await peer.next()
    assert (kind, cid) == (Kind.ERROR, 0) and isinstance(body, ErrorBody)
    assert body.code == ErrorCode.INVALID_ARGUMENT
    assert await peer.closed()


async def test_an_oversized_length_is_refused_from_its_prefix_alone(served: Served) -> None:
    peer = await Peer.connect(served.port)
    peer.writer.write((0xFFFF_FFF0).to_bytes(4, "big"))  # only the length: no body follows, none is awaited
    kind, cid, body, _ = await peer.next()
    assert (kind, cid) == (Kind.ERROR, 0) and isinstance(body, ErrorBody)
    assert body.code == ErrorCode.MESSAGE_TOO_LARGE
    assert await peer.closed()


async def test_acks_none_answers_without_offsets_and_still_appends_in_order(served: Served) -> None:
    peer = await Peer.connect(served.port)
    for cid in range(1, 6):
        peer.send(cid, ProduceRequest("s", 0, Acks.NONE), batch(b"n%d" % cid))
    for cid in range(1, 6):
        kind, got, header, _ = await peer.next()
        assert (kind, got, header) == (Kind.RESPONSE, cid, ProduceResponse(-1, -1))
    peer.send(9, FetchRequest("s", 0, 4, max_wait_ms=int(BOUND * 1000)))
    _, _, _, payload = await peer.next()
    assert [r.value for r in decode_records(payload)] == [b"n5"]
    peer.send(10, FetchRequest("s", 0, 0))
    _, _, _, payload = await peer.next()
    values = [r.value for pos, h in iter_batches(payload) for r in decode_records(payload, pos, header=h)]
    assert values == [b"n1", b"n2", b"n3", b"n4", b"n5"]
    peer.close()


async def test_a_client_that_leaves_does_not_keep_its_long_poll_waiting(served: Served) -> None:
    waiting, finished = asyncio.Event(), asyncio.Event()
    wait_for_data = served.partition.wait_for_data

    async def spy(offset: int, timeout: float | None) -> bool:
        waiting.set()
        try:
            return await wait_for_data(offset, timeout)
        finally:
            finished.set()

    served.partition.wait_for_data = spy  # type: ignore[method-assign]
    peer = await Peer.connect(served.port)
    peer.send(1, FetchRequest("s", 0, 0, max_wait_ms=600_000))
    await asyncio.wait_for(waiting.wait(), BOUND)
    peer.writer.close()
    await asyncio.wait_for(finished.wait(), BOUND)  # long before the ten minutes it asked for


async def test_replies_ready_while_an_earlier_one_is_still_being_sent_wait_their_turn(served: Served) -> None:
    # One request at a time: each reply is ready while its slot is first, so the handler writes it itself.
    peer = await Peer.connect(served.port)
    for cid in (1, 2, 3):
        peer.send(cid, ProduceRequest("s", 0, Acks.ALL), batch(b"one-%d" % cid))
        _, got, header, _ = await peer.next()
        assert got == cid and isinstance(header, ProduceResponse) and header.base_offset == cid - 1
    peer.close()
    # A large fetch to a slow reader is still being written when the produces behind it are answered: those
    # replies must not overtake it (nor each other), whichever path writes them.
    value = bytes(range(256)) * 4096  # 1 MiB: 8 of them are more than the kernel buffers of a slow reader
    for i in range(8):
        await served.partition.append(batch(value, b"%d" % i), Acks.LEADER, 5.0)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", served.port))
    sock.setblocking(False)
    slow = await Peer.connect(served.port, sock=sock)
    slow.send(10, FetchRequest("s", 0, 3, max_bytes=64 * 1024 * 1024))
    await asyncio.sleep(0.2)  # nothing read yet: the fetch's reply is stuck in the middle of being sent
    for cid in range(11, 61):
        slow.send(cid, ProduceRequest("s", 0, Acks.ALL), batch(b"r%d" % cid))
    _, cid, header, received = await slow.next()
    assert cid == 10 and isinstance(header, FetchResponse)
    batches = list(iter_batches(received))
    assert [h.base_offset for _, h in batches] == list(range(3, 19, 2))
    assert [r.value for r in decode_records(received, batches[-1][0])] == [value, b"7"]
    answers = [await slow.next() for _ in range(50)]
    assert [a[1] for a in answers] == list(range(11, 61))
    assert [a[2].base_offset for a in answers] == list(range(19, 69))  # type: ignore[attr-defined]
    slow.close()
