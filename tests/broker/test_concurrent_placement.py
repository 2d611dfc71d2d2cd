"""Streams created at the same time spread their leaders: each placement counts the ones decided before it and not
yet written (eight streams created at once on ten brokers once put eight leaders on one broker). A creation right
after brokers registered places on them, though the controller's mirror has not shown them yet ("needs 3 brokers
but 1 is alive" on a cluster just started).

The brokers are simulated registrations in a real etcd (the controller harness of ``tests.metadata``); the
:class:`~tidelog.broker.streams.StreamAdmin` under test writes through the plain metadata store and waits on a
real mirror.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.metadata import helpers as harness
from tests.metadata.helpers import Cluster
from tidelog.broker.stream_reshape import StreamReshape
from tidelog.broker.streams import StreamAdmin
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.metadata.store import MetadataStore

etcd = harness.etcd
cluster = harness.cluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def test_streams_created_at_once_spread_their_leaders(cluster: Cluster) -> None:
    brokers = [f"b{i}" for i in range(10)]
    for broker in brokers:
        await cluster.up(broker)
    assert cluster.observer is not None
    admin = StreamAdmin("b0", MetadataStore(cluster.admin, cluster.keys), cluster.observer)

    created = await asyncio.gather(*(admin.create_stream(name=f"s{n}", subject=f"s{n}") for n in range(8)))

    snap = cluster.observer.snapshot
    leaders = Counter(snap.partition(s.name, 0).leader for s in created)  # type: ignore[union-attr]
    assert max(leaders.values()) == 1, leaders
    assert len(admin.placements) == 0  # nothing held once written


async def test_partitions_added_at_once_spread_over_racks_and_load(cluster: Cluster) -> None:
    for broker, rack in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")):
        await cluster.up(broker, rack=rack)
    assert cluster.observer is not None
    store = MetadataStore(cluster.admin, cluster.keys)
    admin = StreamAdmin("a1", store, cluster.observer)
    reshape = StreamReshape("a1", store, cluster.observer, placements=admin.placements)
    for name in ("x", "y"):
        await admin.create_stream(name=name, subject=name, replication_factor=2)

    await asyncio.gather(reshape.add_partitions("x", 3), reshape.add_partitions("y", 3))

    snap = cluster.observer.snapshot
    racks = {b.id: b.rack for b in snap.brokers.values()}
    parts = [p for name in ("x", "y") for p in snap.partitions_of(name)]
    assert all({racks[r] for r in p.replicas} == {"a", "b"} for p in parts), parts  # one replica per rack
    assert sorted(Counter(p.replicas[0] for p in parts).values()) == [1, 1, 2, 2]


async def test_a_creation_right_after_brokers_registered_places_on_them(cluster: Cluster) -> None:
    await cluster.up("b0")
    mirror = MetadataMirror(await cluster.client(), cluster.keys)  # the controller broker's own view
    await mirror.start()
    gate = asyncio.Event()

    async def busy(old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        """A listener still at work when brokers register (a partition manager opening logs on a slow disk)."""
        if new.brokers.keys() - old.brokers.keys():
            await gate.wait()

    mirror.add_listener(busy)
    try:
        for broker in ("b1", "b2"):  # registered: their keys are in etcd before the stream is asked for
            await cluster.up(broker)
        admin = StreamAdmin("b0", MetadataStore(cluster.admin, cluster.keys), mirror)
        creating = asyncio.create_task(admin.create_stream(name="s", subject="s", replication_factor=3))
        await asyncio.sleep(0)  # the creation runs up to its first wait before the listener may finish
        gate.set()
        created = await creating
    finally:
        gate.set()
        await mirror.stop()
    assert created.replication_factor == 3
    placed = await cluster.wait(lambda s: s.partition("s", 0) is not None)
    assert sorted(placed.partitions_of("s")[0].replicas) == ["b0", "b1", "b2"]
