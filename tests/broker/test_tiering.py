"""Tiered storage on one running broker with a file:// store: offload, local retention after upload, reads from 0.

The store is a directory (``tiered_store = file:///…``: the embedded default, no server). The S3 path with a real
S3-compatible server, failover and failures are in ``tests/broker/test_tiering_s3.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.helpers import BOUND
from tests.ui.helpers import scrape
from tests.ui.helpers import value as metric
from tidelog.client.admin import Admin
from tidelog.client.consumer import Consumer
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.remote_segments import RemoteSegmentLists
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import InvalidArgumentError, OffsetDamagedError
from tidelog.protocol.records import HEADER_SIZE, iter_batches
from tidelog.server import Broker
from tidelog.storage.remote_segment import partition_prefix

from .helpers import bounded, consumed_values, read_until_stop, rpc_error, until

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
    by_time = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.TIMESTAMP, startTimestamp=1, stopPosition=api_pb2.STOP_LATEST
    )
    assert by_time[0].offset == 0  # a timestamp in the store's range starts there, not at the local log start


async def test_describe_and_metrics_show_the_remote_and_local_ranges(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str, address: str
) -> None:
    await fill(stub, stream_name)
    assert broker.manager is not None and broker.http is not None
    partition = broker.manager.leader_of(stream_name, 0)
    await until(lambda: partition.local_log_start > 0 and partition.log_start == 0, "offload")
    async with Admin(address) as admin:
        shown = (await admin.describe_stream(stream_name)).partitions[0]
    assert (shown.log_start, shown.remote_start) == (0, 0)
    assert 0 < shown.local_log_start <= shown.remote_end <= shown.high_watermark == COUNT
    samples = await scrape(f"http://127.0.0.1:{broker.http.port}")
    labels = {"stream": stream_name, "partition": "0"}
    assert metric(samples, "tidelog_partition_remote_start_offset", **labels) == 0
    assert (metric(samples, "tidelog_partition_remote_end_offset", **labels) or 0) >= shown.remote_end
    assert metric(samples, "tidelog_partition_upload_lag_records", **labels) is not None
    assert (metric(samples, "tidelog_tiered_uploads_total") or 0) >= 1
    assert (metric(samples, "tidelog_tiered_upload_bytes_total") or 0) > 0
    assert metric(samples, "tidelog_tiered_upload_failures_total") is not None
    reads, read_bytes = (metric(samples, f"tidelog_tiered_remote_{n}_total") or 0 for n in ("reads", "read_bytes"))
    await read_until_stop(stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST)
    after = await scrape(f"http://127.0.0.1:{broker.http.port}")
    assert (metric(after, "tidelog_tiered_remote_reads_total") or 0) > reads
    assert (metric(after, "tidelog_tiered_remote_read_bytes_total") or 0) > read_bytes


async def test_a_new_leadership_sweeps_objects_no_list_names_below_its_end(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str, store_dir: Path
) -> None:
    await fill(stub, stream_name)
    assert broker.manager is not None and broker.tier_catalog is not None and broker.tiering is not None
    partition = broker.manager.leader_of(stream_name, 0)
    await until(lambda: partition.local_log_start > 0 and partition.log_start == 0, "offload")
    tiering = broker.tiering
    await until(lambda: tiering.upload_backlog(partition)[0] == 0, "every sealed segment uploaded")  # the end stays
    directory = store_dir / partition_prefix(broker.config.namespace, stream_name, 0)
    listed = {Path(s.log_name).name for s in broker.tier_catalog.list_of(stream_name, 0).segments}
    end = broker.tier_catalog.remote_end(stream_name, 0)
    assert end is not None
    below = f"{0:020d}-{7:020d}-{'ab' * 16}"  # an upload never recorded, cut where the list does not cut
    beyond = f"{end:020d}-{end + 9:020d}-{'cd' * 16}"  # may still be adopted by the next upload
    for stem in (below, beyond):
        for kind in ("log", "manifest"):
            (directory / f"{stem}.{kind}").write_bytes(b"orphan")
    assert await broker.tiering.sweep_orphans(partition) == 2
    left = set(os.listdir(directory))
    assert f"{below}.log" not in left and f"{below}.manifest" not in left
    assert {f"{beyond}.log", f"{beyond}.manifest"} <= left and listed <= left
    messages = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    assert [m.offset for m in messages] == list(range(COUNT))


async def test_retention_deletes_from_the_store_too(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str, store_dir: Path
) -> None:
    await stub.CreateStream(
        api_pb2.CreateStreamRequest(
            subject=stream_name, name=stream_name, retentionMaxMessages=api_pb2.NullableInt64(value=100)
        )
    )
    for i in range(COUNT):
        await stub.Publish(api_pb2.PublishRequest(stream=stream_name, value=value(i), ackPolicy=api_pb2.ALL))
    assert broker.manager is not None and broker.tier_catalog is not None
    partition = broker.manager.leader_of(stream_name, 0)
    catalog = broker.tier_catalog
    await until(lambda: (catalog.remote_start(stream_name, 0) or 0) > 0, "retention in the store")
    start = partition.log_start
    assert 0 < start <= COUNT - 100  # kept at least the limit
    remaining = catalog.list_of(stream_name, 0).segments
    directory = store_dir / partition_prefix(broker.config.namespace, stream_name, 0)
    objects = sorted(name for name in os.listdir(directory) if name.endswith(".log"))
    assert {Path(s.log_name).name for s in remaining} <= set(objects)
    assert all(int(name[:20]) >= remaining[0].base_offset for name in objects)  # dropped from the list and the store
    messages = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    assert messages[0].offset <= start and [m.offset for m in messages] == list(range(messages[0].offset, COUNT))


async def test_a_corrupt_object_is_a_typed_error_naming_its_offsets_never_its_bytes(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str, store_dir: Path, address: str
) -> None:
    await fill(stub, stream_name)
    assert broker.manager is not None and broker.tier_catalog is not None
    partition = broker.manager.leader_of(stream_name, 0)
    await until(lambda: partition.local_log_start > 0 and partition.log_start == 0, "offload")
    first = broker.tier_catalog.list_of(stream_name, 0).segments[0]
    path = store_dir / first.log_name
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 10] ^= 0xFF  # the first batch's records: its header stays sound
    path.write_bytes(bytes(data))
    last = next(iter_batches(bytes(data), verify=False))[1].last_offset
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream=stream_name, startPosition=api_pb2.EARLIEST))
    assert await bounded(call.read()) == api_pb2.Message()  # the handshake
    error = await rpc_error(bounded(call.read()))
    assert error.code() == grpc.StatusCode.DATA_LOSS
    assert f"offsets 0..{last}" in str(error.details())
    async with Consumer(address, stream_name, stop_at_end=True) as consumer:
        with pytest.raises(OffsetDamagedError) as caught:
            async with asyncio.timeout(BOUND):
                async for _ in consumer:
                    pass
    assert (caught.value.first, caught.value.last) == (0, last)


async def test_a_stream_created_again_under_the_same_name_does_not_see_the_old_ones_history(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str
) -> None:
    await fill(stub, stream_name)
    assert broker.manager is not None and broker.tier_catalog is not None
    partition = broker.manager.leader_of(stream_name, 0)
    await until(lambda: partition.local_log_start > 0 and partition.log_start == 0, "offload")
    await stub.DeleteStream(api_pb2.DeleteStreamRequest(name=stream_name))
    await stub.CreateStream(api_pb2.CreateStreamRequest(subject=stream_name, name=stream_name))
    fresh = [b"new %d " % i * 100 for i in range(COUNT)]
    for item in fresh:
        await stub.Publish(api_pb2.PublishRequest(stream=stream_name, value=item, ackPolicy=api_pb2.ALL))
    again = broker.manager.leader_of(stream_name, 0)
    await until(lambda: again.local_log_start > 0 and again.log_start == 0, "the new stream's offload")
    messages = await read_until_stop(
        stub, stream_name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    assert [m.value for m in messages] == fresh


async def test_a_deleted_streams_objects_and_lists_leave_the_store(
    broker: Broker, stub: api_pb2_grpc.APIStub, stream_name: str, store_dir: Path
) -> None:
    await fill(stub, stream_name)
    assert broker.manager is not None and broker.etcd is not None
    partition = broker.manager.leader_of(stream_name, 0)
    await until(lambda: partition.local_log_start > 0, "offload")
    await stub.DeleteStream(api_pb2.DeleteStreamRequest(name=stream_name))
    directory = store_dir / partition_prefix(broker.config.namespace, stream_name, 0)
    await until(lambda: not os.listdir(directory), "the deleted stream's objects removed")
    lists = RemoteSegmentLists(broker.etcd, namespace_keys(broker.config.namespace))
    listed = await lists.read(stream_name, 0)
    await until(lambda: not broker.tier_catalog or not broker.tier_catalog.orphans(), "no list left")
    assert (await lists.read(stream_name, 0)).list_revision == 0 and listed.stream_created_ns is None


async def test_a_compacted_stream_that_asks_to_tier_is_refused(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        with pytest.raises(InvalidArgumentError, match="compacted stream cannot tier"):
            await admin.create_stream(stream_name, config={"compact_enabled": True, "tiered": True})
