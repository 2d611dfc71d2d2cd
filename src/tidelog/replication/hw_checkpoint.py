"""Reading and writing a replica's high-watermark checkpoint, one writer per file at a time.

A partition's ``hw-checkpoint`` is written by whichever role the replica has (the leader's timer, the
follower's, a role change, a shutdown), and a write runs in a worker thread that a cancelled caller does not
stop. :func:`~tidelog.storage.atomic.write_atomically` allows one writer per target, so writes of one file are
serialized here with a lock per file, held inside the thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE, HighWatermarkCheckpoint
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
    leader suspends appends on it (:mod:`tidelog.broker.safety`)."""
    try:
        hw = HighWatermarkCheckpoint(log_.directory / HW_CHECKPOINT_FILE).read(0)
    except Exception:  # a damaged checkpoint: fall back to the safe value, nothing beyond the log start
        log.warning("unreadable high-watermark checkpoint in %s; starting from the log start", log_.directory)
        hw = 0
    return max(log_.start_offset, hw)
