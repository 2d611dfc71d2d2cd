"""Reading and writing a replica's high-watermark checkpoint, one writer per file at a time.

A partition's ``hw-checkpoint`` is written by whichever role the replica has (the leader's timer, the
follower's, a role change, a shutdown), and a write runs in a worker thread that a cancelled caller does not
stop. :func:`~tidelog.storage.atomic.write_atomically` allows one writer per target, so writes of one file are
serialized here with a lock per file, held inside the thread.

The checkpoint is derived state: a damaged one (empty, torn, garbage, another version) is never fatal. Reading
falls back to the log start, logged as a WARNING, the choice Kafka makes for a missing checkpoint: nothing is
exposed as committed that was not, a leader's HW rises again as its followers fetch (reads above it wait until
then), a follower's as its leader reports it. It is not a safety evidence either way: a fallback below the true
HW can only hide a loss that :mod:`tidelog.broker.partitions.safety` would otherwise have found.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE, HighWatermarkCheckpoint
from tidelog.storage.errors import CheckpointError
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

_locks: dict[Path, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(path: Path) -> threading.Lock:
    with _locks_guard:
        lock = _locks.get(path)
        if lock is None:
            lock = _locks[path] = threading.Lock()
        return lock


def _write(path: Path, hw: int) -> None:
    with _lock_for(path):
        HighWatermarkCheckpoint(path).write(hw)


async def write_hw_checkpoint(directory: Path, hw: int) -> None:
    """Persist ``hw`` for the replica in ``directory`` (fsynced before this returns)."""
    await asyncio.to_thread(_write, directory / HW_CHECKPOINT_FILE, hw)


def read_hw_checkpoint(log_: Log) -> int:
    """The high watermark this replica last checkpointed, clamped to its log (the log start when none)."""
    return min(checkpointed_hw(log_), log_.end_offset)


def checkpointed_hw(log_: Log) -> int:
    """The high watermark this replica last checkpointed, *not* clamped to its log end (the log start when none,
    unreadable, or below it). Above the log end, it is evidence that the log lost committed records: a new
    leader suspends appends on it (:mod:`tidelog.broker.partitions.safety`)."""
    try:
        hw = HighWatermarkCheckpoint(log_.directory / HW_CHECKPOINT_FILE).read(0)
    except (CheckpointError, OSError) as exc:  # damaged or unreadable: fall back to the safe value, the log start
        # The reader raises nothing else for any bytes (the fuzz target ``checkpoints``): another error is a bug.
        log.warning(
            "unreadable %s (%s); starting from the log start %d: a leader's HW moves up as its followers fetch, a "
            "follower's as its leader tells it (Kafka does the same)",
            log_.directory / HW_CHECKPOINT_FILE,
            exc,
            log_.start_offset,
        )
        hw = 0
    return max(log_.start_offset, hw)
