"""Liftbridge's SetCursor and FetchCursor through the generated stubs, against one real broker.

The broker runs with four ``__cursors`` partitions, so that the tests see cursors land in
``crc32("cursorId,stream,partition") % 4`` as Liftbridge clients compute it. Bad input is answered with its
precise status on any broker and stores nothing.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import grpc
import msgspec
import pytest

from tests.broker.conftest import broker_config
from tests.broker.helpers import Stub, bounded, create_stream, expect_code
from tests.helpers import BOUND
from tidelog.broker.cursors import CursorValue
from tidelog.broker.log_settings import log_config_for
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.records import decode_records, iter_batches
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

Code = grpc.StatusCode
PARTITIONS = 4


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {"cursors_stream_partitions": PARTITIONS}


async def cursors_created(broker: Broker) -> None:
    assert broker.mirror is not None
    await broker.mirror.wait_for(lambda s: len(s.partitions_of(CURSORS_STREAM)) == PARTITIONS, BOUND)


async def set_cursor(stub: Stub, stream: str, cursor_id: str, offset: int, partition: int = 0) -> None:
    request = api_pb2.SetCursorRequest(stream=stream, partition=partition, cursorId=cursor_id, offset=offset)
    await bounded(stub.SetCursor(request))


async def fetch_cursor(stub: Stub, stream: str, cursor_id: str, partition: int = 0) -> int:
    request = api_pb2.FetchCursorRequest(stream=stream, partition=partition, cursorId=cursor_id)
    response: api_pb2.FetchCursorResponse = await bounded(stub.FetchCursor(request))
    return response.offset


def stored_cursors(broker: Broker) -> dict[int, list[tuple[bytes, CursorValue]]]:
    """Every cursor record in each local ``__cursors`` partition, by partition."""
    assert broker.manager is not None
    found: dict[int, list[tuple[bytes, CursorValue]]] = {}
    for pid in range(PARTITIONS):
        partition = broker.manager.local(CURSORS_STREAM, pid)
        assert partition is not None
        data = partition.read_committed(partition.log_start, 1 << 24)
        found[pid] = [
            (record.key or b"", msgspec.msgpack.decode(record.value or b"", type=CursorValue))
            for pos, header in iter_batches(data)
            for record in decode_records(data, pos, header=header)
        ]
    return found


def cursor_records(broker: Broker) -> int:
    return sum(len(records) for records in stored_cursors(broker).values())


async def test_a_cursor_never_set_fetches_as_minus_one(stub: Stub, broker: Broker, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await cursors_created(broker)
    assert await fetch_cursor(stub, stream_name, "nobody") == -1


async def test_set_then_fetch_gives_the_newest_position(stub: Stub, broker: Broker, stream_name: str) -> None:
    await create_stream(stub, stream_name, partitions=2)
    await cursors_created(broker)
    await set_cursor(stub, stream_name, "reader", 41)
    await set_cursor(stub, stream_name, "reader", 42)
    await set_cursor(stub, stream_name, "reader", 7, partition=1)
    await set_cursor(stub, stream_name, "other", -1)

    assert await fetch_cursor(stub, stream_name, "reader") == 42
    assert await fetch_cursor(stub, stream_name, "reader", partition=1) == 7
    assert await fetch_cursor(stub, stream_name, "other") == -1


async def test_cursors_land_in_the_partition_liftbridge_clients_compute(
    stub: Stub, broker: Broker, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    await cursors_created(broker)
    ids = [f"c{i}" for i in range(12)]
    for number, cursor_id in enumerate(ids):
        await set_cursor(stub, stream_name, cursor_id, number)

    stored = stored_cursors(broker)
    for number, cursor_id in enumerate(ids):
        key = f"{cursor_id},{stream_name},0".encode()
        expected = zlib.crc32(key) % PARTITIONS
        assert (key, CursorValue(stream_name, 0, cursor_id, number)) in stored[expected]
        assert await fetch_cursor(stub, stream_name, cursor_id) == number
    assert len({zlib.crc32(f"{c},{stream_name},0".encode()) % PARTITIONS for c in ids}) > 1  # spread out


async def test_the_cache_is_rebuilt_from_the_log(stub: Stub, broker: Broker, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await cursors_created(broker)
    await set_cursor(stub, stream_name, "rebuilt", 5)
    await set_cursor(stub, stream_name, "rebuilt", 6)
    assert broker.cursors is not None
    broker.cursors._caches.clear()  # as on a new leadership: nothing cached

    assert await fetch_cursor(stub, stream_name, "rebuilt") == 6
    assert await fetch_cursor(stub, stream_name, "never") == -1


@pytest.mark.parametrize(
    ("cursor_id", "offset", "partition", "stream", "code", "says"),
    [
        ("", 1, 0, None, Code.INVALID_ARGUMENT, "cursor id is empty"),
        ("x" * 257, 1, 0, None, Code.INVALID_ARGUMENT, "at most 256"),
        ("é" * 129, 1, 0, None, Code.INVALID_ARGUMENT, "258 bytes"),
        ("c", -2, 0, None, Code.INVALID_ARGUMENT, "below -1"),
        ("c", 1, 0, "no-such-stream", Code.NOT_FOUND, "no stream named 'no-such-stream'"),
        ("c", 1, 1, None, Code.NOT_FOUND, "partitions 0..0, not 1"),
        ("c", 1, -1, None, Code.NOT_FOUND, "not -1"),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_stored(
    stub: Stub,
    broker: Broker,
    stream_name: str,
    cursor_id: str,
    offset: int,
    partition: int,
    stream: str | None,
    code: grpc.StatusCode,
    says: str,
) -> None:
    await create_stream(stub, stream_name)
    await cursors_created(broker)
    before = cursor_records(broker)
    target = stream or stream_name

    request = api_pb2.SetCursorRequest(stream=target, partition=partition, cursorId=cursor_id, offset=offset)
    assert says in await expect_code(code, stub.SetCursor(request))
    if offset >= -1:
        fetch = api_pb2.FetchCursorRequest(stream=target, partition=partition, cursorId=cursor_id)
        assert says in await expect_code(code, stub.FetchCursor(fetch))
    assert cursor_records(broker) == before


async def test_the_longest_cursor_id_is_accepted(stub: Stub, broker: Broker, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await cursors_created(broker)
    await set_cursor(stub, stream_name, "x" * 256, 3)
    assert await fetch_cursor(stub, stream_name, "x" * 256) == 3


async def test_the_cursors_stream_is_listed_and_reserved(stub: Stub, broker: Broker) -> None:
    await cursors_created(broker)
    response = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest()))
    listed = {s.name: s for s in response.streamMetadata}
    assert len(listed[CURSORS_STREAM].partitions) == PARTITIONS  # Liftbridge clients find the leaders here

    create = api_pb2.CreateStreamRequest(name=CURSORS_STREAM, subject="mine")
    assert "reserved" in await expect_code(Code.INVALID_ARGUMENT, stub.CreateStream(create))
    delete = api_pb2.DeleteStreamRequest(name=CURSORS_STREAM)
    assert "reserved" in await expect_code(Code.INVALID_ARGUMENT, stub.DeleteStream(delete))
    assert broker.mirror is not None and broker.mirror.snapshot.stream(CURSORS_STREAM) is not None


async def test_the_cursors_stream_is_compacted_and_never_cut_by_retention(broker: Broker) -> None:
    """A cursor nobody updated for longer than the broker's retention (7 days by default) must not go with its
    segment: only compaction may remove a cursor record, and only an older one of the same cursor."""
    await cursors_created(broker)
    assert broker.mirror is not None
    stream = broker.mirror.snapshot.stream(CURSORS_STREAM)
    assert stream is not None
    config = log_config_for(broker.config, stream)
    assert config.compact
    assert (config.retention_max_age_ms, config.retention_max_bytes, config.retention_max_messages) == (None,) * 3
    assert broker.config.retention_max_age_ms > 0  # the broker default that would otherwise apply


async def test_a_cursor_survives_a_broker_restart(tmp_path: Path) -> None:
    config = broker_config(tmp_path / "restarted")
    for expected in (-1, 17):
        broker = Broker(config)
        await broker.start()
        try:
            assert broker.grpc is not None and broker.mirror is not None
            await broker.mirror.wait_for(lambda s: s.stream(CURSORS_STREAM) is not None, BOUND)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
                stub = api_pb2_grpc.APIStub(channel)
                if expected == -1:
                    await create_stream(stub, "kept")
                    assert await fetch_cursor(stub, "kept", "durable") == -1
                    await set_cursor(stub, "kept", "durable", 17)
                else:
                    assert await fetch_cursor(stub, "kept", "durable") == expected
        finally:
            await broker.stop()


async def test_cursors_disabled_are_unimplemented(tmp_path: Path) -> None:
    broker = Broker(broker_config(tmp_path / "disabled", cursors_stream_partitions=0))
    await broker.start()
    try:
        assert broker.grpc is not None and broker.mirror is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await create_stream(stub, "plain")
            request = api_pb2.SetCursorRequest(stream="plain", cursorId="c", offset=1)
            assert "cursors_stream_partitions is 0" in await expect_code(Code.UNIMPLEMENTED, stub.SetCursor(request))
        assert broker.mirror.snapshot.stream(CURSORS_STREAM) is None
    finally:
        await broker.stop()
