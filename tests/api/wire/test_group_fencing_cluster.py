"""Why a committed offset cannot go back when a partition changes hands, on real processes (a LocalCluster: NATS,
etcd, two ``tidelog serve``): a member taking a partition over reads the group's offset (FETCH_CURSOR with its
group context) only once the commits under way on the cursor are done. Here the previous owner's commit is under
way for as long as we like: ``__cursors`` has two replicas and its follower is paused (SIGSTOP, by PID), so the
commit is in the leader's log but not acknowledged. The new owner's read must wait for it, and answer it, rather
than the older offset the new owner would resume from (and then commit over the newer one)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers import BOUND, LONG_BOUND
from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.protocol.connection import Connection
from tidelog.protocol.cursor_messages import FetchCursorRequest, FetchCursorResponse, SetCursorRequest
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.group_messages import (
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    JoinGroupRequest,
    JoinGroupResponse,
)
from tidelog.protocol.messages import (
    GroupContext,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "cursors_stream_replication_factor": "2",
    "broker_lease_ttl_ms": "60000",  # the paused follower keeps its registration and its place in the ISR
    "replica_lag_time_max_ms": "60000",
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("cluster")), 2, settings=SETTINGS) as running:
        yield running


async def _open(cluster: LocalCluster, broker_id: str) -> Connection:
    host, port = cluster.broker(broker_id).wire_address.rsplit(":", 1)
    return await Connection.open(host, int(port))


async def test_a_takeover_reads_the_offset_only_after_the_commit_under_way(cluster: LocalCluster) -> None:
    stream, group = "handover", "handover-group"
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream(stream, partitions=1, replication_factor=1)
        await cluster.wait_until(
            lambda: cluster.partition_record(CURSORS_STREAM, 0), LONG_BOUND, "the __cursors stream to exist"
        )
    record = await cluster.partition_record(CURSORS_STREAM, 0)
    assert record is not None and record.leader and len(record.isr) == 2
    leader = record.leader
    follower = next(b for b in record.replicas if b != leader)
    old_owner, new_owner = await _open(cluster, leader), await _open(cluster, leader)
    coordinator: Connection | None = None
    try:

        async def known_everywhere() -> bool:  # each broker's mirror follows etcd; the Admin below may ask either
            for handle in cluster.brokers:
                connection = await _open(cluster, handle.id)
                try:
                    found = (await connection.request(MetadataRequest((stream,)), timeout=BOUND)).header
                finally:
                    await connection.close()
                if not (isinstance(found, MetadataResponse) and any(s.name == stream for s in found.streams)):
                    return False
            return True

        await cluster.wait_until(known_everywhere, LONG_BOUND, f"every broker to know stream {stream}")
        async with Admin(cluster.bootstrap()) as admin:
            await admin.set_cursor(stream, 0, group, 5)  # the offset before: what a takeover must not resume from
        joined = (await old_owner.request(JoinGroupRequest(group, "a", (stream,)), timeout=BOUND)).header
        assert isinstance(joined, JoinGroupResponse)
        coordinator = await _open(cluster, joined.coordinator)  # the group's broker (maybe not the cursors' leader)
        owned = (await coordinator.request(GroupAssignmentsRequest(group, "a", joined.epoch), timeout=BOUND)).header
        assert isinstance(owned, GroupAssignmentsResponse) and owned.assignments
        bounds = (await old_owner.request(ListOffsetsRequest(CURSORS_STREAM, 0), timeout=BOUND)).header
        assert isinstance(bounds, ListOffsetsResponse)

        await cluster.pause(follower)
        commit = SetCursorRequest(stream, 0, group, 9, timeout_ms=30_000, group=GroupContext(group, "a", joined.epoch))
        under_way = asyncio.ensure_future(old_owner.request(commit, timeout=LONG_BOUND))

        async def in_the_leaders_log() -> bool:
            now = (await new_owner.request(ListOffsetsRequest(CURSORS_STREAM, 0), timeout=BOUND)).header
            assert isinstance(now, ListOffsetsResponse)
            return now.log_end > bounds.log_end

        await cluster.wait_until(in_the_leaders_log, BOUND, "the commit to reach the leader's log")
        assert not under_way.done(), "acknowledged without the paused follower"
        takeover = FetchCursorRequest(stream, 0, group, timeout_ms=30_000, group=GroupContext(group, "a", joined.epoch))
        read = asyncio.ensure_future(new_owner.request(takeover, timeout=LONG_BOUND))
        # The read reaches the leader while the commit is under way (a fixed wait that can only make this test
        # pass without proving anything on a very slow machine, never fail it): it must not be answered yet.
        await asyncio.wait([read], timeout=1.0)
        assert not read.done(), f"answered during the commit: {read.result().header if read.done() else ''}"
        await cluster.resume(follower)
        await under_way
        answer = (await read).header
        assert isinstance(answer, FetchCursorResponse)
        assert answer.offset == 9, "the takeover read an offset older than the commit under way"
    finally:
        with contextlib.suppress(Exception):
            await cluster.resume(follower)
        await old_owner.close()
        await new_owner.close()
        if coordinator is not None:
            await coordinator.close()
