"""API front processes (``api_front_processes``, issue 26): the Liftbridge API through a front behaves as the
broker's own, publishes are acknowledged only once stored, fronts restart when they die and stop with the broker.

The module's broker runs one front, which alone listens on the gRPC port: every call of these tests goes through
it. The Liftbridge API tests imported below run here unchanged, against the front (a fast subset of
``tests/api/rpc``: the handshake, subscriptions, publishes of every kind and their errors, metadata and admin).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.api.rpc.test_liftbridge_api import (
    ACK_TIMEOUT,
    MAX_MESSAGE,
    test_create_stream_with_partitions,
    test_fetch_metadata_of_named_streams,
    test_health_is_serving,
    test_pause_stream_then_a_publish_resumes_it,
    test_publish_async_errors_do_not_end_the_stream,
    test_publish_async_matches_responses_by_correlation_id,
    test_publish_async_none_policy_gets_no_response,
    test_publish_expected_offset,
    test_publish_size_limit,
    test_publish_to_unknown_stream_or_partition,
    test_subscribe_sends_the_handshake_then_waits_at_the_tail,
    test_subscribe_stop_offset,
)
from tests.api.rpc.test_publish_nats import test_publish_async_stores_each_once
from tests.broker.conftest import broker, broker_config, nc, stream_name, stub
from tests.broker.helpers import Stub, bounded, create_stream, read_until_stop, until
from tests.helpers import BOUND
from tidelog.api.rpc.call_principal import basic_authorization
from tidelog.broker.config_values import ConfigError
from tidelog.protocol._gen import api_pb2
from tidelog.protocol._gen.tidelog.v1 import admin_pb2, admin_pb2_grpc
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

__all__ = [
    "broker",
    "nc",
    "stream_name",
    "stub",
    "test_create_stream_with_partitions",
    "test_fetch_metadata_of_named_streams",
    "test_health_is_serving",
    "test_pause_stream_then_a_publish_resumes_it",
    "test_publish_async_errors_do_not_end_the_stream",
    "test_publish_async_matches_responses_by_correlation_id",
    "test_publish_async_none_policy_gets_no_response",
    "test_publish_async_stores_each_once",
    "test_publish_expected_offset",
    "test_publish_size_limit",
    "test_publish_to_unknown_stream_or_partition",
    "test_subscribe_sends_the_handshake_then_waits_at_the_tail",
    "test_subscribe_stop_offset",
]


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    return {
        "max_message_bytes": MAX_MESSAGE,
        "default_ack_timeout_ms": int(ACK_TIMEOUT * 1000),
        "api_front_processes": 1,
    }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_the_front_alone_listens_on_the_port(broker: Broker) -> None:
    assert broker.grpc is not None and broker.fronts is not None
    assert broker.grpc.internal_port not in (0, broker.grpc.port)
    assert len(broker.fronts.pids) == 1 and all(alive(pid) for pid in broker.fronts.pids)


async def test_every_acknowledged_publish_is_stored_at_its_offset(broker: Broker, stub: Stub, stream_name: str) -> None:
    """Through the front's own path (a wire produce to the leader: the front's connection to the broker's wire
    port, the only one in this module), not handed to the broker's gRPC service."""
    await create_stream(stub, stream_name)
    sent = [f"m{i}".encode() for i in range(300)]

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i, value in enumerate(sent):
            policy = api_pb2.AckPolicy.ALL if i % 3 == 0 else api_pb2.AckPolicy.LEADER
            yield api_pb2.PublishRequest(stream=stream_name, value=value, correlationId=str(i), ackPolicy=policy)

    acked: dict[int, bytes] = {}

    async def collect() -> None:
        async for response in stub.PublishAsync(requests()):
            assert not response.HasField("asyncError"), response
            acked[response.ack.offset] = sent[int(response.correlationId)]

    await bounded(collect())
    assert broker.wire is not None and broker.wire.connections >= 1
    stored = await read_until_stop(stub, stream_name)
    assert {m.offset: m.value for m in stored} == acked
    assert [m.value for m in stored] == sent  # in the order sent


async def test_the_admin_service_is_relayed(broker: Broker, stub: Stub, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    assert broker.grpc is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
        admin = admin_pb2_grpc.AdminStub(channel)
        answer = await bounded(admin.AddPartitions(admin_pb2.AddPartitionsRequest(stream=stream_name, partitions=2)))
    assert (answer.before, answer.after) == (1, 2)


async def test_a_front_that_dies_is_started_again_and_fronts_stop_with_the_broker(tmp_path: Path) -> None:
    started = Broker(broker_config(tmp_path, api_front_processes=1))
    await started.start()
    try:
        assert started.fronts is not None
        [first] = started.fronts.pids
        os.kill(first, signal.SIGKILL)
        fronts = started.fronts
        await until(lambda: fronts.restarts > 0, "the killed front started again")
        [second] = started.fronts.pids
        assert second != first and alive(second)
    finally:
        await started.stop()
    assert not alive(second)


async def test_fronts_are_refused_with_tls(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="api_front_processes"):
        broker_config(tmp_path, api_front_processes=1, tls_cert=cert, tls_key=cert)


async def test_a_front_refuses_passwords_as_the_plaintext_broker_does(stub: Stub, stream_name: str) -> None:
    """The front's own PublishAsync and a relayed call alike: UNAUTHENTICATED, nothing published.

    The publish stream sends its request only once the call has ended: the refusal comes from the call's headers,
    before any request is read, and a client still sending into a call the server has ended sees gRPC's own
    INTERNAL ("Internal error from Core") in place of the server's status, a race of the client library."""
    await create_stream(stub, stream_name)
    login = [basic_authorization("alice", "correct horse")]
    answered = asyncio.Event()

    async def one() -> AsyncIterator[api_pb2.PublishRequest]:
        await answered.wait()
        yield api_pb2.PublishRequest(stream=stream_name, value=b"v", correlationId="0")

    for call in (
        stub.PublishAsync(one(), metadata=login, timeout=BOUND).read(),
        stub.FetchMetadata(api_pb2.FetchMetadataRequest(), metadata=login, timeout=BOUND),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        answered.set()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "served only over TLS" in (refused.value.details() or "")
    assert await read_until_stop(stub, stream_name) == []
