"""Every ``CreateStream`` override is honoured (it reaches the partition's log) or refused with INVALID_ARGUMENT
naming it; the compaction lag is set through the native client's stream settings."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from tests.broker.helpers import Stub, create_stream, expect_code
from tidelog.client import Admin
from tidelog.protocol._gen import api_pb2
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

I64 = api_pb2.NullableInt64
I32 = api_pb2.NullableInt32
BOOL = api_pb2.NullableBool


async def test_the_log_settings_of_create_stream_reach_the_partition_log(
    stub: Stub, broker: Broker, stream_name: str
) -> None:
    assert broker.manager is not None
    await create_stream(
        stub,
        stream_name,
        retentionMaxBytes=I64(value=1 << 30),
        retentionMaxMessages=I64(value=1000),
        retentionMaxAge=I64(value=3_600_000),
        cleanerInterval=I64(value=1234),
        segmentMaxBytes=I64(value=1 << 20),
        segmentMaxAge=I64(value=60_000),
        compactMaxGoroutines=I32(value=3),
        compactEnabled=BOOL(value=True),
    )
    config = broker.manager.leader_of(stream_name, 0).log.config
    assert (config.retention_max_bytes, config.retention_max_messages, config.retention_max_age_ms) == (
        1 << 30,
        1000,
        3_600_000,
    )
    assert (config.segment_max_bytes, config.segment_max_age_ms) == (1 << 20, 60_000)
    assert config.cleaner_interval_ms == 1234
    assert config.compact_workers == 3
    assert config.compact


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"compactMaxGoroutines": I32(value=0)}, "compactMaxGoroutines"),
        ({"compactMaxGoroutines": I32(value=65)}, "compactMaxGoroutines"),
        ({"cleanerInterval": I64(value=0)}, "cleanerInterval"),
    ],
    ids=["no-compaction-workers", "too-many-compaction-workers", "no-cleaner-interval"],
)
async def test_an_override_tidelog_cannot_honour_is_refused_by_name(
    stub: Stub, stream_name: str, override: dict[str, Any], named: str
) -> None:
    details = await expect_code(grpc.StatusCode.INVALID_ARGUMENT, create_stream(stub, stream_name, **override))
    assert named in details


async def test_the_compaction_lag_is_a_stream_setting_and_a_broker_default(broker: Broker, stream_name: str) -> None:
    assert broker.manager is not None and broker.wire is not None
    async with Admin(f"127.0.0.1:{broker.wire.port}") as admin:
        await admin.create_stream(stream_name, config={"compact.enabled": True, "compact.min.lag.ms": 5000})
        await admin.create_stream(f"{stream_name}-default")
    assert broker.manager.leader_of(stream_name, 0).log.config.compact_min_lag_ms == 5000
    default = broker.manager.leader_of(f"{stream_name}-default", 0).log.config
    assert default.compact_min_lag_ms == broker.config.compact_min_lag_ms
