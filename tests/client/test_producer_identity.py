"""An idempotent producer's identity comes from any broker; one that takes requests and never answers them (a
broker cut off from etcd, still reachable by clients) is asked last on the next try, so the identity comes from
another broker instead of timing out for ever against the first one listed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.client.conftest import address, broker, broker_settings
from tests.helpers import BOUND
from tidelog.client.cluster import Cluster
from tidelog.client.idempotence import ProducerIdentity

__all__ = ["address", "broker", "broker_settings"]

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the broker fixture's loop


@pytest_asyncio.fixture(loop_scope="module")
async def silent_broker() -> AsyncIterator[str]:
    """``host:port`` of a server that accepts connections and reads requests but never answers."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_broker_that_never_answers_is_asked_last_on_the_next_try(silent_broker: str, address: str) -> None:
    cluster = Cluster([silent_broker, address], request_timeout=1.0)
    identity = ProducerIdentity(cluster, None, on_ready=lambda: None, on_failed=lambda exc: None)
    try:
        await asyncio.wait_for(identity.initialize(), BOUND)
    finally:
        await cluster.close()
    assert identity.stamp.producer_id >= 0
