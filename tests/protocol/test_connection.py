"""The client connection against a scripted in-process peer: matching by correlation id, errors, backpressure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from tests.helpers import BOUND
from tidelog.client import Connection, ConnectionClosedError
from tidelog.protocol.errors import MessageTooLargeError, NotLeaderError, RequestTimeoutError, UnknownStreamError
from tidelog.protocol.frames import Frame, FrameDecoder
from tidelog.protocol.message_codec import encode_error, encode_message
from tidelog.protocol.messages import ListStreamsRequest, ListStreamsResponse, StreamSummary

Script = Callable[[list[Frame], asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def peer(script: Script, expect: int) -> AsyncIterator[Connection]:
    """A server that collects ``expect`` request frames, then runs ``script`` on them; and a connection to it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while len(frames) < expect:
            data = await reader.read(65536)
            if not data:
                return
            frames.extend(decoder.feed(data))
        await script(frames, writer)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    connection = await Connection.open("127.0.0.1", server.sockets[0].getsockname()[1], max_in_flight=4)
    try:
        yield connection
    finally:
        await connection.close()
        server.close()


def listing(name: str) -> ListStreamsResponse:
    return ListStreamsResponse((StreamSummary(name, name, 1, 1),))


async def test_responses_in_any_order_reach_their_requests() -> None:
    async def reverse(frames: list[Frame], writer: asyncio.StreamWriter) -> None:
        for frame in reversed(frames):
            writer.writelines(encode_message(frame.correlation_id, listing(f"s{frame.correlation_id}")))

    async with peer(reverse, expect=3) as connection:
        futures = [connection.send(ListStreamsRequest()) for _ in range(3)]
        responses = await asyncio.wait_for(asyncio.gather(*futures), BOUND)
        names = [r.header.streams[0].name for r in responses]  # type: ignore[attr-defined]
        assert names == ["s1", "s2", "s3"]
        assert connection.in_flight == 0


async def test_error_frames_raise_the_matching_error_and_the_connection_stays() -> None:
    async def errors(frames: list[Frame], writer: asyncio.StreamWriter) -> None:
        first, second = frames
        writer.writelines(encode_error(first.correlation_id, first.op, UnknownStreamError("gone").to_error_body()))
        writer.writelines(encode_error(second.correlation_id, second.op, NotLeaderError().to_error_body()))

    async with peer(errors, expect=2) as connection:
        first, second = connection.send(ListStreamsRequest()), connection.send(ListStreamsRequest())
        with pytest.raises(UnknownStreamError, match="gone"):
            await asyncio.wait_for(first, BOUND)
        with pytest.raises(NotLeaderError) as info:
            await asyncio.wait_for(second, BOUND)
        assert info.value.retriable
        assert not connection.closed


