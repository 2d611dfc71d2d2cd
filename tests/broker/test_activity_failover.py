"""The activity stream across a SIGKILL of the controller's broker (three real broker processes): the new
controller resumes where the old one stopped, so the events a reader collects (dropping copies by id) have no gap
relative to the changes etcd committed: every stream created has its ``CREATE_STREAM`` event, at the revision
etcd created it, in commit order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidelog.client import Admin, Consumer
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.activity import ACTIVITY_STREAM, revision_of
from tidelog.protocol._gen import api_pb2 as pb
from tidelog.protocol.errors import StreamExistsError, TidelogError

pytestmark = pytest.mark.slow

SETTINGS = {
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
    "cursors_stream_replication_factor": "3",
    "activity_stream_replication_factor": "3",
}
BEFORE, AFTER = 4, 4
WITHIN = 120.0  # seconds for failover on a loaded 2-core machine


async def _create(admin: Admin, name: str) -> None:
    """Create ``name``, retrying through the controller's failover (a retry may find it created: committed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WITHIN
    while True:
        try:
            await admin.create_stream(name, f"fo.{name}", timeout_ms=5_000)
            return
        except StreamExistsError:
            return
        except (TidelogError, OSError, TimeoutError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _events(bootstrap: list[str]) -> list[pb.ActivityStreamEvent]:
    """Every event in ``__activity`` now, copies dropped by id (as any reader does)."""
    found: list[pb.ActivityStreamEvent] = []
    newest = -1
    async with Consumer(bootstrap, ACTIVITY_STREAM, stop_at_end=True) as consumer:
        async for record in consumer:
            event = pb.ActivityStreamEvent.FromString(record.value or b"")
            if event.id > newest:
                found.append(event)
                newest = event.id
    return found


async def test_no_event_is_lost_when_the_controller_is_killed(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, 3, settings=SETTINGS) as cluster:

        async def activity_replicated() -> bool:
            record = await cluster.partition_record(ACTIVITY_STREAM, 0)
            return record is not None and bool(record.leader) and len(record.isr) == 3

        await cluster.wait_until(activity_replicated, WITHIN, "__activity with three replicas in sync")
        names = [f"fo{i}" for i in range(BEFORE + AFTER)]
        async with Admin(cluster.bootstrap()) as admin:
            for name in names[:BEFORE]:
                await _create(admin, name)
        controller = await cluster.controller_id()
        assert controller is not None
        survivors = [b.wire_address for b in cluster.brokers if b.id != controller]
        async with Admin(survivors) as admin:
            # the kill lands while the next creations are being made: some may commit before the new controller
            creating = asyncio.ensure_future(asyncio.gather(*(_create(admin, n) for n in names[BEFORE:])))
            await cluster.kill(controller)
            await asyncio.wait_for(creating, WITHIN)

        etcd = await cluster.etcd_client()
        created: dict[str, int] = {}
        for name in names:
            got = await etcd.get(cluster.keys.stream(name))
            assert got is not None, f"{name} was created"
            created[name] = int(got.create_revision)

        events: list[pb.ActivityStreamEvent] = []

        async def all_published() -> bool:
            events[:] = await _events(survivors)
            return {e.createStreamOp.stream for e in events if e.op == pb.CREATE_STREAM} >= set(names)

        await cluster.wait_until(all_published, WITHIN, "a CREATE_STREAM event for every stream created")
        ids = [e.id for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        creations = {e.createStreamOp.stream: revision_of(e.id) for e in events if e.op == pb.CREATE_STREAM}
        assert {name: creations[name] for name in names} == created, "each event reports its change's revision"
        ours = [e.createStreamOp.stream for e in events if e.createStreamOp.stream in created]
        assert ours == sorted(names, key=created.__getitem__), "in commit order"
