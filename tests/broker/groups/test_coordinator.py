"""The coordinator's heartbeat deadlines on a manual clock: a quiet member is removed once its timeout has passed
(never before), a heartbeat moves its deadline, a new coordinator gives every member a full timeout, a failed
removal is tried again, and requests get Liftbridge's refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tidelog.broker.groups.coordinator import GroupCoordinator
from tidelog.clock import ManualClock
from tidelog.metadata.group_records import GroupMember, GroupRecord
from tidelog.protocol.errors import NotCoordinatorError, StaleGroupEpochError, UnavailableError, UnknownMemberError

TIMEOUT = 10.0


class Groups:
    """The part of :class:`~tidelog.metadata.group_mirror.GroupMirror` the coordinator uses, set by the test."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupRecord] = {}
        self._listeners: list[Callable[[GroupRecord | None, GroupRecord | None], Awaitable[None]]] = []

    def add_listener(self, listener: Callable[[GroupRecord | None, GroupRecord | None], Awaitable[None]]) -> None:
        self._listeners.append(listener)

    def get(self, group_id: str) -> GroupRecord | None:
        return self.groups.get(group_id)

    async def wait_for(self, predicate: Callable[[Any], bool], timeout: float | None = None) -> None:
        if not predicate(self):
            raise TimeoutError

    async def put(self, record: GroupRecord) -> None:
        old = self.groups.get(record.id)
        self.groups[record.id] = record
        for listener in self._listeners:
            await listener(old, record)


def record(coordinator: str, epoch: int, *members: str) -> GroupRecord:
    return GroupRecord(
        "g", coordinator, epoch, tuple(GroupMember(m, ("s",), (("s", (i,)),)) for i, m in enumerate(members))
    )


class Removals:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = False
        self.called = asyncio.Event()

    async def __call__(self, group_id: str, consumer_id: str) -> None:
        self.calls.append((group_id, consumer_id))
        self.called.set()
        if self.fail:
            raise UnavailableError("no controller right now")


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def started(
    clock: ManualClock, groups: Groups, removals: Removals
) -> tuple[GroupCoordinator, asyncio.Task[None]]:
    coordinator = GroupCoordinator("b1", groups, consumer_timeout=TIMEOUT, expire=removals, clock=clock)
    task = asyncio.create_task(coordinator.run())
    await turns()
    return coordinator, task


async def advance(clock: ManualClock, seconds: float) -> None:
    for _ in range(int(seconds * 10)):
        clock.advance(0.1)
        await turns()


async def test_a_quiet_member_is_removed_after_its_timeout_and_a_heartbeating_one_is_not(clock: ManualClock) -> None:
    groups, removals = Groups(), Removals()
    await groups.put(record("b1", 5, "quiet", "live"))
    coordinator, task = await started(clock, groups, removals)
    try:
        for _ in range(3):
            await advance(clock, TIMEOUT * 0.6)
            assert await coordinator.fetch_assignments("g", "live", 5) == (5, (("s", (1,)),))
            if removals.calls:
                break
        assert removals.calls == [("g", "quiet")]
        assert set(coordinator.deadlines("g")) == {"quiet", "live"}
        await groups.put(record("b1", 6, "live"))  # the controller removed it
        assert set(coordinator.deadlines("g")) == {"live"}
    finally:
        task.cancel()


async def test_nothing_is_removed_before_the_timeout(clock: ManualClock) -> None:
    groups, removals = Groups(), Removals()
    await groups.put(record("b1", 5, "a"))
    _, task = await started(clock, groups, removals)
    try:
        await advance(clock, TIMEOUT - 0.5)
        assert removals.calls == []
        await advance(clock, 1.5)
        assert removals.calls == [("g", "a")]
    finally:
        task.cancel()


async def test_a_failed_removal_is_tried_again(clock: ManualClock) -> None:
    groups, removals = Groups(), Removals()
    removals.fail = True
    await groups.put(record("b1", 5, "a"))
    _, task = await started(clock, groups, removals)
    try:
        await advance(clock, TIMEOUT + 1)
        await advance(clock, 2)
        assert len(removals.calls) >= 2 and set(removals.calls) == {("g", "a")}
    finally:
        task.cancel()


async def test_a_new_coordinator_gives_every_member_a_full_timeout(clock: ManualClock) -> None:
    groups, removals = Groups(), Removals()
    await groups.put(record("b0", 5, "a"))
    coordinator, task = await started(clock, groups, removals)
    try:
        assert coordinator.deadlines("g") == {}
        await advance(clock, TIMEOUT * 0.9)
        await groups.put(record("b1", 6, "a"))  # failed over to this broker
        await advance(clock, TIMEOUT * 0.9)
        assert removals.calls == []
        await groups.put(record("b2", 7, "a"))  # and away again: no more duties here
        await advance(clock, TIMEOUT * 2)
        assert removals.calls == [] and coordinator.deadlines("g") == {}
    finally:
        task.cancel()


async def test_refusals(clock: ManualClock) -> None:
    groups, removals = Groups(), Removals()
    coordinator, task = await started(clock, groups, removals)
    try:
        await groups.put(record("b0", 5, "a"))
        with pytest.raises(NotCoordinatorError, match="the coordinator is b0"):
            await coordinator.fetch_assignments("g", "a", 5)
        await groups.put(record("b1", 6, "a"))
        with pytest.raises(StaleGroupEpochError):
            await coordinator.fetch_assignments("g", "a", 5)
        with pytest.raises(UnknownMemberError):
            await coordinator.fetch_assignments("g", "b", 6)
    finally:
        task.cancel()
