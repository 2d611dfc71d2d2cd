"""The client connection against a scripted in-process peer: matching by correlation id, errors, backpressure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from tidelog.api.errors import MessageTooLargeError, NotLeaderError, RequestTimeoutError, UnknownStreamError
from tidelog.api.wire.frames import Frame, FrameDecoder
from tidelog.api.wire.messages import (
    ListStreamsRequest,
    ListStreamsResponse,
    StreamSummary,
    encode_error,
    encode_message,
)
from tidelog.client import Connection, ConnectionClosedError

BOUND = 20.0
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
    from tidelog.testing.ports import free_port

    with pytest.raises(ConnectionClosedError):
        await Connection.open("127.0.0.1", free_port(), connect_timeout=BOUND)
