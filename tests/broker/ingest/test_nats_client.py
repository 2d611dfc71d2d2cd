"""BrokerNats against a real nats-server: a connection the server closes for good is replaced, subscriptions too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import pytest_asyncio

from tests.broker.helpers import bounded, subscribed
from tests.helpers import BOUND
from tidelog.broker.embedded import EmbeddedNats
from tidelog.broker.ingest.nats_client import BrokerNats

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedNats]:
    started = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def test_a_connection_the_server_closes_is_replaced(server: EmbeddedNats) -> None:
    client = BrokerNats([server.url], name="test-broker")
    await client.connect()
    other = await nats.connect(server.url, connect_timeout=BOUND, allow_reconnect=False)
    received: asyncio.Queue[bytes] = asyncio.Queue()
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_received(msg: Any) -> None:
        received.put_nowait(msg.data)

    async def on_seen(msg: Any) -> None:
        seen.put_nowait(msg.data)

    try:
        await client.subscribe("to-broker", cb=on_received)
        await subscribed(client)
        await other.subscribe("from-broker", cb=on_seen)
        await subscribed(other)

        # A subject longer than the server's max control line (4096): nats-server answers -ERR and closes.
        await client.publish("x" * 5000, b"too long")
        await bounded(client.wait_generation(2))

        await client.publish("from-broker", b"after")  # publishing works again
        await client.flush()
        assert await bounded(seen.get()) == b"after"
        await other.publish("to-broker", b"still subscribed")  # and the subscription was made again
        await other.flush()
        assert await bounded(received.get()) == b"still subscribed"
    finally:
        await other.close()
        await client.close()
