"""The partition log: one directory of segments behind one interface (append, read, truncate, roll, retain).

:class:`Log` is the facade the rest of tidelog imports; it opens a log (running recovery) and closes it. Its
operations live in one module per concern, each a part of the same object:

- :mod:`~tidelog.storage.log_state`: the shared fields, the lock and its ordering rules;
- :mod:`~tidelog.storage.log_append`: validation, placement and the writes of appends, the write observers;
- :mod:`~tidelog.storage.log_sealing`: roll, background seals, exclusive operations;
- :mod:`~tidelog.storage.log_read`: reads, which never take the lock;
- :mod:`~tidelog.storage.log_maintenance`: truncation, retention, compaction, repair, reset, install.

How the log's fsyncs run (:class:`~tidelog.storage.flush.FlushMode`) is chosen when it is opened.
Waiting for the fsync happens after the lock is released, which is what lets other appends join the same
group commit. Layout and recovery: :mod:`tidelog.storage.segment`, :mod:`tidelog.storage.recovery`.
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path
from types import TracebackType

from tidelog.clock import Clock, SystemClock
from tidelog.storage import disk_full as full
from tidelog.storage.config import LogConfig
from tidelog.storage.damage import DamageRegistry
from tidelog.storage.epoch_cache import EpochEndOffset
from tidelog.storage.flush import Flusher, FlushMode, FlushShares
from tidelog.storage.log_append import AppendingLog
from tidelog.storage.log_maintenance import MaintainedLog
from tidelog.storage.log_read import ReadingLog
from tidelog.storage.open_files import OPEN_FILES
from tidelog.storage.recovery import RecoveryReport, recover
from tidelog.storage.segment_install import discard_staging


class Log(AppendingLog, MaintainedLog, ReadingLog):
    """One partition's commit log. Construct with :meth:`open` (or :meth:`open_async`)."""

    # ------------------------------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock: Clock | None = None,
        truncate_damaged: bool = False,
        flush_mode: FlushMode = FlushMode.ADAPTIVE,
        flush_shares: FlushShares | None = None,
    ) -> Log:
        """Open (or create) the log in directory ``path``, running recovery. Blocking: may read and fsync.
        Damage in the middle raises :class:`~tidelog.storage.recovery_damage.DamagedLogError` unless
        ``truncate_damaged``. ``flush_mode``: where its fsyncs run (:class:`~tidelog.storage.flush.FlushMode`);
        ``flush_shares``: the logs it coordinates inline fsyncs with (:class:`~tidelog.storage.flush.FlushShares`;
        none but itself when not given)."""
        directory = Path(path)
        config = LogConfig() if config is None else config
        with OPEN_FILES.busy(directory):  # recovery holds descriptors: none is released under it (open_files)
            discard_staging(directory)  # segment files a far-horizon catch-up was copying: never part of the log
            segments, report = recover(directory, config.index_interval_bytes, truncate_damaged=truncate_damaged)
        clock = SystemClock() if clock is None else clock
        return cls(directory, config, clock, segments, report, flush_mode, flush_shares)

    @classmethod
    async def open_async(
        cls,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock: Clock | None = None,
        truncate_damaged: bool = False,
        flush_mode: FlushMode = FlushMode.ADAPTIVE,
        flush_shares: FlushShares | None = None,
    ) -> Log:
        """:meth:`open` in a worker thread, keeping recovery's disk work off the event loop."""
        opener = functools.partial(
            cls.open,
            path,
            config,
            clock=clock,
            truncate_damaged=truncate_damaged,
            flush_mode=flush_mode,
            flush_shares=flush_shares,
        )
        try:
            return await asyncio.get_running_loop().run_in_executor(None, opener)
        finally:
            OPEN_FILES.trim()  # what recovery kept open past the bound (open_files)

    async def __aenter__(self) -> Log:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------------ state

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def recovery(self) -> RecoveryReport:
        """What recovery found when the log was opened."""
        return self._recovery

    @property
    def damage(self) -> DamageRegistry:
        """Offsets found damaged on disk (:mod:`tidelog.storage.damage`)."""
        return self._damage

    @property
    def flusher(self) -> Flusher:
        """The flush coordinator (read: ``fsync_rounds``, ``durable``, ``failed``, ``mode``)."""
        return self._flusher

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def durable_end(self) -> int:
        """The offset below which every byte of this log is known to be on stable storage: the log end at the
        last fsync round that succeeded, lowered by truncations (read back from the files at open). What a replica
        whose disk failed keeps when its log is opened again (:mod:`tidelog.broker.partitions.failed_logs`):
        after a failed fsync the page cache may still show bytes the disk never got."""
        return self._flusher.durable_end

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def epoch_entries(self) -> tuple[tuple[int, int], ...]:
        """(leader epoch, start offset) of every leadership this log holds batches of, oldest first."""
        return tuple((entry.epoch, entry.start_offset) for entry in self._epochs.entries)

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """KIP-279: the largest epoch ≤ ``epoch`` this log knows and the offset where it ends (a follower
        truncates to it before fetching from a new leader)."""
        return self._epochs.end_offset_for_epoch(epoch, self.end_offset)

    def set_flush_mode(self, mode: FlushMode) -> None:
        """Change where this log's fsyncs run (:class:`~tidelog.storage.flush.FlushMode`).

        Chosen at :meth:`open` for the log's whole life, except that a partition's log outlives its roles: it
        stays open when the broker stops leading the partition (or starts), and a replicated leader's rounds
        must run on the worker while a follower's or a sole replica's may run inline. The partition runtime
        therefore sets the mode when its role over the log begins and ends, through this one method.
        """
        self._flusher.set_mode(mode)

    def reconfigure(self, config: LogConfig) -> None:
        """Take new roll, retention and compaction settings at run time (``tidelog stream alter``): the next
        append, roll and cleaner pass follow them. Settings fixed when the log opened (the flush policy and
        interval, the index interval) must not change: ``ValueError``."""
        fixed = ("flush_policy", "flush_interval_ms", "index_interval_bytes")
        changed = [name for name in fixed if getattr(config, name) != getattr(self._config, name)]
        if changed:
            raise ValueError(f"{', '.join(changed)} cannot change while the log is open")
        self._config = config

    # ------------------------------------------------------------------------------------------ flushing

    async def flush(self) -> None:
        """fsync everything appended so far, whatever the flush policy."""
        self._check_writable()
        await self._flusher.flush()

    async def close(self) -> None:
        """Flush, write indexes out, record a clean shutdown, and close every file. Idempotent."""
        if self._closed:
            return

        async def locked() -> None:
            async with self._holding_lock():
                if self._closed:
                    return
                self._closed = True
                try:
                    await self._settle()
                    await self._flusher.close()
                    await self._flusher.run_blocking(self._finish_close)
                finally:
                    for segment in self._segments:
                        segment.close()

        await asyncio.shield(locked())

    def _finish_close(self) -> None:
        """Blocking: persist every index, then the clean-shutdown marker (only after all else is durable; on a
        full disk neither, and the next open recovers: :func:`~tidelog.storage.disk_full.close_files`)."""
        last = self._segments[-1]
        if last.trim():
            last.sync()
        full.close_files(self._segments, self._directory)

    def __repr__(self) -> str:
        return f"Log({self._directory}, offsets {self.start_offset}..{self.end_offset}, {len(self._segments)} segments)"
