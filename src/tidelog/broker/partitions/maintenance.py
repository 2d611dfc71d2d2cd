"""One timer for the periodic work of every partition a broker leads.

A led partition has work to do on a clock: shrink the ISR of followers that stopped keeping up and checkpoint its
high watermark (replicated partitions), expire idle producers and snapshot the producer state (every partition).
Each :class:`~tidelog.broker.partitions.partition.Partition` used to run that in a task of its own, waking once
a second: a broker leading 1,000 idle partitions woke 1,000 times a second to find nothing to do.

:class:`LeaderMaintenance` is one task for all of them. It sleeps for the shortest period any of its partitions
asks for, then visits each in turn with :meth:`~tidelog.broker.partitions.partition.Partition.maintain`, which
returns at once for a partition with nothing due (one replica, no producers, nothing appended since its last
producer snapshot). With no partition to look after the task ends, so a broker that leads nothing has no timer
here at all. One partition's failure is logged and never stops the others.

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

    async def maintain(self) -> None:
        """Do whatever periodic work is due (returning at once when none is)."""


class LeaderMaintenance:
    """Visits every registered partition once per period, from one task (started with the first, ended with the
    last)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._members: dict[Maintained, None] = {}  # insertion-ordered set
        self._task: asyncio.Task[None] | None = None
        self._visiting: Maintained | None = None
        self._visited: asyncio.Event | None = None  # set when the visit under way ends
        self.passes = 0
        """Completed passes over the partitions (for tests)."""

    def __len__(self) -> int:
        return len(self._members)

    @property
    def running(self) -> bool:
        """Whether the scheduler's task exists (it does exactly while a partition is registered)."""
        return self._task is not None and not self._task.done()

    def add(self, partition: Maintained) -> None:
        self._members[partition] = None
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="leader-maintenance")

    async def remove(self, partition: Maintained) -> None:
        """Stop visiting ``partition``; return once a visit of it under way has ended."""
        self._members.pop(partition, None)
        while self._visiting is partition and self._visited is not None:
            await self._visited.wait()
        if not self._members and self._task is not None:
            task, self._task = self._task, None
            if task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _period(self) -> float:
        return min((m.maintenance_period for m in self._members), default=1.0)

    async def _run(self) -> None:
        while self._members:
            await self._clock.sleep(self._period())
            for partition in list(self._members):
                if partition not in self._members:
                    continue  # removed during this pass
                self._visiting, self._visited = partition, asyncio.Event()
                try:
                    await partition.maintain()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: periodic maintenance failed; tried again at the next pass", partition.name)
                finally:
                    self._visiting = None
                    self._visited.set()
            self.passes += 1
