"""TcpProxy against a plain echo server: forwards, cuts (reset + black hole or refuse), heals, closes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.local.tcp_proxy import TcpProxy

SILENCE = 0.3  # how long a black-holed connection must stay silent: only bounds a negative check


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest_asyncio.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


@pytest_asyncio.fixture
async def proxy(echo_port: int) -> AsyncIterator[TcpProxy]:
    async with TcpProxy("127.0.0.1", echo_port) as started:
        yield started


async def _connect(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", proxy.port), BOUND)


async def _round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(data)), BOUND)


async def test_forwards_both_ways(proxy: TcpProxy) -> None:
    reader, writer = await _connect(proxy)
    big = bytes(range(256)) * 4096  # 1 MiB: several chunks each way
    assert await _round_trip(reader, writer, b"hello") == b"hello"
    assert await _round_trip(reader, writer, big) == big
    assert proxy.open_connections == 1
    writer.close()


async def test_client_eof_reaches_the_target(proxy: TcpProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"last words")
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), BOUND) == b"last words"  # echoed, then the target closed
    writer.close()


async def test_cut_resets_open_connections_and_black_holes_new_ones(proxy: TcpProxy) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"before") == b"before"
    proxy.cut()
    assert proxy.is_cut
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _round_trip(reader, writer, b"after")
    writer.close()

    hole_reader, hole_writer = await _connect(proxy)  # accepted ...
    hole_writer.write(b"anyone there?")
    await hole_writer.drain()
    with pytest.raises(TimeoutError):  # ... but nothing ever comes back
        await asyncio.wait_for(hole_reader.read(1), SILENCE)

    proxy.heal()
    # The black-holed connection is closed by the heal, as one across a real partition would be dead.
    assert await asyncio.wait_for(_read_or_reset(hole_reader), BOUND) == b""
    hole_writer.close()

    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"healed") == b"healed"
    writer.close()


async def test_cut_refusing_closes_new_connections(proxy: TcpProxy) -> None:
    proxy.cut(refuse=True)
    reader, writer = await _connect(proxy)
    assert await asyncio.wait_for(_read_or_reset(reader), BOUND) == b""
    writer.close()
    assert proxy.connections_total == 1


async def test_unreachable_target_resets_the_client(echo_port: int) -> None:
    async with TcpProxy("127.0.0.1", 1) as proxy:  # nothing listens on port 1
        reader, writer = await _connect(proxy)
        assert await asyncio.wait_for(_read_or_reset(reader), BOUND) == b""
        writer.close()


async def test_close_drops_connections_and_stops_listening(echo_port: int) -> None:
    proxy = TcpProxy("127.0.0.1", echo_port)
    await proxy.start()
    port = proxy.port
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"x") == b"x"
    await proxy.close()
    await proxy.close()  # idempotent
    assert await asyncio.wait_for(_read_or_reset(reader), BOUND) == b""
    writer.close()
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), BOUND)


async def _read_or_reset(reader: asyncio.StreamReader) -> bytes:
    """What a closed connection reads: end of stream, or a reset (both mean the peer is gone)."""
    try:
        return await reader.read(1)
    except ConnectionError:
        return b""
