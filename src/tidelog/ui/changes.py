"""The web view's "recent activity": what changed in the metadata mirror while this broker ran.

:class:`RecentChanges` listens to the broker's :class:`~tidelog.metadata.mirror.MetadataMirror` and keeps the last
:data:`KEPT` changes in words: brokers joining and leaving, streams created and deleted, partition leaders
elected, ISRs shrinking and growing, partitions paused, resumed, made read-only or suspended. It reads the two
snapshots it is handed and changes nothing. The cluster's durable record is the ``__activity`` stream
(``tidelog activity``); this is the live view of the same events as this broker saw them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot

__all__ = ["KEPT", "Change", "RecentChanges", "changes_between"]

KEPT = 50
"""Changes the view keeps (the newest)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One change: when it was seen (Unix seconds), the metadata revision, what it concerns and what happened."""

    at: float
    revision: int
    subject: str
    what: str


class RecentChanges:
    """The newest :data:`KEPT` changes, newest first; :meth:`listener` goes to ``mirror.add_listener``."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._kept: deque[Change] = deque(maxlen=KEPT)

    async def listener(self, old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        if old.revision == 0:  # the first load: the state, not a change
            return
        now = self._clock()
        for subject, what in changes_between(old, new):
            self._kept.appendleft(Change(now, new.revision, subject, what))

    def newest(self) -> list[Change]:
        return list(self._kept)


def changes_between(old: MetadataSnapshot, new: MetadataSnapshot) -> Iterator[tuple[str, str]]:
    """(subject, what happened) for every difference between two snapshots that an operator cares about."""
    change = new.change  # the mirror names what changed: look at that only, not at every partition
    streams = change.streams if change is not None else new.streams.keys() | old.streams.keys()
    partitions = change.partitions if change is not None else new.partitions.keys()
    for broker in sorted(new.brokers.keys() - old.brokers.keys()):
        yield f"broker {broker}", "joined"
    for broker in sorted(old.brokers.keys() - new.brokers.keys()):
        yield f"broker {broker}", "left (its lease ended)"
    for stream in sorted(s for s in streams if s in new.streams and s not in old.streams):
        record = new.streams[stream]
        counts = f"{_count(record.partitions, 'partition')} × {_count(record.replication_factor, 'replica')}"
        yield f"stream {stream}", f"created: {counts}"
    for stream in sorted(s for s in streams if s in old.streams and s not in new.streams):
        yield f"stream {stream}", "deleted"
    for key in sorted(partitions):
        before, after = old.partitions.get(key), new.partitions.get(key)
        if before is not None and after is not None and before != after:
            subject = f"{key[0]}/{key[1]}"
            for what in _partition_changes(before, after):
                yield subject, what


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _partition_changes(before: PartitionRecord, after: PartitionRecord) -> Iterator[str]:
    if after.leader != before.leader:
        yield f"leader {before.leader or '-'} → {after.leader or '-'} (epoch {after.leader_epoch})"
    lost = [r for r in before.isr if r not in after.isr]
    gained = [r for r in after.isr if r not in before.isr]
    if lost:
        yield f"ISR shrank: {', '.join(lost)} left ({len(after.isr)}/{len(after.replicas)})"
    if gained:
        yield f"ISR grew: {', '.join(gained)} joined ({len(after.isr)}/{len(after.replicas)})"
    for flag, on, off in (("paused", "paused", "resumed"), ("readonly", "made read-only", "made writable")):
        if getattr(after, flag) != getattr(before, flag):
            yield on if getattr(after, flag) else off
    if after.suspended != before.suspended:
        yield f"suspended: {after.suspended}" if after.suspended else "no longer suspended"
