"""One segment of a partition log: a ``{base_offset:020d}.log`` file of whole batches and its two indexes.

A segment is append-only while it is the log's *active* (last) segment and immutable once *sealed* (a roll
made a newer one), except for truncation and compaction, which the log performs under its lock.

Ownership and invariants:

- ``size`` is the *committed* size: bytes ``[0, size)`` are whole batches that were written completely.
  Readers never look past it, so a batch being written is never half-visible.
- ``next_offset`` is one past the last offset of the last batch (the base offset for an empty segment).
- The file descriptor is used with ``os.pread``/``os.pwrite`` at explicit positions: no shared file position,
  one syscall per write. An idle segment's descriptor may be released to keep the process within its bound
  on open segment files, and reopened by path when next used (:mod:`tidelog.storage.open_files`). Closing
  (or releasing) is deferred while a flush thread has the descriptor pinned (:meth:`pin`), so an fsync in
  flight can never hit a closed or reused descriptor.
- ``_verified`` records byte ranges whose CRCs this process has checked (appended bytes were validated
  before they were written; recovery and reads verify the rest). :meth:`verify_range` is what lets
  ``sendfile`` serve a range without copying it through Python each time.
- The active segment's file may run on past ``size`` in zeros written ahead of time (``preallocation``, see
  :mod:`tidelog.storage.preallocation`); :meth:`trim` cuts them before the segment is sealed or closed.

A segment is one object in three modules: what it knows of its file and how that is rebuilt or loaded
(:mod:`tidelog.storage.segment_state`), its reads (:mod:`tidelog.storage.segment_read`), and here the file's
lifecycle, appends and truncation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tidelog.storage.file_writes import Buffer, FileSlice, write_at
from tidelog.storage.open_files import OPEN_FILES
from tidelog.storage.segment_read import SegmentReads
from tidelog.storage.segment_state import LOG_SUFFIX, Placed, segment_name


class Segment(SegmentReads):
    """A log segment file plus its offset and time indexes."""

    __slots__ = ()

    # ------------------------------------------------------------------------------------------ lifecycle

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> Segment:
        """Create an empty segment file (failing if one exists); stale index files of that name are removed."""
        path = directory / (segment_name(base_offset) + LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        segment = cls(directory, base_offset, fd, 0, index_interval_bytes)
        segment.offset_index.delete()
        segment.time_index.delete()
        return segment

    @classmethod
    def open(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> Segment:
        """Open an existing file. Its state is unknown until :meth:`load_indexes` or :meth:`rebuild`."""
        path = directory / (segment_name(base_offset) + LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR)
        return cls(directory, base_offset, fd, os.fstat(fd).st_size, index_interval_bytes)

    def pin(self) -> None:
        """Keep the descriptor open until :meth:`unpin` (a flush thread is using it)."""
        self._pins += 1

    def unpin(self) -> None:
        self._pins -= 1
        if self._pins == 0 and self._close_pending:
            self._close_now()

    def close(self) -> None:
        if self._shut or self._close_pending:
            return
        self.preallocation.stop(self.size)  # a fill still running writes nothing more
        if self._pins:
            self._close_pending = True
        else:
            self._close_now()

    def _close_now(self) -> None:
        OPEN_FILES.closed(self)
        fd, self._fd = self._fd, -1
        self._close_pending = False
        self._shut = True
        if fd >= 0:
            os.close(fd)

    def delete(self) -> None:
        """Close and remove the log file, then its indexes (an orphan index is cleaned up at open)."""
        self.close()
        self.path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()

    def sync(self) -> None:
        """fdatasync the log file (blocking: call from a worker thread, with the segment pinned). A released
        descriptor has nothing unsynced (:meth:`releasable`): there is nothing to do then."""
        writes = self._writes  # read first: the fdatasync covers every append made before it
        fd = self._fd
        if fd >= 0:
            os.fdatasync(fd)
            if writes > self._synced_writes:
                self._synced_writes = writes

    def trim(self) -> bool:
        """Cut the file's zero-filled room after the last batch (:mod:`~tidelog.storage.preallocation`), before a
        seal or a clean close; True if the file changed (the caller makes that durable)."""
        had_room = self.preallocation.allocated > self.size or self.preallocation.running
        if had_room:
            self.cut_file(self.size)
        return had_room

    def cut_file(self, position: int) -> None:
        """Make the file end at ``position``, stopping any zero fill first (the state is the caller's to fix)."""
        self.preallocation.stop(position)
        os.ftruncate(self.fd, position)
        self._writes += 1  # a cut too must be fsynced through this segment before its descriptor is released

    def seal_prepare(self) -> None:
        """Record the final running maximum in the time index; the segment takes no more appends."""
        if self.size:
            self.time_index.maybe_append(self.max_timestamp, self.max_ts_offset)
        self.sealed = True

    def persist_indexes(self) -> None:
        """Write index entries out and fsync them (blocking). Rebuilt indexes replace their files atomically."""
        if self._index_stale:
            self.offset_index.write_atomic()
            self.time_index.write_atomic()
            self._index_stale = False
        else:
            self.offset_index.write_pending(fsync=True)
            self.time_index.write_pending(fsync=True)

    def forget_index_files(self) -> None:
        """Delete the index files (blocking); the in-memory indexes stay and are written whole next time.

        Used before compaction rewrites the log file, so a crash in between can never pair the new file
        with positions that belong to the old one.
        """
        self._index_stale = True
        self.offset_index.delete()
        self.time_index.delete()

    # ------------------------------------------------------------------------------------------ appending

    def append(self, parts: Sequence[Buffer | FileSlice], batches: Sequence[Placed], now_ns: int) -> None:
        """Write whole batches at the end: ``parts`` are their bytes (final offsets), ``batches`` describe them.

        One ``pwritev`` for the run (the parts are typically each batch's rewritten 16-byte head and the rest
        of the client's buffer, so the payload is never copied in Python); index entries only where
        ``index_interval_bytes`` have passed since the last one. ``size`` moves only after the write.
        """
        position = self.size
        end = position + (batches[0].size if len(batches) == 1 else sum(b.size for b in batches))
        reserve = self.preallocation
        if reserve.write_beyond(end):  # a zero fill may be writing there: take turns with it
            with reserve.lock:
                write_at(self.fd, parts, position)
                reserve.wrote(end)
        else:
            write_at(self.fd, parts, position)
            reserve.wrote(end)
        self._writes += 1
        if not self.size and self.first_append_ns is None:
            self.first_append_ns = now_ns
        position = self._index(batches, position)
        self._verified.add(self.size, position)
        self.size = position
        self.next_offset = batches[-1].next_offset

    # ------------------------------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> bool:
        """Drop every batch whose last offset is ≥ ``offset`` (a batch containing ``offset`` goes whole).

        Returns whether anything was dropped. ``next_offset`` becomes one past the last batch kept (the base
        offset if none is), exactly what a reopen would compute. The caller makes the change durable.
        """
        found = self.find(offset)
        if found is None:
            return False
        position, header = found
        self.truncate_at(position, header.base_offset)
        return True

    def truncate_at(self, position: int, first_dropped: int) -> None:
        """Cut the file at ``position``, the start of the batch at offset ``first_dropped``; fix up the rest."""
        self.cut_file(position)
        self.size = position
        self.offset_index.truncate_to(first_dropped)
        self.time_index.truncate_to(first_dropped)
        self._verified.truncate(position)
        last_offset, last_position = self.offset_index.last()
        self._refresh_from(last_position, last_offset)
        if not position:
            self.next_offset = self.base_offset
            self.first_append_ns = None
