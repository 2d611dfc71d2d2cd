"""``/metrics``, ``/healthz`` and ``/readyz`` of a real broker, read the way Prometheus and an orchestrator do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.broker.conftest import broker, broker_config, broker_settings, stub
from tests.broker.helpers import Stub, consumed_values, create_stream
from tests.helpers import BOUND
from tests.ui.helpers import get, get_json, scrape, value
from tidelog import telemetry
from tidelog.client.producer import Producer
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stub"]  # fixtures

pytestmark = pytest.mark.asyncio(loop_scope="module")

RECORDS = 250


def base_url(broker: Broker) -> str:
    assert broker.http is not None
    return f"http://127.0.0.1:{broker.http.port}"


def wire(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def produced(broker: Broker, stub: Stub) -> AsyncIterator[str]:
    """A stream of one partition holding RECORDS records of 100 bytes, produced over the wire, acks ALL."""
    await create_stream(stub, "observed")
    async with Producer(wire(broker)) as producer:
        for i in range(RECORDS):
            await producer.send("observed", i.to_bytes(4, "big") * 25, partition=0)
        await producer.flush()
    yield "observed"


async def test_a_scrape_shows_what_was_produced(broker: Broker, produced: str) -> None:
    samples = await scrape(base_url(broker))
    leader = {"stream": produced, "partition": "0", "role": "leader"}
    assert value(samples, "tidelog_partition_log_start_offset", **leader) == 0
    assert value(samples, "tidelog_partition_log_end_offset", **leader) == RECORDS
    assert value(samples, "tidelog_partition_high_watermark", **leader) == RECORDS
    p = {"stream": produced, "partition": "0"}
    assert value(samples, "tidelog_partition_records_in_total", **p) == RECORDS
    assert (value(samples, "tidelog_partition_bytes_in_total", **p) or 0) > 0
    assert value(samples, "tidelog_partition_leader", **p) == 1
    assert value(samples, "tidelog_partition_isr_size", **p) == 1
    assert value(samples, "tidelog_partition_under_replicated", **p) == 0
    assert value(samples, "tidelog_broker_under_replicated_partitions") == 0
    assert (value(samples, "tidelog_broker_partitions_led") or 0) >= 1
    assert value(samples, "tidelog_controller_active") == 1
    assert value(samples, "tidelog_cluster_brokers_alive") == 1
    assert value(samples, "tidelog_offline_partitions") == 0
    produce = {"protocol": "wire", "operation": "produce"}
    assert (value(samples, "tidelog_request_duration_seconds_count", **produce) or 0) >= 1
    assert (value(samples, "tidelog_fsync_duration_seconds_count") or 0) >= 1
    assert (value(samples, "tidelog_fsynced_bytes_total") or 0) > 0
    assert (value(samples, "tidelog_apply_latency_seconds_count") or 0) >= 1
    grpc_create = {"protocol": "grpc", "operation": "CreateStream"}
    assert (value(samples, "tidelog_request_duration_seconds_count", **grpc_create) or 0) >= 1
    assert (value(samples, "process_resident_memory_bytes") or 0) > 0


async def test_a_consumer_read_counts_as_bytes_out(broker: Broker, produced: str) -> None:
    before = value(await scrape(base_url(broker)), "tidelog_partition_bytes_out_total", stream=produced, role="leader")
    assert len(await consumed_values(wire(broker), produced)) == RECORDS
    after = value(await scrape(base_url(broker)), "tidelog_partition_bytes_out_total", stream=produced, role="leader")
    assert (after or 0) > (before or 0)
    records_out = {"stream": produced, "role": "leader"}
    assert value(await scrape(base_url(broker)), "tidelog_partition_records_out_total", **records_out) == RECORDS


async def test_nats_messages_are_counted_as_ingested(broker: Broker, stub: Stub) -> None:
    import nats

    await create_stream(stub, "ingested")
    before = value(await scrape(base_url(broker)), "tidelog_nats_messages_ingested_total") or 0
    client = await nats.connect(broker.nats_urls, connect_timeout=BOUND, allow_reconnect=False)
    try:
        for i in range(10):
            await client.publish("ingested", b"m%d" % i)
        await client.flush()
    finally:
        await client.close()
    for _ in range(200):  # bounded: the ingest stores them within a few loop turns
        samples = await scrape(base_url(broker))
        counted = (value(samples, "tidelog_nats_messages_ingested_total") or 0) - before
        # The log end moves when the batch is appended; the counter once the write returns (after its flush).
        if value(samples, "tidelog_partition_log_end_offset", stream="ingested", role="leader") == 10 and counted >= 10:
            break
        await asyncio.sleep(0.01)
    assert value(samples, "tidelog_partition_log_end_offset", stream="ingested", role="leader") == 10
    assert (value(samples, "tidelog_nats_messages_ingested_total") or 0) - before == 10


async def test_healthz_and_readyz_answer_ok_with_what_they_checked(broker: Broker) -> None:
    status, body = await get_json(f"{base_url(broker)}/healthz")
    assert (status, body) == (200, {"status": "ok", "broker": broker.id})
    status, body = await get_json(f"{base_url(broker)}/readyz")
    assert status == 200, body
    assert body["not_ready"] == []
    assert set(body["checks"]) == {"registered", "metadata", "nats", "etcd"}
    assert all(check["ok"] for check in body["checks"].values())


async def test_per_partition_series_can_be_turned_off_and_metrics_too(tmp_path: Path) -> None:
    quiet = Broker(broker_config(tmp_path / "quiet", metrics_partition_level=False))
    await quiet.start()
    try:
        samples = await scrape(base_url(quiet))
        assert not [name for name in samples if name.startswith(("tidelog_partition_", "tidelog_follower_"))]
        assert value(samples, "tidelog_broker_partitions_led") is not None
    finally:
        await quiet.stop()
    off = Broker(broker_config(tmp_path / "off", metrics_enabled=False))
    await off.start()
    try:
        assert (await get(f"{base_url(off)}/metrics"))[0] == 404
        assert (await get(f"{base_url(off)}/healthz"))[0] == 200
    finally:
        await off.stop()
        telemetry.set_enabled(True)  # process-wide: the module's other brokers count again


async def test_ingest_counts_survive_the_ingest_stopping(broker: Broker, stub: Stub) -> None:
    """``tidelog_nats_messages_ingested_total`` is a counter: a partition's ingest stopping (a pause, a leader
    moving away, a NATS reconnection) must not take its messages out of the broker's total."""
    import nats

    from tidelog.protocol._gen import api_pb2

    await create_stream(stub, "counted")
    client = await nats.connect(broker.nats_urls, connect_timeout=BOUND, allow_reconnect=False)
    try:
        for i in range(5):
            await client.publish("counted", b"m%d" % i)
        await client.flush()
    finally:
        await client.close()
    for _ in range(200):  # bounded: the ingest stores them within a few loop turns
        samples = await scrape(base_url(broker))
        if value(samples, "tidelog_partition_log_end_offset", stream="counted", role="leader") == 5:
            break
    stored = value(samples, "tidelog_nats_messages_ingested_total") or 0
    assert stored >= 5
    await stub.PauseStream(api_pb2.PauseStreamRequest(name="counted"), timeout=BOUND)  # stops its ingest
    assert broker.manager is not None
    assert not broker.manager.ingesting("counted", 0)
    assert (value(await scrape(base_url(broker)), "tidelog_nats_messages_ingested_total") or 0) >= stored
