"""Tiered storage on one running broker with a file:// store: offload, local retention after upload, reads from 0.

The store is a directory (``tiered_store = file:///…``: the embedded default, no server). The S3 path with a real
S3-compatible server, failover and failures are in ``tests/broker/test_tiering_s3.py``.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from tidelog.client.admin import Admin
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.remote_segments import RemoteSegmentLists
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import InvalidArgumentError
from tidelog.server import Broker
from tidelog.storage.remote_segment import partition_prefix

from .helpers import bounded, consumed_values, read_until_stop, until

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

COUNT = 300


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def broker_settings(store_dir: Path) -> dict[str, Any]:
    return {
        "tiered_store": f"file://{store_dir}",
        "tiered_interval_ms": 100,
        "cleaner_interval_ms": 100,
        "segment_max_bytes": 16 * 1024,
        "max_message_bytes": 4096,
        "local_retention_bytes": 40 * 1024,
    }


@pytest.fixture
def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


def value(i: int) -> bytes:
    return f"{i:06d}".encode() * 80


async def fill(stub: api_pb2_grpc.APIStub, stream: str) -> None:
    await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream, name=stream))
    for i in range(COUNT):
        await stub.Publish(api_pb2.PublishRequest(stream=stream, value=value(i), ackPolicy=api_pb2.ALL))


async def test_sealed_segments_are_offloaded_then_deleted_locally_and_read_back_from_zero(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str, store_dir: Path, address: str
) -> None:
    await fill(stub, stream_name)
    assert broker.manager is not None and broker.tiering is not None and broker.etcd is not None
    partition = broker.manager.leader_of(stream_name, 0)

    def offloaded_and_trimmed() -> bool:
        return partition.local_log_start > 0 and partition.log_start == 0

    await until(offloaded_and_trimmed, "segments offloaded and deleted locally")
    listed = await RemoteSegmentLists(broker.etcd, namespace_keys(broker.config.namespace)).read(stream_name, 0)
    segments = listed.segments.segments
    assert segments[0].base_offset == 0
    assert all(a.end_offset == b.base_offset for a, b in itertools.pairwise(segments))
    assert partition.local_log_start <= segments[-1].end_offset  # nothing deleted locally that is not offloaded
    objects = set(os.listdir(store_dir / partition_prefix(broker.config.namespace, stream_name, 0)))
    for segment in segments:
        assert Path(segment.log_name).name in objects and Path(segment.manifest_name).name in objects

    messages = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    assert [m.offset for m in messages] == list(range(COUNT))
    assert [m.value for m in messages] == [value(i) for i in range(COUNT)]
    assert await bounded(consumed_values(address, stream_name)) == [value(i) for i in range(COUNT)]


async def test_a_compacted_stream_that_asks_to_tier_is_refused(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        with pytest.raises(InvalidArgumentError, match="compacted stream cannot tier"):
            await admin.create_stream(stream_name, config={"compact_enabled": True, "tiered": True})
