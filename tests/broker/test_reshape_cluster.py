"""Reshaping on a cluster of two broker processes: a broker that is not the controller forwards
ADD_PARTITIONS, ALTER_STREAM and ELECT_LEADERS to it, both brokers see the result, and a preferred leader that
came back gets its leadership at once on ``rebalance`` (the background balance is made too slow to do it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers import LONG_BOUND
from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.protocol.errors import InvalidArgumentError

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "leader_balance_interval_ms": "3600000",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("reshape")), 2, settings=SETTINGS) as running:
        yield running


async def _other_than_controller(cluster: LocalCluster) -> str:
    controller = await cluster.controller_id()
    return next(b.id for b in cluster.brokers if b.id != controller)


async def test_a_broker_that_is_not_the_controller_forwards_the_changes(cluster: LocalCluster) -> None:
    via = cluster.broker(await _other_than_controller(cluster)).wire_address
    async with Admin([via]) as admin:
        await admin.create_stream("wide", partitions=1, replication_factor=2)
        grown = await admin.add_partitions("wide", 3)
        assert (grown.before, grown.after) == (1, 3)
        changed = await admin.alter_stream("wide", {"retention_max_messages": 5})
        assert [(c.name, c.after) for c in changed.changes] == [("retention_max_messages", "5")]
        with pytest.raises(InvalidArgumentError, match="tiered cannot change"):
            await admin.alter_stream("wide", {"tiered": True})
    for handle in cluster.brokers:  # every broker serves the new partitions
        async with Admin([handle.wire_address]) as admin:
            info = await admin.describe_stream("wide")
            assert [p.id for p in info.partitions] == [0, 1, 2]
            assert all(len(p.replicas) == 2 for p in info.partitions)


async def test_rebalance_gives_a_returning_preferred_leader_its_partitions(cluster: LocalCluster) -> None:
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("prefer", partitions=2, replication_factor=2)
        info = await admin.describe_stream("prefer")
    preferred = {p.id: p.replicas[0] for p in info.partitions}
    away = preferred[0]
    assert await cluster.stop_broker(away) == 0  # its leaderships move to the other broker while it is gone
    await cluster.restart(away)

    async def back_in_isr_but_not_leading() -> bool:
        async with Admin([cluster.broker(away).wire_address]) as admin:
            parts = (await admin.describe_stream("prefer")).partitions
        return all(away in p.isr for p in parts) and any(p.leader != preferred[p.id] for p in parts)

    await cluster.wait_until(back_in_isr_but_not_leading, LONG_BOUND, f"{away} back in the ISR, not leading")
    async with Admin(cluster.bootstrap()) as admin:
        answer = await admin.elect_leaders()
        assert answer.moved >= 1 and answer.not_preferred == 0

        async def preferred_lead() -> bool:
            parts = (await admin.describe_stream("prefer")).partitions
            return all(p.leader == preferred[p.id] for p in parts)

        await cluster.wait_until(preferred_lead, LONG_BOUND, "the preferred replicas to lead")
