"""The APPEND op against a real broker, frame by frame: every way an append can end without committing leaves
no record and uses no offset — an ABORT, a dropped connection, a client below the minimum rate, a malformed
chunk — and a second append then lands at the offset the first would have taken."""

from __future__ import annotations

import asyncio
from typing import Any

import crc32c
import pytest

from tests.broker.helpers import begin, connect, consumed_values, records
from tidelog.client import Admin, Appender
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import AppendPhase, AppendRequest, AppendResponse
from tidelog.server import Broker

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    # A short rate window, so a stalled client is caught within a test's patience.
    return {"append_min_rate_bytes": 1024, "append_rate_window_ms": 400}


@pytest.fixture
def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def prove_nothing_stored(address: str, stream: str) -> None:
    """Nothing is visible, and the next append takes offset 0: no offset was used up."""
    assert await consumed_values(address, stream) == []
    async with Appender(address) as appender:
        outcome = await appender.append(stream, 0, [b"next"], expected_offset=0)
    assert outcome.base_offset == 0
    assert await consumed_values(address, stream) == [b"next"]


async def create(address: str, stream: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream)


async def test_abort_leaves_nothing(broker: Broker, address: str, stream_name: str) -> None:
    await create(address, stream_name)
    connection = await connect(broker)
    try:
        chunk, _ = records(50)
        more, _ = records(50, first=50)
        answers = [
            connection.send(begin(1, stream_name), chunk),
            connection.send(AppendRequest(1, AppendPhase.CHUNK), more),
            connection.send(AppendRequest(1, AppendPhase.ABORT)),
        ]
        for answer in await asyncio.gather(*answers):
            assert isinstance(answer.header, AppendResponse) and answer.header.status == 0
    finally:
        await connection.close()
    await prove_nothing_stored(address, stream_name)


async def test_a_dropped_connection_leaves_nothing(broker: Broker, address: str, stream_name: str) -> None:
    """Chunks of a 3 MB append (spooled to a file) are sent, then the socket is closed without a COMMIT."""
    await create(address, stream_name)
    connection = await connect(broker)
    chunk, _ = records(1000, first=0)
    first = await connection.request(begin(7, stream_name), chunk)
    assert isinstance(first.header, AppendResponse) and first.header.status == 0
    assert first.header.log_end == 0  # every answer carries the log end (and registers) the leader knows
    for i in range(2):
        more, _ = records(1000, first=1000 * (i + 1))
        await connection.request(AppendRequest(7, AppendPhase.CHUNK), more)
    await connection.close()
    await asyncio.sleep(0.2)
    await prove_nothing_stored(address, stream_name)
    spool = broker.config.data_dir / ".appends"
    assert not list(spool.iterdir())  # the spool file was never named: nothing to clean up


async def test_a_client_below_the_minimum_rate_is_aborted(broker: Broker, address: str, stream_name: str) -> None:
    await create(address, stream_name)
    connection = await connect(broker)
    try:
        chunk, _ = records(1, size=100)
        await connection.request(begin(3, stream_name), chunk)
        await asyncio.sleep(1.0)  # far below 1024 bytes/s over the 0.4 s window
        late = await connection.request(AppendRequest(3, AppendPhase.COMMIT))
    finally:
        await connection.close()
    assert isinstance(late.header, AppendResponse)
    assert late.header.status == ErrorCode.APPEND_TOO_SLOW
    assert "append_min_rate_bytes" in late.header.message
    await prove_nothing_stored(address, stream_name)


async def test_a_chunk_with_a_wrong_count_or_crc_is_refused(broker: Broker, address: str, stream_name: str) -> None:
    await create(address, stream_name)
    chunk, _ = records(10)
    connection = await connect(broker)
    try:
        for append_id, declared in ((11, {"records": 9, "crc": crc32c.crc32c(chunk)}), (12, {"records": 10, "crc": 1})):
            header = begin(append_id, stream_name, max_timestamp=1_000, **declared)
            await connection.request(header, chunk)
            outcome = await connection.request(AppendRequest(append_id, AppendPhase.COMMIT))
            assert isinstance(outcome.header, AppendResponse)
            assert outcome.header.status == ErrorCode.INVALID_ARGUMENT, outcome.header
        garbage = await connection.request(begin(13, stream_name), b"\x00\x01\x02 not records")
        assert isinstance(garbage.header, AppendResponse) and garbage.header.status == ErrorCode.INVALID_ARGUMENT
        await connection.request(AppendRequest(13, AppendPhase.ABORT))
    finally:
        await connection.close()
    await prove_nothing_stored(address, stream_name)


async def test_a_client_cannot_smuggle_registers_through_produce(
    broker: Broker, address: str, stream_name: str
) -> None:
    """Registers change only through transactional appends: a produced batch with a registers block is refused."""
    from tidelog.protocol.errors import TidelogError
    from tidelog.protocol.messages import ProduceRequest
    from tidelog.protocol.records import NewRecord, build_batch

    await create(address, stream_name)
    batch = build_batch([NewRecord(b"x")], timestamp=1, registers=b"\x01anything")
    connection = await connect(broker)
    try:
        with pytest.raises(TidelogError, match="registers"):
            await connection.request(ProduceRequest(stream_name, 0), batch)
    finally:
        await connection.close()
    await prove_nothing_stored(address, stream_name)
