"""The group consumer on three brokers: the broker coordinating the group is SIGKILLed (by PID) and the members
find the new coordinator themselves and carry on, reading every record and committing, nothing committed going
back. Real processes (a LocalCluster: NATS, etcd, three ``tidelog serve``) with timeouts shortened for a test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.client.group_helpers import CursorWatch, Reader, produce
from tests.helpers import BOUND, LONG_BOUND
from tidelog.client import Admin, GroupConsumer
from tidelog.local.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "group_consumer_timeout_ms": "4000",
    "group_coordinator_timeout_ms": "3000",
    "cursors_stream_replication_factor": "3",  # not "every broker alive when it is created": maybe fewer
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 3, settings=SETTINGS) as running:
        yield running


async def test_members_carry_on_when_the_coordinators_broker_is_killed(cluster: LocalCluster) -> None:
    stream, group = "gfail", "gfail-group"
    bootstrap = cluster.bootstrap()
    async with Admin(bootstrap) as admin:
        await admin.create_stream(stream, partitions=3, replication_factor=3)
        await produce(bootstrap[0], stream, range(3), 10)
        watch = CursorWatch(admin, stream, group, 3)
        readers = [
            Reader(
                GroupConsumer(
                    bootstrap,
                    stream,
                    group_id=group,
                    consumer_id=name,
                    auto_offset_reset="earliest",
                    auto_commit_interval_ms=100,
                )
            )
            for name in ("a", "b")
        ]

        def offsets(p: int) -> set[int]:
            return {offset for reader in readers for offset in reader.offsets(p)}

        try:
            for reader in readers:
                await reader.start()
            await cluster.wait_until(
                lambda: all(offsets(p) >= set(range(10)) for p in range(3)), BOUND, "the first records consumed"
            )
            dead = readers[0].consumer.coordinator
            await cluster.kill(dead)
            survivor = next(b.wire_address for b in cluster.brokers if b.id != dead)
            await produce(survivor, stream, range(3), 10, first=10)
            await cluster.wait_until(
                lambda: all(offsets(p) >= set(range(20)) for p in range(3)), LONG_BOUND, "every record consumed"
            )

            def followed() -> bool:
                coordinators = {reader.consumer.coordinator for reader in readers}
                return len(coordinators) == 1 and dead not in coordinators

            await cluster.wait_until(followed, LONG_BOUND, "both members to heartbeat to the new coordinator")
            for reader in readers:
                await reader.stop()
        finally:
            for reader in readers:
                with contextlib.suppress(Exception):
                    await reader.consumer.close()
            await watch.stop()
        assert watch.regressions == []
        assert {p: await admin.fetch_cursor(stream, p, group) for p in range(3)} == dict.fromkeys(range(3), 20)
