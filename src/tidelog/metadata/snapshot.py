"""An immutable view of the cluster's metadata at one etcd revision.

The mirror replaces its snapshot wholesale on every applied change, so code that holds a snapshot reads a
consistent cluster state without locks, and ``revision`` tells which etcd write it reflects. The mirror's
snapshots share the records that did not change with their predecessor
(:class:`~tidelog.metadata.shared_map.SharedMap`), and say what changed since it (``change``), so that a
listener can act on the changed records only: one change costs what changed, not what the cluster holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord

PartitionKey = tuple[str, int]

_EMPTY: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SnapshotChange:
    """What differs between a snapshot and the one the mirror published before it: the keys whose record was
    put, replaced or removed (a partition that appeared or disappeared with its stream included)."""

    partitions: frozenset[PartitionKey] = frozenset()
    streams: frozenset[str] = frozenset()
    brokers: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.partitions or self.streams or self.brokers)


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """Streams, partitions and live brokers as of ``revision``.

    ``change`` is what changed since the snapshot the mirror published before this one; None when unknown (the
    first snapshot, a re-read of the whole prefix, or a snapshot not made by the mirror): then anything may
    have changed.
    """

    revision: int = 0
    streams: Mapping[str, StreamRecord] = field(default_factory=dict)
    partitions: Mapping[PartitionKey, PartitionRecord] = field(default_factory=dict)
    brokers: Mapping[str, BrokerRecord] = field(default_factory=dict)
    change: SnapshotChange | None = field(default=None, compare=False)

    def stream(self, name: str) -> StreamRecord | None:
        return self.streams.get(name)

    def partition(self, stream: str, partition: int) -> PartitionRecord | None:
        return self.partitions.get((stream, partition))

    def partitions_of(self, stream: str) -> list[PartitionRecord]:
        """The partitions of ``stream`` in id order."""
        record = self.streams.get(stream)
        if record is None:
            return []
        found = (self.partitions.get((stream, i)) for i in range(record.partitions))
        return [p for p in found if p is not None]


def changed_partitions(old: MetadataSnapshot, new: MetadataSnapshot) -> set[PartitionKey] | None:
    """The partitions a listener must look at again going from ``old`` to ``new``: those whose record changed and
    every partition of a stream whose record changed (its settings apply to them). None when every partition
    must be looked at: ``new`` does not say what changed, or a broker came, went or changed (a follower's
    leader address, the live set a failover plan reads)."""
    change = new.change
    if change is None or change.brokers:
        return None
    keys = set(change.partitions)
    for name in change.streams:
        before, after = old.streams.get(name), new.streams.get(name)
        count = max(before.partitions if before else 0, after.partitions if after else 0)
        keys.update((name, i) for i in range(count))
    return keys
