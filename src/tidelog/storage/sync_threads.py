"""The worker threads that run fsync rounds and other blocking log work, shared by every log of the process.

Started as needed, at most :data:`SYNC_THREADS`, each taking jobs from one queue. A forked child starts with none
of them, so the pool is made again there.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

__all__ = ["SYNC_THREADS", "submit_sync_job"]

log = logging.getLogger(__name__)

SYNC_THREADS = 8
"""Threads at most: rounds of different logs run side by side, up to this many at once."""


class _SyncThreads:
    """The threads that run worker rounds, shared by every log of the process: started as needed, at most
    ``limit``, each taking jobs from one queue. Daemon threads: a log flushes at close, so none is ever left
    holding an unacknowledged round that matters when the process exits."""

    def __init__(self, limit: int) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._limit = limit
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job that no submitted job has claimed yet

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)
        with self._lock:
            if self._idle:
                self._idle -= 1
                return
            if self._threads >= self._limit:
                return  # all busy: the job waits in the queue for the first one free
            self._threads += 1
            name = f"tidelog-fsync-{self._threads}"
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            try:
                job()
            except Exception:  # a round reports its own failures: this would be a bug, not a failed fsync
                log.exception("fsync worker job failed")
            with self._lock:
                self._idle += 1


_THREADS = _SyncThreads(SYNC_THREADS)


def submit_sync_job(job: Callable[[], None]) -> None:
    """Run ``job`` on one of the process's sync threads (it reports its own outcome)."""
    _THREADS.submit(job)


def _reset_after_fork() -> None:  # a forked child has none of the parent's threads
    global _THREADS
    _THREADS = _SyncThreads(SYNC_THREADS)


os.register_at_fork(after_in_child=_reset_after_fork)
