"""Zero-filled room after the active segment's end, so that an fsynced append overwrites instead of growing.

Why. Under ``FlushPolicy.ALWAYS`` every acknowledged append waits for an ``fdatasync``. When the append grew the
file, that fdatasync must also commit the new file size (and the newly allocated blocks) through the
filesystem's journal; on ext4 that is a jbd2 commit, and the journal is shared by every file on the disk, so the
three replicas of a partition on one machine queue behind each other's commits. Overwriting blocks that are
already allocated, written and durable changes no metadata that fdatasync must persist (it skips timestamps),
so it only writes the data. Measured here (ext4 on a virtual disk, 1 KiB appends, each then fdatasynced,
medians): 238 µs growing the file against 169 µs overwriting zeros written earlier; three processes at once,
305 µs against 225 µs. ``posix_fallocate`` is not enough: it leaves *unwritten* extents, whose conversion on
the first write is again a journalled metadata change (209 µs alone). In a 3-broker cluster with acks ALL
(``benchmarks.replication``) a write's latency fell by about 100 µs at the median, since a follower's
fdatasync is on every acknowledgement's path.

How. When a write leaves less than a quarter of the room ahead of the segment's end, a worker thread
writes zeros from the end of what is allocated, in pieces of :data:`PIECE_BYTES`, and then fdatasyncs them
(zeros written but not yet synced would only make the next append's fdatasync carry them). The thread and the
event loop never write the same bytes:

- a piece is written under :attr:`Preallocation.lock`, starting at ``allocated``;
- an append ending beyond ``allocated`` while a fill runs is written under the same lock and raises
  ``allocated`` to its end, so no later piece can start below it (an append inside ``allocated`` needs no lock:
  pieces only ever go above it);
- truncating, trimming or closing the segment stops the fill under the lock: no piece is written after.

What it changes on disk. The active segment's file may end in zeros after its last batch. A segment is trimmed
to its batches before it is sealed (on a roll the trim is fsynced by the next flush round, before any append to
the new segment is acknowledged; an install fsyncs it at once), and at a clean close. After a crash, recovery
recognises a zero tail on the last segment as preallocation and trims it without reporting a cut. Readers never
look past a segment's ``size``.

How much. The room grows with the segment: as many bytes as the segment holds (at least one piece), up to
``preallocate_bytes``. A partition that took one small write holds 64 KiB of zeros, not the whole reserve:
with the reserve at once, 2,000 partitions with replication factor 3 on one machine wrote 18 GB of zeros after
one 100-byte message each, and filled its disk (docs/performance.md, "Many partitions").

When. Only under ``ALWAYS`` (with the other policies nobody waits for an fsync per append), and only while
the log is appended to at most :data:`MAX_FILL_RATE` (:class:`AppendRate`). The gain is per fsync and the cost
per byte: every byte of room is written twice, once as zeros. A writer that waits for each fsync appends a few
MB/s at most and gains ~100 µs per append; a streaming writer shares each fsync among many appends (group
commit), so it gains little, and paid for the zeros with a quarter of its throughput (``benchmarks.replication``
produce_1k, 3 brokers on 2 cores: 90k msg/s instead of 110–120k).
"""

from __future__ import annotations

import os
import threading

MAX_FILL_RATE = 8 * 1024 * 1024
"""Bytes per second appended to a log above which no zero fill starts (a streaming writer, see above)."""
RATE_WINDOW_NS = 50_000_000
"""The append rate is measured over windows of this length; no fill starts before the first one ends."""
PIECE_BYTES = 64 * 1024
"""Zeros written per locked step: the longest an append beyond the allocated end waits for the lock
(tens of µs)."""
_ZEROS = bytes(PIECE_BYTES)


class Preallocation:
    """The zero-filled room of one segment file, and the fill that extends it (at most one at a time)."""

    __slots__ = ("_stopped", "allocated", "lock", "running")

    def __init__(self, allocated: int) -> None:
        self.allocated = allocated
        """Bytes of the file that are written (batches or zeros): appends below this overwrite."""
        self.lock = threading.Lock()
        self.running = False
        """A fill is scheduled or running (set on the loop, cleared by the fill's thread when it is done)."""
        self._stopped = False

    def wanted(self, size: int, reserve: int, limit: int) -> int:
        """The end a fill should reach now (0: none is needed): once fewer than a quarter of the room are left as
        zeros after ``size``, the room past it, never beyond ``limit`` (the segment's largest size). The room
        grows with the segment: as many bytes as it holds, at least one piece, at most ``reserve``."""
        room = min(reserve, max(PIECE_BYTES, size))
        if self.running or reserve <= 0 or self.allocated - size >= room // 4:
            return 0
        target = min(size + room, limit)
        return target if target > self.allocated else 0  # allocated is never below size

    def start(self) -> None:
        """Mark a fill as scheduled (on the loop, before handing :meth:`fill` to a thread)."""
        self.running = True
        self._stopped = False

    def fill(self, fd: int, target: int) -> None:
        """Blocking (a worker thread): write zeros up to ``target`` piece by piece, then fdatasync them.

        Stops early, between pieces, once :meth:`stop` was called. An ``OSError`` (a full disk, say) ends the
        fill: appends then grow the file as they would without one.
        """
        try:
            while True:
                with self.lock:
                    start = self.allocated
                    if self._stopped or start >= target:
                        break
                    length = min(PIECE_BYTES, target - start)
                    written = os.pwrite(fd, _ZEROS[:length] if length < PIECE_BYTES else _ZEROS, start)
                    self.allocated = start + written
            os.fdatasync(fd)
        except OSError:
            pass
        finally:
            self.running = False

    def write_beyond(self, end: int) -> bool:
        """Whether an append ending at ``end`` must be written under :attr:`lock` (a fill may write there)."""
        return self.running and end > self.allocated

    def wrote(self, end: int) -> None:
        """An append ended at ``end`` (call under :attr:`lock` when :meth:`write_beyond` said so)."""
        if end > self.allocated:
            self.allocated = end

    def stop(self, size: int) -> None:
        """The file now ends at ``size`` (truncated or trimmed): no piece is written from here on."""
        with self.lock:
            self._stopped = True
            self.allocated = size


class AppendRate:
    """Whether a log is being streamed into: bytes appended per window of :data:`RATE_WINDOW_NS`, compared with
    :data:`MAX_FILL_RATE` at the end of each window (one addition and one clock read per append)."""

    __slots__ = ("_bytes", "_started_ns", "streaming")

    def __init__(self) -> None:
        self._bytes = 0
        self._started_ns: int | None = None
        self.streaming = True
        """The last complete window was above the limit, or none has ended yet: no fill starts. (Assumed at
        first: a fill at the start of a burst would cost the burst, while a writer waiting for each fsync
        loses only the gain of its first 50 ms.)"""

    def add(self, nbytes: int, now_ns: int) -> None:
        if self._started_ns is None:
            self._started_ns = now_ns
        self._bytes += nbytes
        elapsed = now_ns - self._started_ns
        if elapsed >= RATE_WINDOW_NS:
            self.streaming = self._bytes * 1_000_000_000 > MAX_FILL_RATE * elapsed
            self._bytes = 0
            self._started_ns = now_ns
