"""The TLS pre-check reads an untrusted greeting: one that is not a JSON object is not a NATS server's, and is
left to nats-py rather than crashing the check (found by fuzzing the INFO parser)."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import BOUND
from tidelog.broker.ingest.nats_client import refuse_servers_in_clear

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("body", [b"[" * 50_000, b"[1, 2]", b"not json"], ids=["deep", "array", "garbage"])
async def test_a_greeting_that_is_no_json_object_is_not_a_nats_server(body: bytes) -> None:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"INFO " + body + b"\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        await refuse_servers_in_clear([f"127.0.0.1:{port}"], BOUND)
    finally:
        server.close()
        await server.wait_closed()
