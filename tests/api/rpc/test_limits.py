"""The gRPC server's bounds (issue 23, item 6): calls open at once over all connections
(``grpc_max_concurrent_rpcs``), and the broker's settings reaching both servers."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from tests.broker.helpers import Stub, bounded, create_stream, expect_code
from tests.helpers import BOUND
from tidelog.protocol._gen import api_pb2
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

CALLS = 3


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {
        "grpc_max_concurrent_rpcs": CALLS,
        "wire_max_connections": 500,
        "wire_max_connections_per_ip": 400,
        "wire_max_in_flight": 32,
    }


async def test_a_call_over_the_concurrent_limit_is_refused_and_one_ending_makes_room(
    broker: Broker, stub: Stub, stream_name: str
) -> None:
    await create_stream(stub, stream_name)
    request = api_pb2.SubscribeRequest(stream=stream_name)
    subscriptions = [stub.Subscribe(request) for _ in range(CALLS)]
    for call in subscriptions:
        assert await bounded(call.read()) == api_pb2.Message()  # the handshake: each one is open
    details = await expect_code(grpc.StatusCode.RESOURCE_EXHAUSTED, stub.Subscribe(request).read())
    assert details
    subscriptions.pop().cancel()
    deadline = time.monotonic() + BOUND
    while True:  # the server counts the cancelled call out as it notices it
        try:
            await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest()))
            break
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
    for call in subscriptions:
        call.cancel()


async def test_the_wire_limits_come_from_the_settings(broker: Broker) -> None:
    assert broker.wire is not None
    assert (broker.wire.limits.max_connections, broker.wire.limits.max_per_address) == (500, 400)
