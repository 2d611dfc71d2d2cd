"""An immutable view of the cluster's metadata at one etcd revision.

The mirror replaces its snapshot wholesale on every applied change, so code that holds a snapshot reads a
consistent cluster state without locks, and ``revision`` tells which etcd write it reflects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord

PartitionKey = tuple[str, int]

_EMPTY: Mapping[str, object] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """Streams, partitions and live brokers as of ``revision``."""

    revision: int = 0
    streams: Mapping[str, StreamRecord] = field(default_factory=dict)
    partitions: Mapping[PartitionKey, PartitionRecord] = field(default_factory=dict)
    brokers: Mapping[str, BrokerRecord] = field(default_factory=dict)

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
