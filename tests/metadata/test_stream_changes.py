"""Adding partitions and changing a stream's settings through the controller, against a real etcd: fenced
compare-and-swaps, new partitions shown all at once, a change decided from a stale record refused."""

from __future__ import annotations

import msgspec
import pytest

from tidelog.metadata.fenced_writer import NotControllerError
from tidelog.metadata.records import StreamConfig, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.metadata.stream_changes import ChangeOutcome, StreamChanges
from tidelog.metadata.stream_creation import plain_transact

from . import helpers as harness
from .helpers import Cluster, part

etcd = harness.etcd
cluster = harness.cluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def _record(cluster: Cluster, name: str) -> StreamRecord:
    assert cluster.observer is not None
    found = cluster.observer.snapshot.stream(name)
    assert found is not None
    return found


async def test_added_partitions_appear_all_at_once_with_the_new_count(cluster: Cluster) -> None:
    for b in "ab":
        await cluster.up(b)
    await cluster.stream("s", part("s", "ab", "a", "ab"))
    ctl = await (await cluster.node("ctl", create_chunk=2)).active()  # 5 new partitions: 3 transactions
    assert cluster.observer is not None
    seen: list[tuple[int, int]] = []

    async def watch(_old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        stream = new.stream("s")
        if stream is not None:
            seen.append((stream.partitions, len(new.partitions_of("s"))))

    cluster.observer.add_listener(watch)
    old = _record(cluster, "s")
    grown = msgspec.structs.replace(old, partitions=6)
    parts = [part("s", "ba", "b", "ba", pid=i) for i in range(1, 6)]
    assert await ctl.add_partitions(old, grown, parts) is ChangeOutcome.CHANGED

    snap = await cluster.wait(lambda s: len(s.partitions_of("s")) == 6)
    assert snap.stream("s") == grown
    assert all(count == partitions for count, partitions in seen), seen  # never a partial stream
    assert cluster.partition("s", 5) == part("s", "ba", "b", "ba", pid=5)


async def test_a_change_decided_from_a_stale_record_writes_nothing(cluster: Cluster) -> None:
    await cluster.up("a")
    await cluster.stream("s", part("s", "a", "a", "a"))
    ctl = await (await cluster.node("ctl")).active()
    old = _record(cluster, "s")
    stale = msgspec.structs.replace(old, config=StreamConfig(retention_max_age_ms=1))
    newer = msgspec.structs.replace(old, config=StreamConfig(retention_max_age_ms=2))

    assert await ctl.alter_stream(stale, newer) is ChangeOutcome.STALE
    grown = msgspec.structs.replace(stale, partitions=2)
    assert await ctl.add_partitions(stale, grown, [part("s", "a", "a", "a", pid=1)]) is ChangeOutcome.STALE
    assert await ctl.alter_stream(old, newer) is ChangeOutcome.CHANGED
    assert (await cluster.wait(lambda s: s.stream("s") == newer)).partitions_of("s") == [part("s", "a", "a", "a")]


async def test_partitions_left_by_an_interrupted_addition_stay_hidden(cluster: Cluster) -> None:
    await cluster.up("a")
    await cluster.stream("s", part("s", "a", "a", "a"))
    old = _record(cluster, "s")
    changes = StreamChanges(cluster.admin, cluster.keys, plain_transact(cluster.admin))
    # An addition that wrote its partition keys but never the stream record (its writer died in between).
    await cluster.admin.put(cluster.keys.partition("s", 1), msgspec.msgpack.encode(part("s", "a", "a", "a", pid=1)))
    await changes.alter(old, msgspec.structs.replace(old, config=StreamConfig(retention_max_bytes=9)))
    snap = await cluster.wait(lambda s: s.stream("s") != old)
    assert [p.id for p in snap.partitions_of("s")] == [0]  # still hidden: the count says 1

    record = _record(cluster, "s")
    grown = msgspec.structs.replace(record, partitions=2)
    assert await changes.add_partitions(record, grown, [part("s", "a", "a", "a", pid=1)]) is ChangeOutcome.CHANGED
    assert [p.id for p in (await cluster.wait(lambda s: s.stream("s") == grown)).partitions_of("s")] == [0, 1]


async def test_bad_calls_are_refused(cluster: Cluster) -> None:
    await cluster.up("a")
    await cluster.stream("s", part("s", "a", "a", "a"))
    old = _record(cluster, "s")
    changes = StreamChanges(cluster.admin, cluster.keys, plain_transact(cluster.admin))
    with pytest.raises(ValueError, match="are not"):  # ids must continue the stream's
        await changes.add_partitions(old, msgspec.structs.replace(old, partitions=3), [part("s", "a", "a", "a", pid=2)])
    with pytest.raises(ValueError, match="rename"):
        await changes.alter(old, msgspec.structs.replace(old, name="t"))
    node = await cluster.node("ctl")
    await node.active()
    other = await cluster.node("other")
    with pytest.raises(NotControllerError):
        await other.controller.alter_stream(old, old)
