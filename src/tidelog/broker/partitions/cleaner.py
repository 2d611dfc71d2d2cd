"""The log cleaner: applies retention and key compaction to every replica this broker holds, periodically.

Leaders and followers clean their own copies independently (as Kafka's replicas do): each is bounded by the
high watermark *it* knows, which on a follower is never above the leader's.

Retention deletes whole sealed segments (by age, total bytes, message count); compaction keeps the newest record
per key in sealed segments. Both are bounded by the partition's high watermark, so nothing a consumer has not
been allowed to see yet is touched, and both work under the log's own lock, so appends and reads stay correct
while they run. One partition at a time, in the background: cleaning is never on a request's path.

A stream may set its own interval (Liftbridge's ``cleanerInterval``, in the log's ``cleaner_interval_ms``): the
cleaner then wakes at the shortest interval any log asks for and cleans each log whose own interval has passed
since it last cleaned it; the others wait for the broker's interval as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from tidelog.clock import Clock, SystemClock
from tidelog.storage.errors import KeyUnavailableError
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
        self,
        partitions: Callable[[], Sequence[Cleanable]],
        interval: float,
        clock: Clock | None = None,
        *,
        retention_cap: Callable[[Cleanable], int | None] | None = None,
    ) -> None:
        """``retention_cap``: for a replica, the offset retention may delete up to (None: its high watermark);
        a tiered partition's is the end of what is offloaded (:meth:`tidelog.broker.tiering.Tiering.retention_cap`)."""
        self._partitions = partitions
        self._retention_cap = retention_cap
        self._interval = interval
        self._clock = clock or SystemClock()
        self._task: asyncio.Task[None] | None = None
        self._passes = 0
        self._passed = asyncio.Condition()
        self._last_ns: dict[int, int] = {}  # id(log) -> monotonic ns of its last cleaning

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="log-cleaner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _tick(self) -> float:
        """Seconds until the next pass: the broker's interval, or the shortest a log of its own asks for."""
        own = [p.log.config.cleaner_interval_ms for p in self._partitions()]
        shortest = min((ms for ms in own if ms is not None), default=None)
        return self._interval if shortest is None else min(self._interval, shortest / 1000)

    def _due(self, partition: Cleanable, now: int, slack: int) -> bool:
        """Whether a background pass cleans ``partition`` now: its own interval (or the broker's) has passed,
        within ``slack`` ns (a sleep may end a little early: that must not cost a whole extra tick)."""
        own = partition.log.config.cleaner_interval_ms
        interval_ns = int(self._interval * 1e9) if own is None else own * 1_000_000
        last = self._last_ns.get(id(partition.log))
        return last is None or now - last + slack >= interval_ns

    async def _run(self) -> None:
        while True:
            tick = self._tick()
            await self._clock.sleep(tick)
            now = self._clock.monotonic_ns()
            due = [p for p in self._partitions() if self._due(p, now, int(tick * 1e9) // 2)]
            alive = {id(p.log) for p in self._partitions()}
            self._last_ns = {k: v for k, v in self._last_ns.items() if k in alive}
            for partition in due:
                self._last_ns[id(partition.log)] = now
            await self.clean_once(due)
            async with self._passed:
                self._passes += 1
                self._passed.notify_all()

    async def wait_for_passes(self, count: int) -> None:
        """Wait until the background loop has completed ``count`` more passes (for tests and tools)."""
        async with self._passed:
            target = self._passes + count
            await self._passed.wait_for(lambda: self._passes >= target)

    async def clean_once(self, partitions: Sequence[Cleanable] | None = None) -> tuple[int, int]:
        """Clean ``partitions`` (default: every one) once; return (segments deleted by retention, segments
        rewritten by compaction)."""
        deleted = compacted = 0
        now_ns = self._clock.now_ns()
        for partition in self._partitions() if partitions is None else partitions:
            if partition.log.closed:
                continue
            try:
                hw = partition.high_watermark
                cap = None if self._retention_cap is None else self._retention_cap(partition)
                removed = await partition.log.apply_retention(now_ns, max_offset=hw if cap is None else min(hw, cap))
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
            except KeyUnavailableError as exc:  # an encrypted partition this broker has no key for: left as it is
                log.warning("not compacting %s: %s", partition.name, exc)
            except Exception:  # one partition's failure must not stop cleaning the others
                log.exception("cleaning %s failed", partition.name)
        return deleted, compacted
