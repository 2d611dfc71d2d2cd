"""A consumer group member's side of membership: join, heartbeat, follow the coordinator, leave.

:class:`GroupMembership` is what :class:`~tidelog.client.group_consumer.GroupConsumer` uses to be a member of a
group (:mod:`tidelog.broker.groups`), over the wire protocol only:

- **join** (JOIN_GROUP, any broker; the controller serves it) answers the coordinator, the group's epoch and the
  broker's timeouts; the member then heartbeats every ``heartbeat_interval`` (a third of the consumer timeout by
  default, and refused unless below it) by fetching its assignments from the coordinator (GROUP_ASSIGNMENTS).
- **epochs**: every membership change gives the group a new epoch, and the coordinator refuses a heartbeat at any
  other epoch (STALE_GROUP_EPOCH). The member then asks any broker where the group stands (DESCRIBE_GROUP: its
  coordinator and epoch) and heartbeats again; the answer carries its assignments at the new epoch.
- **coordinator failover**: a coordinator that answers NOT_COORDINATOR, or does not answer within the interval, is
  looked up again (DESCRIBE_GROUP); one that has given no answer for the broker's coordinator timeout is reported
  (REPORT_COORDINATOR): reports from more than half of the members move the group to another broker.
- **removal**: a member the coordinator removed for silence gets UNKNOWN_MEMBER; it joins again (it is a new
  member with, probably, other partitions) and logs a warning.
- **silence**: a member whose heartbeats have gone unanswered for the consumer timeout (its coordinator
  unreachable from it) gives its partitions up, as if they were revoked: the coordinator removes a member it has
  not heard from for that long and gives them to others, so reading or committing them on would make a zombie.
  The timeout counts from when the last answered heartbeat was *sent*, so the member stops no later than the
  coordinator removes it. An answer gives the partitions back; after a removal the member joins again.
- **fencing**: fetches and commits carry :meth:`GroupMembership.context` (group, consumer, epoch held), and
  brokers refuse them at any epoch but the group's (:mod:`tidelog.broker.groups.fencing`); a refused request
  makes the member heartbeat at once (:meth:`GroupMembership.refresh`).
- **leave** (LEAVE_GROUP) when closing, so the partitions move at once rather than after the timeout.
- **the same id again**: a join refused because the consumer id is still a member (a crashed earlier run of this
  consumer, not yet timed out) takes that member's place: it leaves for it and joins again, as Kafka's static
  members replace their earlier instance. Consumer ids are one per running consumer.

The assignments are kept as a frozenset of :class:`StreamPartition`; :attr:`GroupMembership.changed` is set
whenever they (or the epoch) change, for the consumer to apply the rebalance from its own task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import NamedTuple

from tidelog.client.cluster import Cluster
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import (
    GroupRefusedError,
    NotCoordinatorError,
    RequestTimeoutError,
    StaleGroupEpochError,
    TidelogError,
    UnavailableError,
    UnknownGroupError,
    UnknownMemberError,
)
from tidelog.protocol.group_messages import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupAssignmentsRequest,
    GroupAssignmentsResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    ReportCoordinatorRequest,
)
from tidelog.protocol.messages import GroupContext

log = logging.getLogger(__name__)

HEARTBEAT_ATTEMPTS = 8
"""Tries per heartbeat round (a new epoch, a moved coordinator, a rejoin each cost one) before waiting a round."""


class StreamPartition(NamedTuple):
    """One partition of one stream (Kafka's ``TopicPartition``)."""

    stream: str
    partition: int


class GroupMembership:
    """One member of one consumer group; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        group_id: str,
        consumer_id: str,
        streams: tuple[str, ...],
        *,
        heartbeat_interval_ms: int | None = None,
    ) -> None:
        self._cluster = cluster
        self.group_id = group_id
        self.consumer_id = consumer_id
        self.streams = streams
        self._interval_ms = heartbeat_interval_ms
        self.interval = 1.0  # seconds between heartbeats, set by the join
        self.consumer_timeout = 15.0
        self.coordinator_timeout = 15.0
        self.coordinator = ""
        self.epoch = -1
        self.assigned: frozenset[StreamPartition] = frozenset()
        self.changed = asyncio.Event()
        self._lock = asyncio.Lock()  # one heartbeat round at a time (the loop's and a commit's)
        self._last_answer = time.monotonic()  # when the coordinator last answered
        self._last_heartbeat = time.monotonic()  # when the last heartbeat that was answered was sent (or the join)
        self.lapsed = False  # no heartbeat answered for the consumer timeout: the partitions were given up
        self._reported: tuple[str, int] | None = None  # (coordinator, epoch) already reported
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    async def join(self) -> None:
        """Join the group, fetch the first assignments, and start heartbeating."""
        await self._join()
        async with self._lock:
            await self._round()
        self._task = asyncio.create_task(self._run(), name=f"group-heartbeat-{self.group_id}")
        self._watchdog = asyncio.create_task(self._watch(), name=f"group-watchdog-{self.group_id}")

    async def leave(self) -> None:
        """Stop heartbeating and leave the group (its partitions move to the others at once)."""
        for task in (self._task, self._watchdog):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._task = self._watchdog = None
        if self.epoch < 0:
            return
        self.epoch = -1
        self.assigned = frozenset()
        with contextlib.suppress(UnknownMemberError, UnknownGroupError):  # removed already (after a silence)
            await self._any_request(LeaveGroupRequest(self.group_id, self.consumer_id))

    async def confirm(self) -> None:
        """Heartbeat now, so :attr:`assigned` and :attr:`epoch` are the coordinator's at this moment (a commit's
        check that its partitions are still this member's)."""
        async with self._lock:
            await self._round(raise_errors=True)

    def context(self) -> GroupContext:
        """What this member's fetches and commits carry: the group, this consumer, and the epoch it holds now."""
        return GroupContext(self.group_id, self.consumer_id, max(self.epoch, 0))

    async def refresh(self, fenced: GroupContext) -> None:
        """A broker refused a request made with ``fenced``: heartbeat now to learn the group's epoch and this
        member's partitions, unless a heartbeat since did (many readers fenced at once heartbeat once)."""
        async with self._lock:
            if self.epoch != fenced.epoch:
                return
            with contextlib.suppress(TidelogError):
                await self._round(raise_errors=True)

    # -- the heartbeat -----------------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Give the partitions up once no heartbeat has been answered for the consumer timeout: the coordinator
        has removed this member by then (or is about to), and its partitions are another member's. Reading or
        committing them on would make this member a zombie. A later answer gives them back (or, after a removal,
        the member joins again)."""
        while True:
            left = self._last_heartbeat + self.consumer_timeout - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)
                continue
            if self.assigned:
                log.warning("group %s: consumer %s has had no heartbeat answered for %.1fs (its consumer timeout); "
                            "giving up its partitions", self.group_id, self.consumer_id,
                            time.monotonic() - self._last_heartbeat)  # fmt: skip
                self.lapsed = True
                self.assigned = frozenset()
                self.changed.set()
            await asyncio.sleep(min(self.interval, self.consumer_timeout / 3))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            async with self._lock:
                try:
                    await self._round()
                except Exception as exc:  # the loop must outlive any one round: log and heartbeat on
                    log.warning("group %s: heartbeat of %s failed (%s); trying again", self.group_id,
                                self.consumer_id, exc)  # fmt: skip

    async def _round(self, *, raise_errors: bool = False) -> None:
        """One heartbeat, following the group through new epochs, a moved coordinator or a removal; bounded."""
        failure: TidelogError | None = None
        for _ in range(HEARTBEAT_ATTEMPTS):
            try:
                await self._heartbeat()
                return
            except (StaleGroupEpochError, NotCoordinatorError) as exc:
                failure, follow = exc, self._follow
            except (UnknownMemberError, UnknownGroupError) as exc:
                failure, follow = exc, self._rejoin
            except UnavailableError as exc:  # no answer (a lost connection, a timeout): is the coordinator gone?
                failure, follow = exc, self._coordinator_silent
            try:
                await follow()
            except TidelogError as exc:  # the next heartbeat says what to do (a vanished group: join it again)
                failure = exc
                await asyncio.sleep(min(self.interval, 0.2))
        assert failure is not None
        if raise_errors:
            raise failure

    async def _follow(self) -> None:
        """A new epoch or a moved coordinator: look the group up."""
        epoch = self.epoch
        await self._describe()
        if self.epoch == epoch:  # the answering broker's view lags the coordinator's: a moment
            await asyncio.sleep(0.05)

    async def _rejoin(self) -> None:
        log.warning("group %s: consumer %s is no longer a member (removed after a silence?); joining again",
                    self.group_id, self.consumer_id)  # fmt: skip
        self._set(-1, frozenset())
        await self._join()

    async def _heartbeat(self) -> None:
        connection = await self._coordinator_connection()
        request = GroupAssignmentsRequest(self.group_id, self.consumer_id, max(self.epoch, 0))
        sent = time.monotonic()
        try:
            response = await connection.request(request, timeout=self.consumer_timeout / 3)
        except RequestTimeoutError as exc:
            raise UnavailableError(f"coordinator {self.coordinator} did not answer: {exc}") from None
        answer = response.header
        assert isinstance(answer, GroupAssignmentsResponse)
        self._last_answer = time.monotonic()
        self._last_heartbeat = sent  # the coordinator's deadline for this member starts after this moment
        self.lapsed = False
        assigned = frozenset(StreamPartition(a.stream, p) for a in answer.assignments for p in a.partitions)
        self._set(answer.epoch, assigned)

    def _set(self, epoch: int, assigned: frozenset[StreamPartition]) -> None:
        if epoch != self.epoch or assigned != self.assigned:
            self.epoch, self.assigned = epoch, assigned
            self.changed.set()

    async def _coordinator_silent(self) -> None:
        """The coordinator did not answer: look the group up; report the coordinator once it has been silent for
        the broker's coordinator timeout (and only once per coordinator and epoch)."""
        before = self.coordinator
        try:
            await self._describe()
        except UnknownGroupError:  # removed while silent, and the group went with it: a new member now
            await self._rejoin()
            return
        except TidelogError:
            pass
        if self.coordinator != before:
            return
        silent = time.monotonic() - self._last_answer
        if silent < self.coordinator_timeout or self._reported == (self.coordinator, self.epoch):
            await asyncio.sleep(min(self.interval, 0.2))
            return
        log.warning("group %s: coordinator %s has not answered for %.1fs; reporting it", self.group_id,
                    self.coordinator, silent)  # fmt: skip
        request = ReportCoordinatorRequest(self.group_id, self.consumer_id, self.coordinator, max(self.epoch, 0))
        with contextlib.suppress(TidelogError):
            await self._any_request(request)
            self._reported = (self.coordinator, self.epoch)

    # -- requests ----------------------------------------------------------------------------------------------

    async def _join(self) -> None:
        join = JoinGroupRequest(self.group_id, self.consumer_id, self.streams)
        try:
            answer = await self._any_request(join)
        except GroupRefusedError:
            if not await self._listed():
                raise
            log.warning("group %s: consumer %s is still a member (an earlier run that has not timed out?); "
                        "taking its place", self.group_id, self.consumer_id)  # fmt: skip
            with contextlib.suppress(UnknownMemberError, UnknownGroupError):
                await self._any_request(LeaveGroupRequest(self.group_id, self.consumer_id))
            answer = await self._any_request(join)
        assert isinstance(answer, JoinGroupResponse)
        self.consumer_timeout = answer.consumer_timeout_ms / 1000
        self.coordinator_timeout = answer.coordinator_timeout_ms / 1000
        if self._interval_ms is None:
            self.interval = self.consumer_timeout / 3
        elif self._interval_ms >= answer.consumer_timeout_ms:
            with contextlib.suppress(TidelogError):
                await self._any_request(LeaveGroupRequest(self.group_id, self.consumer_id))
            raise ValueError(
                f"heartbeat_interval_ms {self._interval_ms} must be below the brokers' group consumer timeout "
                f"({answer.consumer_timeout_ms} ms), or the member is removed between two heartbeats"
            )
        else:
            self.interval = self._interval_ms / 1000
        self.coordinator = answer.coordinator
        self.epoch = answer.epoch
        self._last_answer = self._last_heartbeat = time.monotonic()

    async def _describe(self) -> None:
        """Where the group stands (any broker's view): its coordinator and epoch."""
        answer = await self._any_request(DescribeGroupRequest(self.group_id))
        assert isinstance(answer, DescribeGroupResponse)
        if answer.coordinator != self.coordinator:
            self._last_answer = time.monotonic()  # a new coordinator gets a full timeout, as on the broker
        self.coordinator = answer.coordinator
        if answer.epoch > self.epoch:
            self.epoch = answer.epoch

    async def _listed(self) -> bool:
        """Whether this consumer id is a member of the group (as any broker's view has it)."""
        try:
            answer = await self._any_request(DescribeGroupRequest(self.group_id))
        except UnknownGroupError:
            return False
        assert isinstance(answer, DescribeGroupResponse)
        return any(member.consumer_id == self.consumer_id for member in answer.members)

    async def _any_request(
        self,
        request: JoinGroupRequest | LeaveGroupRequest | DescribeGroupRequest | ReportCoordinatorRequest,
    ) -> object:
        connection = await self._cluster.any_connection()
        response = await connection.request(request, timeout=self._cluster.request_timeout)
        return response.header

    async def _coordinator_connection(self) -> Connection:
        try:
            broker = self._cluster.broker(self.coordinator)
        except UnavailableError:
            await self._cluster.metadata()  # a broker this client has not seen yet
            broker = self._cluster.broker(self.coordinator)
        return await self._cluster.connection(broker.host, broker.port)
