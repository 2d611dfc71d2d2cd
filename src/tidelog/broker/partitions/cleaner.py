"""The log cleaner: applies retention and key compaction to every replica this broker holds, periodically.

Leaders and followers clean their own copies independently (as Kafka's replicas do): each is bounded by the
high watermark *it* knows, which on a follower is never above the leader's.

Retention deletes whole sealed segments (by age, total bytes, message count); compaction keeps the newest record
per key in sealed segments. Both are bounded by the partition's high watermark, so nothing a consumer has not
been allowed to see yet is touched, and both work under the log's own lock, so appends and reads stay correct
while they run. One partition at a time, in the background: cleaning is never on a request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from tidelog.clock import Clock, SystemClock
from tidelog.storage.log import Log

log = logging.getLogger(__name__)


class Cleanable(Protocol):
    """What the cleaner needs of a replica (a led :class:`~tidelog.broker.partitions.partition.Partition` or a
    :class:`~tidelog.broker.partitions.followed.FollowedPartition`)."""

    @property
    def log(self) -> Log: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def name(self) -> str: ...


class LogCleaner:
    """Runs :meth:`clean_once` every ``interval`` seconds until stopped."""

    def __init__(
        self, partitions: Callable[[], Sequence[Cleanable]], interval: float, clock: Clock | None = None
    ) -> None:
        self._partitions = partitions
        self._interval = interval
        self._clock = clock or SystemClock()
        self._task: asyncio.Task[None] | None = None
        self._passes = 0
        self._passed = asyncio.Condition()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="log-cleaner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self._interval)
            await self.clean_once()
            async with self._passed:
                self._passes += 1
                self._passed.notify_all()

    async def wait_for_passes(self, count: int) -> None:
        """Wait until the background loop has completed ``count`` more passes (for tests and tools)."""
        async with self._passed:
            target = self._passes + count
            await self._passed.wait_for(lambda: self._passes >= target)

    async def clean_once(self) -> tuple[int, int]:
        """Clean every partition once; return (segments deleted by retention, segments rewritten by compaction)."""
        deleted = compacted = 0
        now_ns = self._clock.now_ns()
        for partition in self._partitions():
            if partition.log.closed:
                continue
            try:
                hw = partition.high_watermark
                removed = await partition.log.apply_retention(now_ns, max_offset=hw)
                deleted += len(removed)
                if removed:
                    log.info("retention removed %d segment(s) of %s", len(removed), partition.name)
                if partition.log.config.compact:
                    result = await partition.log.compact(hw, now_ns)
                    if result is not None and result.segments_rewritten:
                        compacted += result.segments_rewritten
                        log.info(
                            "compacted %d segment(s) of %s: %d records removed, %d -> %d bytes",
                            result.segments_rewritten,
                            partition.name,
                            result.records_removed,
                            result.bytes_before,
                            result.bytes_after,
                        )
            except Exception:  # one partition's failure must not stop cleaning the others
                log.exception("cleaning %s failed", partition.name)
        return deleted, compacted
