"""A real Prometheus (Debian's ``prometheus``) scrapes a three-broker cluster under load: PromQL over its HTTP API
sees the write rate and the committed offsets the producer was told, and under-replicated partitions once a broker
is SIGKILLed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import LONG_BOUND
from tests.ui.helpers import get
from tidelog.client.admin import Admin
from tidelog.client.producer import Producer
from tidelog.launch.ports import free_port
from tidelog.launch.process import ManagedProcess
from tidelog.local.cluster import LocalCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed (make does)"),
]

STREAM = "load"
PARTITIONS = 3
MAX_RECORDS = 500_000  # the load stops well before; a bound, not a target


def write_config(root: Path, targets: list[str]) -> Path:
    """A Prometheus configuration (JSON is YAML) scraping ``targets`` every second."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "prometheus.yml"
    scrape = {"job_name": "tidelog", "static_configs": [{"targets": targets}]}
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]}))
    return config


@contextlib.asynccontextmanager
async def prometheus(root: Path, targets: list[str]) -> AsyncIterator[str]:
    """Prometheus on a free port scraping ``targets`` every second; yields its base URL."""
    port = free_port()
    config = write_config(root, targets)
    process = ManagedProcess(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log_path=root / "prometheus.log",
        name="prometheus",
    )
    base = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        return (await get(f"{base}/-/ready"))[0] == 200

    await process.start(ready, ready_within=LONG_BOUND)
    try:
        yield base
    finally:
        await process.stop(grace=10)


async def query(base: str, promql: str) -> float | None:
    """The single value of an instant query; None when it returns no series."""
    status, body = await get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", answer
    result = answer["data"]["result"]
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


async def eventually(base: str, promql: str, holds: str, check: object, what: str) -> float:
    """Query until ``check(value)`` holds (Prometheus scrapes each second), within LONG_BOUND; the last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LONG_BOUND
    last: float | None = None
    while loop.time() < deadline:
        last = await query(base, promql)
        if last is not None and check(last):  # type: ignore[operator]
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{what}: {promql} stayed {last}, expected {holds}")


async def produce_until(stop: asyncio.Event, bootstrap: list[str]) -> int:
    """Write small records, acks ALL, until ``stop``; how many were acknowledged."""
    acked = 0
    async with Producer(bootstrap) as producer:
        while not stop.is_set() and acked < MAX_RECORDS:
            futures = [await producer.send(STREAM, b"x" * 100, partition=i % PARTITIONS) for i in range(500)]
            await asyncio.gather(*futures)
            acked += len(futures)
    return acked


async def test_prometheus_sees_the_write_rate_and_under_replicated_partitions_after_a_kill(tmp_path: Path) -> None:
    settings = {"broker_lease_ttl_ms": "2000", "replica_lag_time_max_ms": "3000"}
    async with LocalCluster(tmp_path / "cluster", 3, settings=settings) as cluster:
        async with Admin(cluster.bootstrap()) as admin:
            await admin.create_stream(STREAM, partitions=PARTITIONS, replication_factor=3)
        targets = [f"127.0.0.1:{b.http_port}" for b in cluster.brokers]
        async with prometheus(tmp_path / "prometheus", targets) as base:
            await eventually(base, "sum(up)", "3", lambda v: v == 3, "every broker scraped")
            stop = asyncio.Event()
            load = asyncio.create_task(produce_until(stop, cluster.bootstrap()))
            try:
                rate = f'sum(rate(tidelog_partition_records_in_total{{stream="{STREAM}"}}[5s]))'
                await eventually(base, rate, "> 0", lambda v: v > 0, "the write rate under load")
                latency = 'sum(tidelog_request_duration_seconds_count{operation="produce"})'
                await eventually(base, latency, "> 0", lambda v: v > 0, "produce requests timed")
            finally:
                stop.set()
                acked = await load
            assert acked > 0
            committed = f'sum(tidelog_partition_high_watermark{{stream="{STREAM}",role="leader"}})'
            await eventually(base, committed, str(acked), lambda v: v == acked, "the committed offsets")
            written = f'sum(tidelog_partition_records_in_total{{stream="{STREAM}"}})'
            assert await query(base, written) == acked  # every leader led since the stream was created

            controller = await cluster.controller_id()
            victim = next(b for b in cluster.brokers if b.id != controller)
            await cluster.kill(victim.id)
            under = "sum(tidelog_broker_under_replicated_partitions)"
            await eventually(base, under, "> 0", lambda v: v > 0, f"under-replicated partitions after {victim.id} died")
            down = f'up{{instance="127.0.0.1:{victim.http_port}"}}'
            await eventually(base, down, "0", lambda v: v == 0, f"{victim.id} seen down by Prometheus")
