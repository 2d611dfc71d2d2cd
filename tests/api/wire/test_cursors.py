"""Cursors over the tidelog wire protocol (SET_CURSOR, FETCH_CURSOR): the native client stores and reads consumer
positions without gRPC, in the same ``__cursors`` stream the Liftbridge RPCs use, with the same errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.broker.conftest import broker, broker_config, broker_settings, stream_name, stub
from tests.broker.helpers import Stub, bounded
from tests.helpers import BOUND
from tidelog.client import Admin
from tidelog.client.sync import SyncAdmin
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.connection import Connection
from tidelog.protocol.cursor_messages import FetchCursorRequest, FetchCursorResponse, SetCursorRequest
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.errors import (
    InvalidArgumentError,
    UnknownPartitionError,
    UnknownStreamError,
    UnsupportedError,
)
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stream_name", "stub"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def ready(broker: Broker, admin: Admin, stream: str, partitions: int = 1) -> None:
    assert broker.mirror is not None
    await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)
    await admin.create_stream(stream, partitions=partitions)


async def test_the_native_client_sets_and_fetches_cursors(broker: Broker, address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await ready(broker, admin, stream_name, partitions=2)
        assert await admin.fetch_cursor(stream_name, 0, "app") == -1
        await admin.set_cursor(stream_name, 0, "app", 10)
        await admin.set_cursor(stream_name, 1, "app", 3)
        await admin.set_cursor(stream_name, 0, "app", 11)
        assert await admin.fetch_cursor(stream_name, 0, "app") == 11
        assert await admin.fetch_cursor(stream_name, 1, "app") == 3


async def test_wire_and_grpc_share_one_store(broker: Broker, address: str, stream_name: str, stub: Stub) -> None:
    async with Admin(address) as admin:
        await ready(broker, admin, stream_name)
        await admin.set_cursor(stream_name, 0, "shared", 99)
        request = api_pb2.FetchCursorRequest(stream=stream_name, partition=0, cursorId="shared")
        response = await bounded(stub.FetchCursor(request))
        assert response.offset == 99
        set_request = api_pb2.SetCursorRequest(stream=stream_name, partition=0, cursorId="shared", offset=100)
        await bounded(stub.SetCursor(set_request))
        assert await admin.fetch_cursor(stream_name, 0, "shared") == 100


@pytest.mark.parametrize(
    ("cursor_id", "offset", "partition", "stream", "error", "says"),
    [
        ("", 1, 0, None, InvalidArgumentError, "cursor id is empty"),
        ("x" * 257, 1, 0, None, InvalidArgumentError, "at most 256"),
        ("c", -2, 0, None, InvalidArgumentError, "below -1"),
        ("c", 1, 0, "no-such-stream", UnknownStreamError, "no stream named 'no-such-stream'"),
        ("c", 1, 3, None, UnknownPartitionError, "partitions 0..0, not 3"),
    ],
)
async def test_bad_input_gets_its_error(
    broker: Broker,
    address: str,
    stream_name: str,
    cursor_id: str,
    offset: int,
    partition: int,
    stream: str | None,
    error: type[Exception],
    says: str,
) -> None:
    async with Admin(address) as admin:
        await ready(broker, admin, stream_name)
        target = stream or stream_name
        with pytest.raises(error, match=says):
            await admin.set_cursor(target, partition, cursor_id, offset)
        if offset >= -1:
            with pytest.raises(error, match=says):
                await admin.fetch_cursor(target, partition, cursor_id)


async def test_a_frame_with_an_offset_below_minus_one_is_refused(broker: Broker, stream_name: str) -> None:
    """The header itself bounds the offset: a peer that skips the client's checks is still refused."""
    assert broker.wire is not None
    connection = await Connection.open("127.0.0.1", broker.wire.port)
    try:
        with pytest.raises(InvalidArgumentError):
            await connection.request(SetCursorRequest(stream_name, 0, "c", -5), timeout=BOUND)
        response = await connection.request(FetchCursorRequest(CURSORS_STREAM, 0, "c"), timeout=BOUND)
        assert isinstance(response.header, FetchCursorResponse) and response.header.offset == -1
    finally:
        await connection.close()


async def test_the_sync_facade(broker: Broker, address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await ready(broker, admin, stream_name)

    def use() -> tuple[int, int]:
        with SyncAdmin(address) as sync:
            before = sync.fetch_cursor(stream_name, 0, "threaded")
            sync.set_cursor(stream_name, 0, "threaded", 5)
            return before, sync.fetch_cursor(stream_name, 0, "threaded")

    assert await asyncio.wait_for(asyncio.to_thread(use), BOUND) == (-1, 5)


async def test_with_cursors_disabled_the_client_hears_why(tmp_path: Path) -> None:
    disabled = Broker(broker_config(tmp_path / "disabled", cursors_stream_partitions=0))
    await disabled.start()
    try:
        assert disabled.wire is not None
        async with Admin(f"127.0.0.1:{disabled.wire.port}") as admin:
            await admin.create_stream("plain")
            with pytest.raises(UnsupportedError, match="cursors_stream_partitions is 0"):
                await admin.set_cursor("plain", 0, "c", 1)
            with pytest.raises(UnknownStreamError):  # bad input still comes first
                await admin.fetch_cursor("missing", 0, "c")
    finally:
        await disabled.stop()
