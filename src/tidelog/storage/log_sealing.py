"""Sealing: rolling the active segment, making sealed segments durable, and running exclusive operations.

A roll is synchronous: a new active segment is created and the old one is sealed, but its fsync (data, then
index files) is left to a background task, after which the recovery point (:mod:`tidelog.storage.recovery`)
moves past it. Seals run one after another, so the recovery point only ever moves over segments that are all
durable. When a seal runs depends on the flush policy (:func:`~tidelog.storage.log_state.seal_delay_ms`);
anything that deletes or rewrites segments first settles the pending seals (:meth:`SealingLog._settle`), which
is why the exclusive runner of truncation, retention, compaction and install lives here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tidelog.storage import disk_full as full
from tidelog.storage.log_state import LogState
from tidelog.storage.segment import Segment

T = TypeVar("T")


class SealingLog(LogState):
    """Roll and seal; settle pending seals; run an operation exclusively."""

    async def roll(self) -> None:
        """Seal the active segment and start a new one (a no-op when the active segment is empty)."""
        async with self._holding_lock():
            self._check_writable()
            self._roll_now()

    def _roll_now(self, base_offset: int | None = None) -> None:
        """Seal the active segment and create the next one, without waiting for any disk work.

        The sealed segment is made durable (data, then index files) by a background task, after which the
        recovery point moves past it (when depends on the flush policy:
        :func:`~tidelog.storage.log_state.seal_delay_ms`). The new file's directory entry is fsynced by the next
        flush round, before any append into it is acknowledged under ``ALWAYS``.
        """
        old = self._segments[-1]
        if base_offset is None:
            if not old.size:
                return
            base_offset = old.next_offset
        # Created first: a full disk refuses the roll with nothing changed.
        new = full.create_segment(self._directory, base_offset, self._config.index_interval_bytes)
        if old.trim():  # its zero-filled room: the next round fsyncs the cut, before the new segment's acks
            self._flusher.note_write(old)
        old.seal_prepare()
        self._segments.append(new)
        self._flusher.note_directory(self._directory)
        due = self._clock.monotonic_ns() + self._seal_delay_ns
        self._sealing = asyncio.get_running_loop().create_task(self._seal(old, base_offset, due, self._sealing))

    async def _seal(
        self, segment: Segment, following_base: int, due_ns: int, previous: asyncio.Task[None] | None
    ) -> None:
        """Background: make a sealed segment durable, then advance the recovery point past it.

        Seals run one after another (each awaits the previous), so the recovery point only ever moves over
        segments that are all durable. The fsync waits until ``due_ns`` (on the log's clock) unless something
        needs it sooner (:meth:`_settle`): see ``_seal_delay_ns``. A failed fsync poisons the flusher: the log
        then refuses appends. A full disk does not (:mod:`tidelog.storage.disk_full`), and a roll that a refused
        write undid is not sealed.
        """
        if previous is not None:
            await asyncio.wait([previous])
        wait_ns = due_ns - self._clock.monotonic_ns()
        if wait_ns > 0 and not self._expedite.is_set():
            timer = asyncio.ensure_future(self._clock.sleep(wait_ns / 1e9))
            expedite = asyncio.ensure_future(self._expedite.wait())
            await asyncio.wait([timer, expedite], return_when=asyncio.FIRST_COMPLETED)
            timer.cancel()
            expedite.cancel()
        if self._flusher.failed is not None or not full.still_rolled(self._segments, segment, following_base):
            return
        segment.pin()
        try:
            await self._flusher.run_blocking(full.seal_files, segment)
            if (
                following_base > self._recovery_point
                and not segment.closed
                and await self._flusher.run_blocking(full.advance_recovery_point, segment, following_base)
            ):
                self._recovery_point = following_base
        except Exception as exc:
            self._flusher.poison(exc)
        finally:
            segment.unpin()

    async def _settle(self) -> None:
        """Finish background seals now (call with the lock held, before deleting or rewriting segments)."""
        if self._sealing is not None:
            self._expedite.set()
            await asyncio.wait([self._sealing])
            self._sealing = None
            self._expedite.clear()

    async def _exclusive(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` under the lock in a shielded task (it completes even if the caller is cancelled)."""

        async def locked() -> T:
            async with self._holding_lock():
                self._check_open()
                await self._settle()
                return await operation()

        return await asyncio.shield(locked())

    def _age_expired(self, now_ns: int) -> bool:
        active = self._segments[-1]
        first = active.first_append_ns
        return bool(active.size) and first is not None and now_ns - first >= self._config.segment_max_age_ns
