"""Group consumers reading this broker's partitions through ``Subscribe``, and ending those that lost a partition.

At most one member of a group reads a partition at a time (Liftbridge's rule): a subscription as a group consumer
registers here for its (group, stream, partition); a newer one of the same group ends the older (the newer passed
the epoch check, so it holds the current assignment). A change of the group's record also ends every registered
subscription whose partition is no longer assigned to its consumer (moved by a rebalance, or the consumer removed
for silence, or the group gone), so a member that misses a rebalance stops reading at once rather than at its
next heartbeat. An ended subscription finishes cleanly (status OK), as Liftbridge closes a replaced subscriber.

Only the broker the subscription reads from knows it: this is per broker, in memory, and needs no coordination.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.group_records import GroupRecord


@dataclass(slots=True)
class _Reader:
    consumer_id: str
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class GroupReaders:
    """See the module docstring."""

    def __init__(self, groups: GroupMirror) -> None:
        self._readers: dict[tuple[str, str, int], _Reader] = {}
        groups.add_listener(self._on_group)

    @contextmanager
    def reading(self, group_id: str, consumer_id: str, stream: str, partition: int) -> Iterator[asyncio.Event]:
        """Register a group consumer's subscription while the ``with`` block runs; the event is set when the
        subscription must end."""
        key = (group_id, stream, partition)
        previous = self._readers.get(key)
        if previous is not None:
            previous.ended.set()
        reader = self._readers[key] = _Reader(consumer_id)
        try:
            yield reader.ended
        finally:
            if self._readers.get(key) is reader:
                del self._readers[key]

    def count(self, group_id: str) -> int:
        """How many subscriptions of ``group_id`` read here now."""
        return sum(1 for key in self._readers if key[0] == group_id)

    async def _on_group(self, old: GroupRecord | None, new: GroupRecord | None) -> None:
        group_id = new.id if new is not None else old.id if old is not None else None
        for (group, stream, partition), reader in list(self._readers.items()):
            if group != group_id:
                continue
            if new is None or new.owner_of(stream, partition) != reader.consumer_id:
                reader.ended.set()
