"""When the auto-pause sweep runs (:class:`Pauses`): only when a deadline can be due, so a broker with
auto-pause off does no work per partition per second."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import msgspec

from tests.broker.helpers import until
from tidelog.broker.pausing import Pauses
from tidelog.clock import ManualClock
from tidelog.metadata.records import PartitionRecord, StreamRecord


class _Manager:
    """What the sweep reads of the partition manager: the partitions led here (none) and the lead listener."""

    def __init__(self) -> None:
        self.looked = 0
        self.listeners: list[Callable[[], None]] = []

    def partitions(self) -> list[Any]:
        self.looked += 1
        return []

    def add_lead_listener(self, listener: Callable[[], None]) -> None:
        self.listeners.append(listener)


async def test_with_auto_pause_off_the_sweep_waits_until_a_partition_is_led() -> None:
    clock, manager = ManualClock(), _Manager()
    nothing = cast(Any, None)
    pauses = Pauses(cast(Any, manager), nothing, nothing, auto_pause_ms=0, clock=clock)
    pauses.start()
    try:
        await until(lambda: clock.sleepers == 1, "the first sweep's timer")
        clock.advance(1.0)
        await until(lambda: manager.looked > 0, "the first sweep")
        looked = manager.looked
        for _ in range(10):  # nothing can be due: no sweep however long it waits
            clock.advance(1.0)
            for _ in range(5):
                await asyncio.sleep(0)  # turns of the loop, no time: a due sweep would run here
        assert manager.looked == looked, "the sweep ran every second with auto-pause off"

        for listener in manager.listeners:  # this broker starts leading a partition
            listener()
        await until(lambda: manager.looked > looked, "a sweep after the wake-up")
    finally:
        await pauses.stop()


class _Led:
    """A partition led here, idle since the start of time (as the sweep reads it)."""

    def __init__(self, name: str, record: PartitionRecord) -> None:
        self.stream = StreamRecord(name, name, "", 1, 1, 0)
        self.record = record
        self.latest_received_ns = 0
        self.led_since_ns = 0


def test_a_partition_being_reassigned_is_never_auto_paused() -> None:
    """Paused, it runs in neither role and its new replicas could never catch up (a decommission waited for
    ever on the auto-paused ``__cursors`` partition in the nemesis)."""
    steady = PartitionRecord("s", 0, ("a",), "a", ("a",))
    moving = msgspec.structs.replace(steady, replicas=("a", "b"), reassign_from=("a",), reassign_to=("b",))
    manager = _Manager()
    manager.partitions = lambda: [_Led("s", steady), _Led("m", moving)]  # type: ignore[method-assign]
    clock = ManualClock()
    clock.advance(3600.0)
    nothing = cast(Any, None)
    pauses = Pauses(cast(Any, manager), nothing, nothing, auto_pause_ms=1000, clock=clock)
    assert [p.stream.name for p in pauses.idle()] == ["s"]
