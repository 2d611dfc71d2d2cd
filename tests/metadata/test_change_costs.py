"""What one change costs against a real etcd: a failover that moves hundreds of leaders is a few fenced
transactions (a lost compare retries only the rest), and the mirror tells its listeners exactly the partitions
a change touched, sharing everything else with the previous snapshot."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from tidelog.metadata.controller_plans import ChangeReason, PartitionChange
from tidelog.metadata.fenced_writer import FencedWriter, TxnResult
from tidelog.metadata.partition_writes import BATCH_PARTITIONS, PartitionWrites
from tidelog.metadata.records import PartitionRecord, StreamRecord, decode_partition, encode
from tidelog.metadata.shared_map import SHARDS, SharedMap
from tidelog.metadata.snapshot import MetadataSnapshot, changed_partitions

from . import helpers as harness
from .helpers import Cluster, part

etcd = harness.etcd
cluster = harness.cluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


async def write_stream(cluster: Cluster, name: str, parts: list[PartitionRecord]) -> None:
    """The partitions in transactions of a hundred, then the stream record (the mirror shows them with it)."""
    tx = cluster.admin.transactions
    for i in range(0, len(parts), 100):
        chunk = parts[i : i + 100]
        ok, _ = await cluster.admin.transaction(
            compare=[], success=[tx.put(cluster.keys.partition(p.stream, p.id), encode(p)) for p in chunk], failure=[]
        )
        assert ok
    rf = max(len(p.replicas) for p in parts)
    await cluster.admin.put(cluster.keys.stream(name), encode(StreamRecord(name, name, "", len(parts), rf, 0)))
    await cluster.wait(lambda s: len(s.partitions_of(name)) == len(parts))


def count_transactions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the fenced transactions the controller makes from now on."""
    made: list[int] = []
    transaction = FencedWriter.transaction

    async def counted(self: FencedWriter, *args: Any, **kwargs: Any) -> TxnResult:
        made.append(1)
        return await transaction(self, *args, **kwargs)

    monkeypatch.setattr(FencedWriter, "transaction", counted)
    return made


async def test_a_failover_of_300_leaders_is_a_few_transactions(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for b in "ab":
        await cluster.up(b)
    count = 300
    await write_stream(cluster, "s", [part("s", "ab", "a", "ab", 1, pid=i) for i in range(count)])
    await (await cluster.node("ctl")).active()
    made = count_transactions(monkeypatch)

    await cluster.kill("a")
    await cluster.wait(lambda s: all(p.leader == "b" for p in s.partitions_of("s")))
    assert cluster.observer is not None
    assert all(p == part("s", "ab", "b", "b", 2, pid=p.id) for p in cluster.observer.snapshot.partitions_of("s"))
    assert len(made) <= math.ceil(count / BATCH_PARTITIONS) + 2


async def test_a_lost_compare_in_a_batch_retries_only_the_others(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for b in "ab":
        await cluster.up(b)
    count = 250
    parts = [part("s", "ab", "a", "ab", 1, pid=i) for i in range(count)]
    await write_stream(cluster, "s", parts)
    node = await cluster.node("ctl")
    await node.active()
    lost = {3, 150, 151}  # changed in etcd after the plan was made: their compares fail
    for i in lost:
        await cluster.admin.put(cluster.keys.partition("s", i), encode(part("s", "ab", "a", "a", 1, pid=i)))
    made = count_transactions(monkeypatch)

    writes = PartitionWrites(node.client, cluster.keys, "ctl", concurrency=4)
    changes = [
        PartitionChange(p, msgspec.structs.replace(p, leader="b", leader_epoch=2), ChangeReason.PREFERRED)
        for p in parts
    ]
    landed = await writes.apply(node.election.writer(), changes)

    assert [i for i, ok in enumerate(landed) if not ok] == sorted(lost)
    batches = math.ceil(count / BATCH_PARTITIONS)
    assert len(made) <= batches + 2  # the two batches holding a lost partition: once more each
    for i in range(count):
        found = await cluster.admin.get(cluster.keys.partition("s", i))
        record = decode_partition(bytes(found.value))
        assert (record.leader, record.isr) == (("a", ("a",)) if i in lost else ("b", ("a", "b")))


async def test_the_mirror_names_exactly_the_partitions_a_change_touched(cluster: Cluster) -> None:
    await cluster.up("a")
    count = 2_000
    await write_stream(cluster, "s", [part("s", "a", "a", "a", 1, pid=i) for i in range(count)])
    assert cluster.observer is not None
    seen: list[tuple[MetadataSnapshot, MetadataSnapshot]] = []

    async def listener(old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        seen.append((old, new))

    cluster.observer.add_listener(listener)

    await cluster.admin.put(cluster.keys.partition("s", 1234), encode(part("s", "a", "a", "a", 2, pid=1234)))
    await cluster.wait(lambda s: s.partitions[("s", 1234)].leader_epoch == 2)
    ((old, new),) = seen
    assert new.change is not None and new.change.partitions == {("s", 1234)} and not new.change.streams
    assert changed_partitions(old, new) == {("s", 1234)}
    assert isinstance(new.partitions, SharedMap) and isinstance(old.partitions, SharedMap)
    assert new.partitions.shares_with(old.partitions) == SHARDS - 1  # one record copied with its shard
    assert new.streams is old.streams and new.brokers is old.brokers

    # A transaction of a hundred partitions: the listeners are told those hundred, and nothing else.
    seen.clear()
    moved = [part("s", "a", "a", "a", 3, pid=i) for i in range(500, 600)]
    tx = cluster.admin.transactions
    await cluster.admin.transaction(
        compare=[], success=[tx.put(cluster.keys.partition("s", p.id), encode(p)) for p in moved], failure=[]
    )
    await cluster.wait(lambda s: all(s.partitions[("s", i)].leader_epoch == 3 for i in range(500, 600)))
    told = [key for _, new in seen for key in (new.change.partitions if new.change else ())]
    assert sorted(told) == [("s", i) for i in range(500, 600)]
    assert len(seen) <= len(moved)
