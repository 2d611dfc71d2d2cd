"""The coordinator's side of consumer groups: heartbeats, assignments, and removing members that went quiet.

Every broker runs one :class:`GroupCoordinator`; it acts for the groups whose record names this broker as the
coordinator (the controller chose it: :mod:`tidelog.broker.groups.membership`). For those it keeps one deadline
per member, in memory: a member's ``FetchConsumerGroupAssignments`` (its heartbeat) moves its deadline to
``now + consumer_timeout``. One sweep task per broker (not a timer per member) looks at the deadlines a few times
per timeout; a member past its deadline is removed through the controller (a LeaveConsumerGroup marked expired),
which rebalances its partitions onto the others and bumps the group's epoch. A removal that fails (no controller
for a moment) is tried again on a later sweep.

A broker that becomes a group's coordinator (the group was just created, or failed over to it) gives every member
a full timeout from that moment: it cannot know when they last heartbeated to the previous coordinator. A broker
that stops being the coordinator forgets the group's deadlines.

Answers follow Liftbridge's ``GetAssignments``: a broker that is not the coordinator says so (NOT_COORDINATOR), an
epoch other than the group's is STALE_GROUP_EPOCH, a consumer that is not a member UNKNOWN_MEMBER; all three are
FailedPrecondition on gRPC. A request carrying an epoch newer than this broker's record (the join was answered by
the controller a moment ago) first waits, briefly, for this broker's mirror to catch up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from tidelog.clock import Clock, SystemClock
from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.group_records import GroupRecord
from tidelog.protocol.errors import NotCoordinatorError, StaleGroupEpochError, UnknownGroupError, UnknownMemberError

log = logging.getLogger(__name__)

CATCH_UP = 2.0
"""Longest a request with an epoch newer than this broker's record waits for the record to arrive, seconds."""

Expire = Callable[[str, str], Awaitable[None]]
"""Remove ``(group id, consumer id)`` from its group (a leave, marked expired, sent to the controller)."""


class GroupCoordinator:
    """This broker's coordinator duties; see the module docstring."""

    def __init__(
        self,
        broker_id: str,
        groups: GroupMirror,
        *,
        consumer_timeout: float,
        expire: Expire,
        clock: Clock | None = None,
    ) -> None:
        self.broker_id = broker_id
        self._groups = groups
        self._timeout_ns = int(consumer_timeout * 1e9)
        self._sweep_every = max(0.05, min(1.0, consumer_timeout / 5))
        self._expire = expire
        self._clock = clock or SystemClock()
        self._deadlines: dict[str, dict[str, int]] = {}  # group id → consumer id → monotonic deadline (ns)
        self._removing: set[asyncio.Task[None]] = set()
        groups.add_listener(self._on_group)

    def deadlines(self, group_id: str) -> dict[str, int]:
        """The heartbeat deadlines this broker keeps for ``group_id`` (empty unless it coordinates the group)."""
        return dict(self._deadlines.get(group_id, {}))

    async def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int
    ) -> tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]:
        """The group's epoch and the member's assignments; also the member's heartbeat."""
        record = await self._record_at(group_id, epoch)
        if record is None:
            raise UnknownGroupError(f"no such consumer group {group_id}")
        if record.coordinator != self.broker_id:
            raise NotCoordinatorError(
                f"broker {self.broker_id} is not the coordinator of consumer group {group_id} "
                f"(the coordinator is {record.coordinator}, epoch {record.epoch})"
            )
        if epoch != record.epoch:
            raise StaleGroupEpochError(
                f"group epoch {epoch} differs from consumer group {group_id}'s epoch {record.epoch}: "
                "fetch the group's metadata and try again"
            )
        member = record.member(consumer_id)
        if member is None:
            raise UnknownMemberError(f"consumer {consumer_id} is not a member of consumer group {group_id}")
        self._deadlines.setdefault(group_id, {})[consumer_id] = self._clock.monotonic_ns() + self._timeout_ns
        return record.epoch, member.assignments

    async def run(self) -> None:
        """Sweep the deadlines until cancelled (module docstring)."""
        for record in list(self._groups.groups.values()):
            self._track(None, record)
        try:
            while True:
                await self._clock.sleep(self._sweep_every)
                self._sweep()
        finally:
            for task in list(self._removing):
                task.cancel()

    def _sweep(self) -> None:
        now = self._clock.monotonic_ns()
        for group_id, members in list(self._deadlines.items()):
            for consumer_id, deadline in list(members.items()):
                if deadline <= now:
                    members[consumer_id] = now + self._timeout_ns  # not again before this removal had its chance
                    task = asyncio.create_task(self._remove(group_id, consumer_id), name=f"group-expire-{group_id}")
                    self._removing.add(task)
                    task.add_done_callback(self._removing.discard)

    async def _remove(self, group_id: str, consumer_id: str) -> None:
        log.warning("group %s: consumer %s sent no heartbeat for %.1fs; removing it", group_id, consumer_id,
                    self._timeout_ns / 1e9)  # fmt: skip
        try:
            await self._expire(group_id, consumer_id)
        except (UnknownMemberError, UnknownGroupError):
            with contextlib.suppress(KeyError):
                del self._deadlines[group_id][consumer_id]
        except Exception as error:
            log.warning("group %s: could not remove consumer %s yet (%s); trying again", group_id, consumer_id,
                        error)  # fmt: skip
            members = self._deadlines.get(group_id)
            if members is not None and consumer_id in members:
                members[consumer_id] = self._clock.monotonic_ns()  # the next sweep tries again

    async def _record_at(self, group_id: str, epoch: int) -> GroupRecord | None:
        record = self._groups.get(group_id)
        if record is None or record.epoch < epoch:

            def arrived(mirror: GroupMirror) -> bool:
                found = mirror.get(group_id)
                return found is not None and found.epoch >= epoch

            with contextlib.suppress(TimeoutError):
                await self._groups.wait_for(arrived, CATCH_UP)
            record = self._groups.get(group_id)
        return record

    async def _on_group(self, old: GroupRecord | None, new: GroupRecord | None) -> None:
        self._track(old, new)

    def _track(self, old: GroupRecord | None, new: GroupRecord | None) -> None:
        """Start, keep or drop deadlines after a change of one group's record."""
        if new is None or new.coordinator != self.broker_id:
            if old is not None:
                self._deadlines.pop(old.id, None)
            return
        fresh = old is None or old.coordinator != self.broker_id
        members = {} if fresh else self._deadlines.get(new.id, {})
        start = self._clock.monotonic_ns() + self._timeout_ns
        self._deadlines[new.id] = {m.id: members.get(m.id, start) for m in new.members}
