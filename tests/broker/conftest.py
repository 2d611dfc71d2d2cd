"""Fixtures for tests that talk to one real broker: the broker itself, a gRPC stub and a NATS client.

The broker runs in-process (so a test may look at its partitions) with its embedded nats-server and etcd as
child processes, everything on free loopback ports and under a temporary directory. Starting one takes about a
second, so the broker, the stub and the NATS client are module-scoped: tests of a module share them and keep
out of each other's way by using their own streams (see :func:`stream_name`). A module that shares them must run
its tests on the module's event loop: ``pytestmark = pytest.mark.asyncio(loop_scope="module")``.

A module that needs other broker settings overrides the ``broker_settings`` fixture.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.broker.config import BrokerConfig
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.server import Broker


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, Any]:
    """``BrokerConfig`` fields a module wants on top of the free-port defaults."""
    return {}


def broker_config(data_dir: Path, **settings: Any) -> BrokerConfig:
    """A broker on free loopback ports (gRPC, wire, embedded NATS and etcd) keeping its data in ``data_dir``."""
    return BrokerConfig(data_dir=data_dir, port=0, wire_port=0, http_port=0, embedded_nats_port=0, **settings)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory, broker_settings: dict[str, Any]) -> AsyncIterator[Broker]:
    started = Broker(broker_config(tmp_path_factory.mktemp("broker"), **broker_settings))
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stub(broker: Broker) -> AsyncIterator[api_pb2_grpc.APIStub]:
    """A ``proto.API`` client, as any Liftbridge client library holds one."""
    assert broker.grpc is not None
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}")
    try:
        await channel.channel_ready()
        yield api_pb2_grpc.APIStub(channel)
    finally:
        await channel.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def nc(broker: Broker) -> AsyncIterator[Any]:
    """A plain nats-py client connected to the broker's NATS."""
    client = await nats.connect(broker.nats_urls, connect_timeout=BOUND, allow_reconnect=False)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> str:
    """A stream name (and NATS subject) of this test's own, so tests sharing a broker never collide."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-")[:200]
