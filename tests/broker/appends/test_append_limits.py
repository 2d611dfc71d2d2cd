"""A connection's uncommitted transactional appends are capped, by count and by spooled bytes: a client cannot
fill the broker's data disk with appends it never commits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.broker.helpers import begin, connect, consumed_values, records
from tests.helpers import BOUND
from tidelog.client import Admin
from tidelog.protocol.errors import ErrorCode, OpenAppendsLimitError
from tidelog.protocol.messages import AppendPhase, AppendRequest, AppendResponse
from tidelog.server import Broker

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

MAX_OPEN = 4
MAX_APPEND = 1024 * 1024


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {
        "max_open_appends_per_connection": MAX_OPEN,
        "max_append_bytes": MAX_APPEND,
        "max_open_append_bytes_per_connection": 2 * MAX_APPEND,
        "append_min_rate_bytes": 0,
    }


@pytest.fixture
def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def test_one_append_more_than_the_connection_may_hold_open_is_refused(
    broker: Broker, address: str, stream_name: str
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    connection = await connect(broker)
    try:
        chunk, _ = records(1, size=100)
        for append_id in range(MAX_OPEN):
            opened = await connection.request(begin(append_id, stream_name), chunk, timeout=BOUND)
            assert isinstance(opened.header, AppendResponse) and opened.header.status == 0
        with pytest.raises(OpenAppendsLimitError, match=r"4 transactional appends open.*max_open_appends_per_conn"):
            await connection.request(begin(MAX_OPEN, stream_name), chunk, timeout=BOUND)
        await connection.request(AppendRequest(0, AppendPhase.ABORT), timeout=BOUND)
        await connection.request(begin(MAX_OPEN, stream_name), chunk, timeout=BOUND)  # room again
        for append_id in range(1, MAX_OPEN + 1):
            committed = await connection.request(AppendRequest(append_id, AppendPhase.COMMIT), timeout=BOUND)
            assert isinstance(committed.header, AppendResponse) and committed.header.status == 0
    finally:
        await connection.close()
    assert len(await consumed_values(address, stream_name)) == MAX_OPEN


async def test_a_chunk_past_the_connections_spooled_bytes_fails_its_append(
    broker: Broker, address: str, stream_name: str
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
    connection = await connect(broker)
    try:
        big, _ = records(900, size=1000)  # ~0.9 MiB each: two fit the connection's 2 MiB, a third chunk does not
        for append_id in (1, 2):
            opened = await connection.request(begin(append_id, stream_name), big, timeout=BOUND)
            assert isinstance(opened.header, AppendResponse) and opened.header.status == 0
        more, _ = records(300, size=1000, first=900)
        refused = await connection.request(AppendRequest(2, AppendPhase.CHUNK), more, timeout=BOUND)
        assert isinstance(refused.header, AppendResponse)
        assert refused.header.status == ErrorCode.OPEN_APPENDS_LIMIT
        assert "max_open_append_bytes_per_connection" in refused.header.message
        failed = await connection.request(AppendRequest(2, AppendPhase.COMMIT), timeout=BOUND)
        assert isinstance(failed.header, AppendResponse) and failed.header.status == ErrorCode.OPEN_APPENDS_LIMIT
        committed = await connection.request(AppendRequest(1, AppendPhase.COMMIT), timeout=BOUND)
        assert isinstance(committed.header, AppendResponse) and committed.header.status == 0
    finally:
        await connection.close()
    assert len(await consumed_values(address, stream_name)) == 900
