"""A group member's committed offsets: cursors named after the group, written only while the member owns them.

A committed offset of group ``G`` in ``stream``/``partition`` is the cursor ``G`` of that partition (SET_CURSOR and
FETCH_CURSOR, :mod:`tidelog.broker.cursors`): one store, acknowledged once every in-sync replica of its
``__cursors`` partition holds it, and readable with ``Admin.fetch_cursor`` or Liftbridge's ``FetchCursor``.

**What is stored is the next offset to read**, as Kafka commits it: after handling the record at offset 41 a
member commits 42, and a member that takes the partition over starts reading at 42. (Liftbridge's own clients
store the offset of the last record handled and resume one past it: a Liftbridge client resuming from a group's
cursor reads one record again.) A cursor that was never set reads -1: no committed offset.

**Fencing.** Every commit carries the member's group context (group, consumer id, the epoch it holds), and the
broker leading the cursor refuses it, nothing stored, unless the partition is the member's at the group's current
epoch (:mod:`tidelog.broker.groups.fencing`): a member whose partitions moved (it was removed after a silence,
or the group rebalanced) cannot set back the offset the new owner committed. So a commit is one round trip
to the cursor's leader, as Kafka's is to its coordinator; the member refuses, itself, a partition it no longer
holds (``StaleGroupEpochError``), and when the broker refuses a commit because the epoch moved, the member
heartbeats (:meth:`GroupMembership.confirm`) and tries once more at the epoch it learns.
Reading the committed offsets of partitions
just assigned carries the context too: the broker answers once commits at older epochs are refused, and after
those already under way, so a member taking a partition over resumes after the last commit acknowledged to the
previous owner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from tidelog.client.admin import Admin
from tidelog.client.group_membership import GroupMembership, StreamPartition
from tidelog.protocol.errors import StaleGroupEpochError
from tidelog.protocol.messages import GroupContext


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
        group = self._membership.context()
        offsets = await asyncio.gather(
            *(self._admin.fetch_cursor(tp.stream, tp.partition, self.cursor_id, group=group) for tp in wanted)
        )
        found = {tp: offset for tp, offset in zip(wanted, offsets, strict=True) if offset >= 0}
        self.committed.update(found)
        return found

    async def commit(self, offsets: Mapping[StreamPartition, int]) -> None:
        """Store ``offsets`` (next offsets to read) at the member's epoch; ``StaleGroupEpochError`` when one is not
        this member's (none written) or the broker refused one even at the current epoch (that one not written),
        ``ValueError`` for a negative offset."""
        for tp, offset in offsets.items():
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"{tp.stream}/{tp.partition}: a committed offset is a next offset to read, >= 0; "
                                 f"got {offset!r}")  # fmt: skip
        if not offsets:
            return
        pending = dict(offsets)
        for attempt in range(2):  # once more after a refusal, at the epoch a heartbeat then learns
            if attempt:
                await self._membership.confirm()
            self._check_owned(pending)
            group = self._membership.context()
            sets = [self._set(tp, offset, group) for tp, offset in pending.items()]
            # One partition (a commit after each record, or of the only partition held): awaited in this task, not
            # in one gather starts for it, which costs a task and a turn of the loop per commit.
            results = [await sets[0]] if len(sets) == 1 else await asyncio.gather(*sets)
            failures: list[Exception] = []
            for (tp, offset), result in zip(list(pending.items()), results, strict=True):
                if result is None:
                    self.committed[tp] = offset
                    del pending[tp]
                else:
                    failures.append(result)
            if not failures:
                return
            stale = all(isinstance(f, StaleGroupEpochError) for f in failures)
            if attempt or not stale:
                raise next((f for f in failures if not isinstance(f, StaleGroupEpochError)), failures[0])

    async def _set(self, tp: StreamPartition, offset: int, group: GroupContext) -> Exception | None:
        """Store one committed offset; its failure as a value (None: stored), as ``gather`` would return it."""
        try:
            await self._admin.set_cursor(tp.stream, tp.partition, self.cursor_id, offset, group=group)
        except Exception as exc:
            return exc
        return None

    def _check_owned(self, offsets: Mapping[StreamPartition, int]) -> None:
        foreign = sorted(tp for tp in offsets if tp not in self._membership.assigned)
        if foreign:
            names = ", ".join(f"{tp.stream}/{tp.partition}" for tp in foreign)
            raise StaleGroupEpochError(
                f"consumer {self._membership.consumer_id} does not own {names} in consumer group "
                f"{self._membership.group_id} at its epoch {self._membership.epoch}: nothing committed"
            )

    def forget(self, partitions: Iterable[StreamPartition]) -> None:
        """Drop what is known of partitions no longer assigned (another member commits them now)."""
        for tp in partitions:
            self.committed.pop(tp, None)
