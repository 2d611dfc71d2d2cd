"""Consumer groups as the protocol servers see them: one entry point for gRPC and the wire protocol.

:class:`GroupService` checks each request's input (ids by :func:`~tidelog.metadata.group_records.check_id`, a join
without streams, a report without a coordinator: INVALID_ARGUMENT, nothing stored), then sends it where it is
served:

- join, leave and report change the group's record: served by the controller
  (:class:`~tidelog.broker.groups.membership.GroupMembership`), in process when this broker is the controller,
  forwarded over the wire protocol otherwise (``forwarded`` set, so it never travels further);
- fetching assignments is served here, by this broker's
  :class:`~tidelog.broker.groups.coordinator.GroupCoordinator` (NOT_COORDINATOR when it does not coordinate the
  group, as Liftbridge answers).

It also answers what other requests need to know about groups: a group's record for ``FetchMetadata``; whether a
member may read a partition (``Subscribe``, a FETCH with a group context: :meth:`GroupService.check_read`) or
commit it (:meth:`GroupService.commit_fence`), fenced by the group epoch (:mod:`tidelog.broker.groups.fencing`);
and, through ``readers`` (:mod:`tidelog.broker.groups.readers`), when a member's subscription must end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tidelog.broker.controller_link import ControllerLink, call_controller
from tidelog.broker.groups.coordinator import GroupCoordinator
from tidelog.broker.groups.fencing import check_context, check_owner, record_at_least
from tidelog.broker.groups.membership import GroupMembership
from tidelog.broker.groups.readers import GroupReaders
from tidelog.metadata.group_mirror import GroupMirror
from tidelog.metadata.group_records import GroupRecord, check_id
from tidelog.protocol.errors import InvalidArgumentError, UnavailableError
from tidelog.protocol.group_messages import (
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    ReportCoordinatorRequest,
)
from tidelog.protocol.messages import GroupContext

FORWARD_TIMEOUT = 10.0  # seconds a forwarded group request may take, retries to reach the controller included


@dataclass(frozen=True, slots=True)
class Joined:
    """The answer to a join: where to heartbeat, at which epoch, and the broker's timeouts in milliseconds."""

    coordinator: str
    epoch: int
    consumer_timeout_ms: int
    coordinator_timeout_ms: int


