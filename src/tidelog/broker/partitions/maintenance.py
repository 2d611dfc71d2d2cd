"""One timer for the periodic work of every partition a broker leads.

A led partition has work to do on a clock: shrink the ISR of followers that stopped keeping up and checkpoint its
high watermark (replicated partitions), expire idle producers and snapshot the producer state (every partition).
Each :class:`~tidelog.broker.partitions.partition.Partition` used to run that in a task of its own, waking once
a second: a broker leading 1,000 idle partitions woke 1,000 times a second to find nothing to do.

:class:`LeaderMaintenance` is one task for all of them. It sleeps for the shortest period its partitions ask for,
then visits each partition that has work with
:meth:`~tidelog.broker.partitions.partition.Partition.maintain`. A partition with nothing left to do (one
replica, no producers, its producer state snapshotted at the log end) answers False and is not visited again
until it is woken (:meth:`LeaderMaintenance.wake`: a write, a new metadata record), so an idle partition costs
nothing per second. With no partition to visit the task ends, so a broker whose partitions are all idle has no
timer here at all. One partition's failure is logged and never stops the others.

A partition leaving (:meth:`LeaderMaintenance.remove`) waits for a visit of it that is under way, so its close
never races its own periodic checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from tidelog.clock import Clock

log = logging.getLogger(__name__)


class Maintained(Protocol):
    """What the scheduler needs of a partition."""

    @property
    def name(self) -> str: ...

    @property
    def maintenance_period(self) -> float:
        """Seconds between two visits this partition asks for."""

    async def maintain(self) -> bool:
        """Do whatever periodic work is due; False when none can be due until the partition is woken."""


class LeaderMaintenance:
    """Visits every registered partition that has periodic work once per period, from one task (started when a
    partition has work, ended when none has)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._members: set[Maintained] = set()
        self._active: dict[Maintained, None] = {}  # members with work: visited each pass (insertion-ordered set)
        self._task: asyncio.Task[None] | None = None
        self._visiting: Maintained | None = None
        self._visited: asyncio.Event | None = None  # set when the visit under way ends
        self.passes = 0
        """Completed passes over the partitions (for tests)."""

    def __len__(self) -> int:
        return len(self._members)

    @property
    def active(self) -> int:
        """Partitions visited at each pass (the others have nothing to do until woken)."""
        return len(self._active)

    @property
    def running(self) -> bool:
        """Whether the scheduler's task exists (it does exactly while a partition has periodic work)."""
        return self._task is not None and not self._task.done()

    def add(self, partition: Maintained) -> None:
        self._members.add(partition)
        self.wake(partition)

    def wake(self, partition: Maintained) -> None:
        """Visit ``partition`` again from the next pass on (it wrote, or its record changed). Cheap: called on
        every write."""
        if partition in self._active or partition not in self._members:
            return
        self._active[partition] = None
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="leader-maintenance")

    async def remove(self, partition: Maintained) -> None:
        """Stop visiting ``partition``; return once a visit of it under way has ended."""
        self._members.discard(partition)
        self._active.pop(partition, None)
        while self._visiting is partition and self._visited is not None:
            await self._visited.wait()
        if not self._active and self._task is not None:
            task, self._task = self._task, None
            if task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run(self) -> None:
        period = min((m.maintenance_period for m in self._active), default=1.0)
        while self._active:
            await self._clock.sleep(period)
            period = 1.0
            for partition in list(self._active):
                if partition not in self._active:
                    continue  # removed during this pass
                self._visiting, self._visited = partition, asyncio.Event()
                again = True
                try:
                    again = await partition.maintain()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: periodic maintenance failed; tried again at the next pass", partition.name)
                finally:
                    self._visiting = None
                    self._visited.set()
                if again:
                    period = min(period, partition.maintenance_period)
                else:
                    self._active.pop(partition, None)
            self.passes += 1
        if self._task is asyncio.current_task():
            self._task = None
