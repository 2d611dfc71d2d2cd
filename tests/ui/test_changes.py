"""The web view's recent activity: the differences between two metadata snapshots, in words."""

from __future__ import annotations

import asyncio

from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.ui.changes import KEPT, RecentChanges, changes_between


def _snapshot(revision: int, brokers: tuple[str, ...], *partitions: PartitionRecord) -> MetadataSnapshot:
    return MetadataSnapshot(
        revision,
        {"s": StreamRecord("s", "s", "", 2, 3, 0)},
        {(p.stream, p.id): p for p in partitions},
        {b: BrokerRecord(b, "h", 1, 2, 0) for b in brokers},
    )


def test_leader_isr_flags_and_brokers_are_described() -> None:
    before = _snapshot(5, ("a", "b", "c"), PartitionRecord("s", 0, ("a", "b", "c"), "a", ("a", "b", "c")))
    after = _snapshot(
        6, ("b", "c", "d"), PartitionRecord("s", 0, ("a", "b", "c"), "b", ("b", "c"), leader_epoch=2, paused=True)
    )
    assert list(changes_between(before, after)) == [
        ("broker d", "joined"),
        ("broker a", "left (its lease ended)"),
        ("s/0", "leader a → b (epoch 2)"),
        ("s/0", "ISR shrank: a left (2/3)"),
        ("s/0", "paused"),
    ]


def test_the_newest_changes_are_kept_newest_first_and_the_first_load_is_not_a_change() -> None:
    recent = RecentChanges(clock=lambda: 1.0)
    empty = MetadataSnapshot()
    asyncio.run(recent.listener(empty, _snapshot(1, ("a",))))
    assert recent.newest() == []
    for revision in range(2, KEPT + 12):
        old = _snapshot(revision - 1, (f"b{revision - 1}",))
        asyncio.run(recent.listener(old, _snapshot(revision, (f"b{revision - 1}", f"b{revision}"))))
    newest = recent.newest()
    assert len(newest) == KEPT
    assert newest[0].subject == f"broker b{KEPT + 11}" and newest[0].revision == KEPT + 11