async def test_a_lost_connection_fails_every_pending_request() -> None:
    async def hang_up(frames: list[Frame], writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with peer(hang_up, expect=2) as connection:
        futures = [connection.send(ListStreamsRequest()) for _ in range(2)]
        for future in futures:
            with pytest.raises(ConnectionClosedError):
                await asyncio.wait_for(future, BOUND)
        assert connection.closed
        with pytest.raises(ConnectionClosedError):
            connection.send(ListStreamsRequest())


async def test_the_brokers_reason_for_closing_reaches_pending_requests() -> None:
    async def refuse(frames: list[Frame], writer: asyncio.StreamWriter) -> None:
        # What the server sends when it cannot parse the byte stream: correlation id 0, then it hangs up.
        body = MessageTooLargeError("frame of 99 bytes exceeds the limit").to_error_body()
        writer.writelines(encode_error(0, 0, body))
        writer.close()

    async with peer(refuse, expect=1) as connection:
        with pytest.raises(MessageTooLargeError):
            await asyncio.wait_for(connection.send(ListStreamsRequest()), BOUND)


async def test_in_flight_requests_are_bounded_and_a_timeout_is_a_timeout() -> None:
    answered = asyncio.Event()

    async def answer_first_later(frames: list[Frame], writer: asyncio.StreamWriter) -> None:
        await answered.wait()
        writer.writelines(encode_message(frames[0].correlation_id, listing("late")))

    async with peer(answer_first_later, expect=4) as connection:
        futures = [connection.send(ListStreamsRequest()) for _ in range(4)]  # max_in_flight is 4
        room = asyncio.ensure_future(connection.wait_writable())
        await asyncio.sleep(0)
        assert not room.done()
        answered.set()
        await asyncio.wait_for(room, BOUND)
        assert connection.in_flight == 3
        assert (await futures[0]).header == listing("late")
        with pytest.raises(RequestTimeoutError):
            await connection.request(ListStreamsRequest(), timeout=0.05)
        await connection.close()
        for unanswered in futures[1:]:
            with pytest.raises(ConnectionClosedError):
                await unanswered


async def test_an_unreachable_address_is_a_connection_error() -> None:
    from tidelog.launch.ports import free_port

    with pytest.raises(ConnectionClosedError):
        await Connection.open("127.0.0.1", free_port(), connect_timeout=BOUND)


class _Transport:
    """Stands in for a socket transport: records writes, notes an abort."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def writelines(self, parts: list[bytes]) -> None:
        self.written.append(b"".join(parts))

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass


def _deliver(connection: Connection, data: bytes, step: int) -> None:
    """Hand ``data`` to the connection as a socket would: into its buffers, at most ``step`` bytes per read."""
    position = 0
    while position < len(data):
        buffer = connection.get_buffer(-1)
        n = min(step, len(buffer), len(data) - position)
        buffer[:n] = data[position : position + n]
        connection.buffer_updated(n)
        position += n


@pytest.mark.parametrize("step", [1, 7, 4096, 65536, 300_000, 10_000_000])
async def test_responses_split_anywhere_arrive_whole_and_byte_identical(step: int) -> None:
    """Small frames (through the scratch buffer) and large ones (read into their own buffer), cut at any point."""
    connection = Connection("test", max_frame_bytes=8 * 1024 * 1024, max_in_flight=64)
    transport = _Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    sizes = [0, 10, 40_000, 3, 1_500_000, 31 * 1024, 32 * 1024, 300_000, 5]
    if step == 1:
        sizes = [0, 10, 40_000, 3, 33_000, 5]  # byte by byte: keep it quick
    payloads = [bytes((i * 31 + j) % 251 for j in range(size)) for i, size in enumerate(sizes)]
    futures = [connection.send(ListStreamsRequest()) for _ in payloads]
    stream = b"".join(
        b"".join(encode_message(cid, listing(f"s{cid}"), payload)) for cid, payload in enumerate(payloads, 1)
    )
    _deliver(connection, stream, step)
    for cid, (future, payload) in enumerate(zip(futures, payloads, strict=True), 1):
        response = future.result()
        assert response.header.streams[0].name == f"s{cid}"  # type: ignore[attr-defined]
        assert bytes(response.payload) == payload
        assert response.payload.readonly
    assert connection.in_flight == 0
    assert not transport.aborted


async def test_a_frame_over_the_limit_breaks_the_connection_before_it_is_buffered() -> None:
    connection = Connection("test", max_frame_bytes=64 * 1024, max_in_flight=4)
    transport = _Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    future = connection.send(ListStreamsRequest())
    frame = b"".join(encode_message(1, listing("s"), bytes(100_000)))
    _deliver(connection, frame[:8], 8)
    assert transport.aborted
    with pytest.raises(ConnectionClosedError, match="exceeds the limit"):
        future.result()
    _deliver(connection, frame[8:100], 100)  # whatever still arrives is ignored
    assert connection.closed


async def test_a_large_frame_with_a_bad_version_breaks_the_connection() -> None:
    connection = Connection("test", max_frame_bytes=1024 * 1024, max_in_flight=4)
    transport = _Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    future = connection.send(ListStreamsRequest())
    frame = bytearray(b"".join(encode_message(1, listing("s"), bytes(100_000))))
    frame[4] = 99  # the wire version
    _deliver(connection, bytes(frame), 65536)
    assert transport.aborted
    with pytest.raises(ConnectionClosedError, match="version"):
        future.result()
