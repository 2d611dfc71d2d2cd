"""A group member's committed offsets: cursors named after the group, written only while the member owns them.

A committed offset of group ``G`` in ``stream``/``partition`` is the cursor ``G`` of that partition (SET_CURSOR and
FETCH_CURSOR, :mod:`tidelog.broker.cursors`): one store, acknowledged once every in-sync replica of its
``__cursors`` partition holds it, and readable with ``Admin.fetch_cursor`` or Liftbridge's ``FetchCursor``.

**What is stored is the next offset to read**, as Kafka commits it: after handling the record at offset 41 a
member commits 42, and a member that takes the partition over starts reading at 42. (Liftbridge's own clients
store the offset of the last record handled and resume one past it: a Liftbridge client resuming from a group's
cursor reads one record again.) A cursor that was never set reads -1: no committed offset.

**Fencing.** The broker's cursors do not check group membership: any client may set any cursor. So this member
refuses to commit a partition unless the coordinator says, just before the write, that the partition is its own
at the group's current epoch (:meth:`GroupMembership.confirm`, a heartbeat): a member whose partitions moved
(it was removed after a silence, or the group rebalanced) gets ``StaleGroupEpochError`` and nothing is written,
so it cannot set back the offset the new owner committed. What remains open is the moment between that check and
the write: closing it needs the broker to fence cursor writes by group epoch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from tidelog.client.admin import Admin
from tidelog.client.group_membership import GroupMembership, StreamPartition
from tidelog.protocol.errors import StaleGroupEpochError


class GroupCommits:
    """Committed offsets of one member of one group; see the module docstring."""

    def __init__(self, admin: Admin, membership: GroupMembership) -> None:
        self._admin = admin
        self._membership = membership
        self.committed: dict[StreamPartition, int] = {}  # what this member last committed or read, per partition

    @property
    def cursor_id(self) -> str:
        return self._membership.group_id

    async def fetch(self, partitions: Iterable[StreamPartition]) -> dict[StreamPartition, int]:
        """The committed offsets (next offsets to read) of ``partitions``; those with none are left out."""
        wanted = list(partitions)
        offsets = await asyncio.gather(
            *(self._admin.fetch_cursor(tp.stream, tp.partition, self.cursor_id) for tp in wanted)
        )
        found = {tp: offset for tp, offset in zip(wanted, offsets, strict=True) if offset >= 0}
        self.committed.update(found)
        return found

    async def commit(self, offsets: Mapping[StreamPartition, int]) -> None:
        """Store ``offsets`` (next offsets to read) once the coordinator confirms each partition is this member's;
        ``StaleGroupEpochError`` (nothing written) when one is not, ``ValueError`` for a negative offset."""
        for tp, offset in offsets.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"{tp.stream}/{tp.partition}: a committed offset is a next offset to read, >= 0; "
                                 f"got {offset!r}")  # fmt: skip
        if not offsets:
            return
        await self._membership.confirm()
        foreign = sorted(tp for tp in offsets if tp not in self._membership.assigned)
        if foreign:
            names = ", ".join(f"{tp.stream}/{tp.partition}" for tp in foreign)
            raise StaleGroupEpochError(
                f"consumer {self._membership.consumer_id} does not own {names} in consumer group "
                f"{self._membership.group_id} at its epoch {self._membership.epoch}: nothing committed"
            )
        await asyncio.gather(
            *(self._admin.set_cursor(tp.stream, tp.partition, self.cursor_id, offset) for tp, offset in offsets.items())
        )
        self.committed.update(offsets)

    def forget(self, partitions: Iterable[StreamPartition]) -> None:
        """Drop what is known of partitions no longer assigned (another member commits them now)."""
        for tp in partitions:
            self.committed.pop(tp, None)
