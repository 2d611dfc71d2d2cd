"""A bound on the segment files a process holds open: the least recently used idle ones are closed, and reopened
on demand.

Every segment (:mod:`tidelog.storage.segment`) used to hold its ``.log`` file open from the log's open to its
close, so a broker held one descriptor per segment of every partition, idle or not (Liftbridge users hit "too
many open files" after a few hundred streams). Now every open segment file is registered here, in least recently
used order; once more than :attr:`OpenFiles.limit` are open, the oldest that may be closed is closed, and its
segment opens its file again (by path) the next time it is read or written. A hot partition's active segment
stays open because it is used; an idle partition ends up holding none.

What may be closed (:meth:`~tidelog.storage.segment_state.SegmentState.releasable`), so that closing never
loses or hides anything:

- nothing of the file is unsynced: every append to it (and every cut) was followed by an ``fdatasync`` through
  the segment
  (closing a descriptor keeps the page cache, but a write-back error could then go unreported to the
  fsync that acknowledges the data); under flush policy ``never`` a segment written since its log's last flush
  therefore keeps its descriptor until that flush;
- it is not *pinned*: no worker thread is syncing it or zero-filling ahead of its end
  (:mod:`tidelog.storage.preallocation`), and no compaction or install is replacing its file under its name;
- no blocking work on its log is under way in a worker thread (:meth:`OpenFiles.busy`, by the log's directory:
  recovery, loading the producer state, index writes, a close): such work may hold a segment's descriptor
  number, and a descriptor closed under it could be reused by another file. Other logs' segments are closed
  meanwhile as usual.

Closing happens only on the thread that runs the event loop (a worker thread's reopen only registers), so a
descriptor the loop just read from the segment is never closed between that read and its use.

The bound is per process (a broker is one process). Descriptors beyond it: segments that may not be closed
yet (above), the short-lived duplicates a read hands to ``sendfile`` (one per read in flight), and files that
are not segments (index files are opened only while they are written; sockets, etcd, NATS). See
``docs/operations.md`` for the whole count.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

DEFAULT_LIMIT = 512
"""Segment files held open at most (``max_open_segment_files``)."""


class Releasable(Protocol):
    """A segment, as far as the cache is concerned."""

    @property
    def directory(self) -> Path:
        """Its log's directory (what :meth:`OpenFiles.busy` names)."""

    def releasable(self) -> bool:
        """Whether its descriptor may be closed now (it reopens by path when next used)."""

    def release(self) -> None:
        """Close the descriptor (only called when :meth:`releasable`, under the cache's lock)."""


class OpenFiles:
    """The open segment files of a process, least recently used first."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._open: OrderedDict[Releasable, None] = OrderedDict()
        self._lock = threading.Lock()
        self._busy: dict[Path, int] = {}  # log directories with blocking work under way -> how many jobs
        self.released = 0
        """Descriptors closed to stay within the limit (for tests and metrics)."""

    @property
    def limit(self) -> int:
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Take a new bound (the broker's ``max_open_segment_files``); closes the excess now when it can."""
        if limit < 1:
            raise ValueError(f"max_open_segment_files must be at least 1, got {limit}")
        self._limit = limit
        self.trim()

    def __len__(self) -> int:
        return len(self._open)

    # -- from segments --------------------------------------------------------------------------------------

    def opened(self, segment: Releasable) -> None:
        """``segment`` has just opened its file: register it as the most recently used, and close the oldest
        idle ones beyond the limit (on the loop's thread)."""
        with self._lock:
            self._open[segment] = None
        if len(self._open) > self._limit:
            self._trim(keep=segment)

    def used(self, segment: Releasable) -> None:
        """``segment``'s descriptor is being used: it becomes the most recently used."""
        with self._lock:
            if segment in self._open:
                self._open.move_to_end(segment)

    def closed(self, segment: Releasable) -> None:
        """``segment`` closed its file (for good, or released): forget it."""
        with self._lock:
            self._open.pop(segment, None)

    # -- blocking work ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def busy(self, directory: Path) -> Iterator[None]:
        """Around blocking work on the log in ``directory``, in a worker thread: none of its segments' descriptors
        is closed until it ends (the thread's caller then calls :meth:`trim` on the loop)."""
        with self._lock:
            self._busy[directory] = self._busy.get(directory, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy.pop(directory) - 1
                if left:
                    self._busy[directory] = left

    # -- closing ----------------------------------------------------------------------------------------------

    def trim(self) -> None:
        """Close the least recently used releasable descriptors beyond the limit (only on the loop's thread, and
        not while blocking work is under way)."""
        self._trim(None)

    def _trim(self, keep: Releasable | None) -> None:
        """:meth:`trim`, never closing ``keep`` (a segment that just opened its file for a caller)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread: closing is the loop thread's alone
            return
        with self._lock:
            excess = len(self._open) - self._limit
            if excess <= 0:
                return
            busy = self._busy
            victims = []
            for segment in self._open:  # least recently used first
                if segment is not keep and segment.releasable() and (not busy or segment.directory not in busy):
                    victims.append(segment)
                    if len(victims) == excess:
                        break
            for segment in victims:
                del self._open[segment]
                segment.release()
            self.released += len(victims)


OPEN_FILES = OpenFiles()
"""The process's one cache: every segment registers here."""
