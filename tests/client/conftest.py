"""Client tests run against a real broker (embedded NATS and etcd): the fixtures are the broker tests' own.

The broker is module-scoped, so a module using it runs on the module's event loop
(``pytestmark = pytest.mark.asyncio(loop_scope="module")``) and each test uses its own stream names.
"""

from __future__ import annotations

import pytest

from tests.broker.conftest import broker, broker_settings, stream_name
from tidelog.server import Broker

__all__ = ["address", "broker", "broker_settings", "stream_name"]


@pytest.fixture
def address(broker: Broker) -> str:
    """``host:port`` of the broker's wire protocol, what every client object takes as its bootstrap."""
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"
