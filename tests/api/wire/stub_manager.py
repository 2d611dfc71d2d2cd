"""A partition manager for wire-server tests: leads exactly the partitions it is given."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.broker.partition import Partition
from tidelog.protocol.errors import UnknownStreamError


@dataclass
class StubManager:
    """Leads exactly the partitions it holds; anything else is an unknown stream."""

    partitions: dict[tuple[str, int], Partition] = field(default_factory=dict)

    def leader_of(self, stream: str, partition: int) -> Partition:
        found = self.partitions.get((stream, partition))
        if found is None:
            raise UnknownStreamError(f"no stream named {stream!r}")
        return found
