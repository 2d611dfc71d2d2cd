"""What every part of a :class:`~tidelog.storage.log.Log` shares: its segments, its lock, its flusher, its epochs.

The log is one class (:mod:`tidelog.storage.log`) assembled from one base and four parts, each in its own
module: this state, sealing and roll (:mod:`~tidelog.storage.log_sealing`), appends
(:mod:`~tidelog.storage.log_append`), reads (:mod:`~tidelog.storage.log_read`) and maintenance
(:mod:`~tidelog.storage.log_maintenance`). They are mixins over one object rather than objects of their own
because they share every field and the append path runs per batch: a call through a second object would cost
each append for nothing.

Ordering. One ``asyncio.Lock`` serializes everything that changes the log. An append takes its offsets and
writes them with no ``await`` in between, so appends are ordered, never interleaved and never half-done, and
an append cancelled while it waits for the lock writes nothing. When the lock is free and nobody is queued
for it, an append does not take it at all: nothing can run between its check and its write, and taking an
``asyncio.Lock`` is measurable on a replicated write's path. Everything else takes the lock through
:meth:`LogState._holding_lock`, which counts who is queued, so an append never jumps ahead of a truncation or a
close waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from tidelog.clock import Clock
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.damage import DamageRegistry
from tidelog.storage.encryption import Keyring
from tidelog.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE, LeaderEpochCache
from tidelog.storage.errors import LogClosedError
from tidelog.storage.flush import Flusher, FlushMode, FlushShares
from tidelog.storage.preallocation import AppendRate
from tidelog.storage.recovery import RecoveryReport, batch_epochs
from tidelog.storage.segment import Segment
from tidelog.storage.segment_state import SegmentInfo
from tidelog.storage.write_observer import WriteObserver


class LogState:
    """The fields of one partition's log and the checks and locking every operation on it uses."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        segments: list[Segment],
        report: RecoveryReport,
        flush_mode: FlushMode = FlushMode.ADAPTIVE,
        flush_shares: FlushShares | None = None,
    ) -> None:
        self._directory = directory
        self._config = config
        self._clock = clock
        self._segments = segments  # offset order; the last one is active
        self._recovery = report
        self._lock = asyncio.Lock()
        self._lock_queued = 0  # waiting in _holding_lock: a free lock is then not free for an append's fast path
        self._flusher = Flusher(
            config.flush_policy, config.flush_interval_ms, clock, mode=flush_mode, shares=flush_shares
        )
        self._flusher.directory = directory  # its blocking work keeps this log's descriptors open (open_files)
        self._flusher.position = lambda: self._segments[-1].next_offset  # what a round covers (durable_end)
        self._flusher.durable_end = segments[-1].next_offset  # what recovery read back counts as stored
        self._preallocate = config.flush_policy is FlushPolicy.ALWAYS and config.preallocate_bytes > 0
        self._append_rate = AppendRate()
        self._recovery_point = report.recovery_point
        self._sealing: asyncio.Task[None] | None = None  # the latest background seal; each awaits the one before
        self._expedite = asyncio.Event()  # set: pending seals stop waiting for their due time
        self._seal_delay_ns = seal_delay_ms(config) * 1_000_000
        self._closed = False
        # Leader epoch -> start offset (KIP-101/279). An entry may outlive the bytes it names when a crash came
        # between writing the checkpoint and the batch, so what lies at or past the log end is dropped here.
        epochs_file = directory / LEADER_EPOCH_CHECKPOINT_FILE  # derived: rebuilt from the batches if damaged
        self._epochs = LeaderEpochCache.load_or_rebuild(epochs_file, lambda: batch_epochs(segments))
        self._epochs.truncate_from_end(self.end_offset)
        self._epochs.truncate_from_start(self.start_offset)  # a crash between deleting a prefix and this
        self._observers: list[WriteObserver] = []  # told of each write (tidelog.storage.write_observer)
        # The partition's data keys when its stream is encrypted and the broker has the master key (set by the
        # broker as metadata says; tidelog.storage.encryption). Compaction and reads inside a batch use it.
        self.keyring: Keyring | None = None
        self._early_observers: list[WriteObserver] = []  # those of them told before a write that cannot run short
        self._late_observers: list[WriteObserver] = []  # the others
        self._damage = DamageRegistry.load(directory)
        self._damage.forget_below(self.start_offset)
        self._damage.forget_from(self.end_offset)

    # ------------------------------------------------------------------------------------------ positions

    @property
    def start_offset(self) -> int:
        """The first offset the log may hold (the base offset of its oldest segment)."""
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The offset the next appended record gets (log end offset)."""
        return self._segments[-1].next_offset

    @property
    def latest_epoch(self) -> int:
        """The leader epoch of the newest batch (-1 while no epoch was ever recorded)."""
        return self._epochs.latest_epoch

    @property
    def segments(self) -> list[SegmentInfo]:
        last = len(self._segments) - 1
        return [s.info(active=i == last) for i, s in enumerate(self._segments)]

    # ------------------------------------------------------------------------------------------ checks and the lock

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self._directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        self._flusher.check()

    @contextlib.asynccontextmanager
    async def _holding_lock(self) -> AsyncIterator[None]:
        """Hold the log's lock, counted as queued while waiting for it (see the append's fast path)."""
        self._lock_queued += 1
        try:
            await self._lock.acquire()
        finally:
            self._lock_queued -= 1
        try:
            yield
        finally:
            self._lock.release()


NEVER_SEAL_DELAY_MS = 30_000


def seal_delay_ms(config: LogConfig) -> int:
    """How long after a roll the sealed segment is fsynced.

    Under ``ALWAYS`` every byte was fsynced when appended: at once. Under ``INTERVAL`` the flush ticker
    covers the sealed segment within one interval: after that, so the seal's fsync finds nothing left to
    write. Under ``NEVER`` an immediate fsync of a whole segment competes with the appends still streaming
    in; after 30 s the kernel's own write-back (``dirty_expire_centisecs``, 30 s by default) has usually done
    the work. The recovery point lags by that much, which only makes a crash recovery scan a few more segments.
    """
    if config.flush_policy is FlushPolicy.ALWAYS:
        return 0
    if config.flush_policy is FlushPolicy.INTERVAL:
        return config.flush_interval_ms
    return NEVER_SEAL_DELAY_MS