class GroupService:
    """See the module docstring."""

    def __init__(
        self,
        broker_id: str,
        groups: GroupMirror,
        membership: GroupMembership,
        coordinator: GroupCoordinator,
        link: ControllerLink | None,
        *,
        consumer_timeout_ms: int,
        coordinator_timeout_ms: int,
    ) -> None:
        self.broker_id = broker_id
        self.groups = groups
        self.membership = membership
        self.coordinator = coordinator
        self.readers = GroupReaders(groups)
        self._link = link
        self.consumer_timeout_ms = consumer_timeout_ms
        self.coordinator_timeout_ms = coordinator_timeout_ms

    # ---- requests that change a group (the controller's) ----

    async def join(self, group_id: str, consumer_id: str, streams: Sequence[str], *, forwarded: bool = False) -> Joined:
        check_id("groupId", group_id)
        check_id("consumerId", consumer_id)
        if not streams:
            raise InvalidArgumentError("no streams provided: a consumer joins a group to consume one or more streams")
        if any(not s for s in streams):
            raise InvalidArgumentError("stream names in a join may not be empty")
        wanted = tuple(streams)
        if self._serve_here(forwarded):
            record = await call_controller(self.membership.join(group_id, consumer_id, wanted))
            return self._joined(record)
        response = await self._forward(JoinGroupRequest(group_id, consumer_id, wanted, forwarded=True))
        assert isinstance(response, JoinGroupResponse)
        return Joined(
            response.coordinator, response.epoch, response.consumer_timeout_ms, response.coordinator_timeout_ms
        )

    async def leave(self, group_id: str, consumer_id: str, *, expired: bool = False, forwarded: bool = False) -> None:
        check_id("groupId", group_id)
        check_id("consumerId", consumer_id)
        if self._serve_here(forwarded):
            await call_controller(self.membership.leave(group_id, consumer_id, expired=expired))
            return
        await self._forward(LeaveGroupRequest(group_id, consumer_id, expired=expired, forwarded=True))

    async def report(
        self, group_id: str, consumer_id: str, coordinator: str, epoch: int, *, forwarded: bool = False
    ) -> None:
        check_id("groupId", group_id)
        check_id("consumerId", consumer_id)
        if not coordinator:
            raise InvalidArgumentError("no coordinator provided: name the broker id the group's metadata gave")
        if self._serve_here(forwarded):
            await call_controller(self.membership.report(group_id, consumer_id, coordinator, epoch))
            return
        await self._forward(ReportCoordinatorRequest(group_id, consumer_id, coordinator, epoch, forwarded=True))

    # ---- the coordinator's ----

    async def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int
    ) -> tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]:
        check_id("groupId", group_id)
        check_id("consumerId", consumer_id)
        return await self.coordinator.fetch_assignments(group_id, consumer_id, epoch)

    async def expire(self, group_id: str, consumer_id: str) -> None:
        """Remove a member that stopped heartbeating (the coordinator calls this)."""
        await self.leave(group_id, consumer_id, expired=True)

    # ---- what other requests need ----

    def record(self, group_id: str) -> GroupRecord | None:
        """The group as this broker knows it (None: no such group)."""
        return self.groups.get(group_id)

    async def check_subscribe(
        self, group_id: str, consumer_id: str, epoch: int, stream: str, partition: int, isr_replica: bool
    ) -> None:
        """Refuse a Subscribe by a group consumer that may not read ``stream``/``partition`` now: a stale group
        epoch, or a partition not assigned to that consumer at the group's epoch (FailedPrecondition, as
        Liftbridge refuses a consumer that is not currently assigned the partition)."""
        context = GroupContext(group_id, consumer_id, max(epoch, 0))
        check_context(context)
        if isr_replica:
            raise InvalidArgumentError("consumer groups are not compatible with readISRReplica")
        await self.check_read(context, stream, partition)

    async def check_read(self, context: GroupContext, stream: str, partition: int) -> None:
        """Refuse a member's read (a FETCH, a Subscribe) of a partition it does not own at the group's current
        epoch (:mod:`tidelog.broker.groups.fencing`)."""
        check_context(context)
        record = await record_at_least(self.groups, context)
        check_owner(record, context, stream, partition, "read")

    async def commit_fence(
        self, context: GroupContext, cursor_id: str, stream: str, partition: int
    ) -> Callable[[], None]:
        """The check of a member's commit, to run just before its write is issued (it raises to refuse it): the
        cursor must be the group's, and the member must own the partition at the group's current epoch. Waits
        first (briefly) for this broker's record of the group to reach the member's epoch."""
        check_context(context)
        if cursor_id != context.group_id:
            raise InvalidArgumentError(
                f"a member of consumer group {context.group_id} commits the group's cursor: cursor id {cursor_id!r} "
                "is not the group id"
            )
        await record_at_least(self.groups, context)

        def fence() -> None:
            check_owner(self.groups.get(context.group_id), context, stream, partition, "commit")

        return fence

    async def catch_up(self, context: GroupContext) -> None:
        """Wait (briefly) until this broker's record of the group is at the member's epoch or newer: a member taking
        a partition over reads its committed offset only once commits at older epochs are refused here."""
        check_context(context)
        await record_at_least(self.groups, context)

    # ---- helpers ----

    def _joined(self, record: GroupRecord) -> Joined:
        return Joined(record.coordinator, record.epoch, self.consumer_timeout_ms, self.coordinator_timeout_ms)

    def _serve_here(self, forwarded: bool) -> bool:
        """True to serve a group change with the local controller; False to forward it. A forwarded request that
        reaches a broker no longer the controller is refused as retriable: its sender tries the controller again."""
        if self.membership.active or self._link is None:
            return True
        if forwarded:
            raise UnavailableError(
                f"broker {self.broker_id} is not the controller (the controller is {self._link.controller_id})"
            )
        return False

    async def _forward(self, request: Any) -> Any:
        assert self._link is not None
        return await self._link.forward(request, FORWARD_TIMEOUT)
