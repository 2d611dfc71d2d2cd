"""One segment of a partition log: a ``{base_offset:020d}.log`` file of whole batches and its two indexes.

A segment is append-only while it is the log's *active* (last) segment and immutable once *sealed* (a roll
made a newer one), except for truncation and compaction, which the log performs under its lock.

Ownership and invariants:

- ``size`` is the *committed* size: bytes ``[0, size)`` are whole batches that were written completely.
  Readers never look past it, so a batch being written is never half-visible.
- ``next_offset`` is one past the last offset of the last batch (the base offset for an empty segment).
- The file descriptor is opened once and used with ``os.pread``/``os.pwrite`` at explicit positions: no
  shared file position, one syscall per write. Closing is deferred while a flush thread has the
  descriptor pinned (:meth:`pin`), so an fsync in flight can never hit a closed or reused descriptor.
- ``_verified`` records byte ranges whose CRCs this process has checked (appended bytes were validated
  before they were written; recovery and reads verify the rest). :meth:`verify_range` is what lets
  ``sendfile`` serve a range without copying it through Python each time.
- The active segment's file may run on past ``size`` in zeros written ahead of time (``preallocation``, see
  :mod:`tidelog.storage.preallocation`); :meth:`trim` cuts them before the segment is sealed or closed.

Reads find the batch containing an offset in two steps: the sparse offset index gives the nearest indexed
batch at or before it, then batch *headers* (not records) are read forward from there.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tidelog.protocol.records import HEADER_SIZE, BatchHeader, crc_ok
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.batch_scan import read_header, scan_batches
from tidelog.storage.byte_ranges import ByteRanges
from tidelog.storage.errors import CorruptSegmentError
from tidelog.storage.file_writes import Buffer, FileSlice, write_at
from tidelog.storage.index import DamagedIndexError, OffsetIndex, TimeIndex
from tidelog.storage.preallocation import Preallocation

NO_TIMESTAMP = -(2**63)
MAX_RELATIVE_OFFSET = 2**32 - 1
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Placed(NamedTuple):
    """A batch as written to a segment: its final offsets, size and largest timestamp."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A snapshot of one segment, for listings and retention decisions."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int | None
    """Largest record timestamp (ns) in the segment; None when it holds no batch."""
    path: Path
    active: bool


class Planned(NamedTuple):
    """A run of whole batches ``[position, end)`` covering offsets ``[first_offset, next_offset)``."""

    position: int
    end: int
    first_offset: int
    next_offset: int


class ScanResult(NamedTuple):
    """How far a scan of a segment's batches got: ``end`` is just past the last good batch."""

    end: int
    batches: int
    error: CorruptBatchError | None


class Segment:
    """A log segment file plus its offset and time indexes."""

    __slots__ = (
        "_bytes_since_index",
        "_close_pending",
        "_fd",
        "_index_stale",
        "_pins",
        "_verified",
        "base_offset",
        "corrupt_from",
        "directory",
        "first_append_ns",
        "index_interval_bytes",
        "max_timestamp",
        "max_ts_offset",
        "next_offset",
        "offset_index",
        "preallocation",
        "sealed",
        "size",
        "time_index",
    )

    def __init__(self, directory: Path, base_offset: int, fd: int, size: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self._fd = fd
        self.size = size
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.max_ts_offset = base_offset
        self.first_append_ns: int | None = None
        name = segment_name(base_offset)
        self.offset_index = OffsetIndex(directory / (name + INDEX_SUFFIX), base_offset)
        self.time_index = TimeIndex(directory / (name + TIMEINDEX_SUFFIX), base_offset)
        self._bytes_since_index = 0
        self._index_stale = False  # in-memory indexes must replace the files whole (not just be appended)
        self._verified = ByteRanges()
        self._pins = 0
        self._close_pending = False
        self.sealed = False
        self.corrupt_from: int | None = None  # where the header chain of a sealed segment breaks, if it does
        self.preallocation = Preallocation(size)

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def path(self) -> Path:
        return self.directory / (segment_name(self.base_offset) + LOG_SUFFIX)

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"{self.path.name} is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0 or self._close_pending

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
        if self._fd < 0:
            return
        self.preallocation.stop(self.size)  # a fill still running writes nothing more
        if self._pins:
            self._close_pending = True
        else:
            self._close_now()

    def _close_now(self) -> None:
        fd, self._fd = self._fd, -1
        self._close_pending = False
        os.close(fd)

    def delete(self) -> None:
        """Close and remove the log file, then its indexes (an orphan index is cleaned up at open)."""
        self.close()
        self.path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()

    def sync(self) -> None:
        """fdatasync the log file (blocking: call from a worker thread, with the segment pinned)."""
        if self._fd >= 0:
            os.fdatasync(self._fd)

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
        if not self.size and self.first_append_ns is None:
            self.first_append_ns = now_ns
        position = self._index(batches, position)
        self._verified.add(self.size, position)
        self.size = position
        self.next_offset = batches[-1].next_offset

    # ------------------------------------------------------------------------------------------ reading

    def header_at(self, position: int) -> BatchHeader:
        raw = os.pread(self.fd, HEADER_SIZE, position)
        return read_header(raw, 0, position, self.size)

    def find(self, offset: int, *, _retry: bool = True) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is ≥ ``offset``; None if no such batch.

        Raises :class:`CorruptSegmentError` when a header on the way cannot be decoded. An index entry that
        names the wrong batch means the index is damaged: it is rebuilt in memory and the lookup retried.
        """
        indexed_offset, position = self.offset_index.lookup(offset)
        expected = indexed_offset
        size = self.size
        first = True
        while position < size:
            try:
                header = self.header_at(position)
            except CorruptBatchError as exc:
                raise self.corruption(position, expected, str(exc)) from None
            if first and position and header.base_offset != indexed_offset and _retry:
                self.rebuild(verify=False, keep_tail=True, end=size)
                return self.find(offset, _retry=False)
            first = False
            if header.last_offset >= offset:
                return position, header
            expected = header.next_offset
            position += header.size
        return None

    def plan(self, position: int, max_bytes: int, max_offset: int, *, _retry: bool = True) -> Planned | None:
        """The whole batches to serve from ``position``: at least one, then as many as fit in ``max_bytes``.

        Only batches whose last offset is below ``max_offset`` qualify; None when the first does not. The
        offset index lets the plan jump over most of a large read: an entry's position is a batch boundary
        and every batch before it ends below the entry's offset. No header at or past ``max_offset`` is read
        (a damaged batch there bounds the read: :mod:`tidelog.storage.damage`).
        """
        try:
            first = self.header_at(position)
        except CorruptBatchError as exc:
            raise self.corruption(position, self._offset_near(position), str(exc)) from None
        if first.last_offset >= max_offset:
            return None
        end = position + first.size
        next_offset = first.next_offset
        limit = position + max_bytes
        index = self.offset_index
        k = min(
            bisect_right(index.values, limit),
            bisect_left(index.keys, max_offset - self.base_offset),
        )
        jumped = bool(k) and index.values[k - 1] > end
        if jumped:
            end = index.values[k - 1]
            next_offset = self.base_offset + index.keys[k - 1]
        size = self.size
        while end < size and (jumped or next_offset < max_offset):
            try:
                header = self.header_at(end)
            except CorruptBatchError as exc:
                raise self.corruption(end, next_offset, str(exc)) from None
            if jumped:
                jumped = False
                if header.base_offset != next_offset and _retry:  # the entry names another batch: damaged
                    self.rebuild(verify=False, keep_tail=True, end=size)
                    return self.plan(position, max_bytes, max_offset, _retry=False)
            if header.last_offset >= max_offset or end + header.size > limit:
                break
            end += header.size
            next_offset = header.next_offset
        return Planned(position, end, first.base_offset, next_offset)

    def read(self, plan: Planned) -> bytes:
        """The bytes of a plan, every batch's CRC checked (and remembered as verified)."""
        data = os.pread(self.fd, plan.end - plan.position, plan.position)
        self._check(data, plan.position, plan.first_offset)
        self._verified.add(plan.position, plan.end)
        return data

    def verify_range(self, plan: Planned) -> None:
        """Make sure every byte of ``plan`` has passed its CRC in this process, reading only what has not."""
        for start, end in self._verified.missing(plan.position, plan.end):
            data = os.pread(self.fd, end - start, start)
            self._check(data, start, self._offset_near(start))
            self._verified.add(start, end)

    def _check(self, data: bytes, position: int, expected: int) -> None:
        """Raise CorruptSegmentError unless ``data`` (from ``position``) is whole batches with good CRCs."""
        off = 0
        total = len(data)
        while off < total:
            try:
                header = read_header(data, off, position + off, position + total)
                if not crc_ok(data, off, header):
                    raise CorruptBatchError("CRC mismatch", position=position + off)
            except CorruptBatchError as exc:
                raise self.corruption(position + off, expected, str(exc)) from None
            expected = header.next_offset
            off += header.size

    def batch_for_timestamp(self, timestamp: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose max timestamp is ≥ ``timestamp``, found from the time index."""
        if self.max_timestamp < timestamp:
            return None
        start = self.time_index.lookup(timestamp)
        found = self.find(start)
        if found is None:
            return None
        position = found[0]
        while position < self.size:
            try:
                header = self.header_at(position)
            except CorruptBatchError as exc:
                raise self.corruption(position, self._offset_near(position), str(exc)) from None
            if header.max_timestamp >= timestamp:
                return position, header
            position += header.size
        return None

    # ------------------------------------------------------------------------------------------ recovery

    def scan(self, start: int = 0, end: int | None = None, *, verify: bool) -> Iterator[tuple[int, BatchHeader]]:
        """Yield ``(position, header)`` for the batches in ``[start, end)`` (default: to the file's end).

        Reads in large chunks. With ``verify`` every CRC is checked. Raises :class:`CorruptBatchError` (with
        the file position) at the first batch that is torn or fails.
        """
        fd = self.fd
        yield from scan_batches(fd, start, os.fstat(fd).st_size if end is None else end, verify=verify)

    def rebuild(self, *, verify: bool, keep_tail: bool, end: int | None = None) -> ScanResult:
        """Rebuild both indexes and the segment's state from its batches (up to ``end``, default the file's).

        Stops at the first bad batch (torn, failing its CRC with ``verify``, or going back in offsets). With
        ``keep_tail`` the bytes from there on stay part of the segment and ``corrupt_from`` marks them, so
        reads that reach them raise ``CorruptSegmentError`` (a sealed segment: damage is reported, never
        silently dropped); without it ``size`` ends at the last good batch and the caller truncates the
        file (the last segment after a crash). The rebuilt indexes replace their files at the next
        :meth:`persist_indexes`.
        """
        limit = os.fstat(self.fd).st_size if end is None else end
        self.offset_index = OffsetIndex(self.offset_index.path, self.base_offset)
        self.time_index = TimeIndex(self.time_index.path, self.base_offset)
        self._index_stale = True
        self._bytes_since_index = 0
        self.max_timestamp = NO_TIMESTAMP
        self.max_ts_offset = self.base_offset
        self.next_offset = self.base_offset
        self.size = 0
        self._verified = ByteRanges()
        self.first_append_ns = None
        placed: list[Placed] = []
        end = 0
        error: CorruptBatchError | None = None
        try:
            for position, header in self.scan(0, limit, verify=verify):
                if header.base_offset < self.next_offset or header.last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
                    raise CorruptBatchError(f"batch offset {header.base_offset} out of order", position=position)
                if not placed:
                    self.first_append_ns = header.max_timestamp
                placed.append(Placed(header.base_offset, header.next_offset, header.size, header.max_timestamp))
                self.next_offset = header.next_offset
                end = position + header.size
        except CorruptBatchError as exc:
            error = exc
        self._index(placed, 0)  # the state was reset above: as if the batches had just been appended
        self.size = end
        if verify:
            self._verified.add(0, end)
        self.corrupt_from = None if error is None else end
        if error is not None and keep_tail:
            self.size = limit
        return ScanResult(end, len(placed), error)

    def _index(self, batches: Sequence[Placed], position: int) -> int:
        """Add index entries and the running max timestamp for ``batches``, written from ``position`` on; the
        position just past them is returned. Entries go only where ``index_interval_bytes`` have passed."""
        interval = self.index_interval_bytes
        since = self._bytes_since_index
        max_ts = self.max_timestamp
        for batch in batches:
            if since >= interval:
                self.offset_index.append(batch.base_offset, position)
                self.time_index.maybe_append(max_ts, self.max_ts_offset)
                since = 0
            if batch.max_timestamp > max_ts:
                max_ts = batch.max_timestamp
                self.max_ts_offset = batch.base_offset
            since += batch.size
            position += batch.size
        self._bytes_since_index = since
        self.max_timestamp = max_ts
        return position

    def load_indexes(self) -> None:
        """Trust the index files after sanity checks, and derive the segment's state from them.

        Raises :class:`DamagedIndexError` if either index fails its checks or its last entry does not name
        the batch found at its position. The state comes from the last entries plus a short scan of the
        headers after the last indexed batch (at most about one index interval).
        """
        offset_index = OffsetIndex.load(self.offset_index.path, self.base_offset, self.size)
        time_index = TimeIndex.load(self.time_index.path, self.base_offset)
        last_offset, last_position = offset_index.last()
        if len(offset_index):
            try:
                header = self.header_at(last_position)
            except CorruptBatchError as exc:
                raise DamagedIndexError(f"{offset_index.path.name}: last entry: {exc}") from None
            if header.base_offset != last_offset:
                raise DamagedIndexError(
                    f"{offset_index.path.name}: last entry names {last_offset}, found a batch at {header.base_offset}"
                )
        self.offset_index, self.time_index = offset_index, time_index
        self._refresh_from(last_position, last_offset)
        if time_index.values and self.base_offset + time_index.values[-1] >= max(
            self.next_offset, self.base_offset + 1
        ):
            raise DamagedIndexError(f"{time_index.path.name}: names an offset past the segment's end")

    def _refresh_from(self, position: int, expected: int) -> None:
        """Recompute ``next_offset`` and the running max timestamp from the last time entry plus a header scan."""
        last_ts = self.time_index.last_timestamp()
        max_ts = NO_TIMESTAMP if last_ts is None else last_ts
        max_off = self.base_offset if last_ts is None else self.base_offset + self.time_index.values[-1]
        next_offset = expected
        first_ts: int | None = None
        start = position
        self.corrupt_from = None
        while position < self.size:
            try:
                header = self.header_at(position)
            except CorruptBatchError:
                self.corrupt_from = position
                break
            if position == 0:
                first_ts = header.max_timestamp
            if header.max_timestamp > max_ts:
                max_ts, max_off = header.max_timestamp, header.base_offset
            next_offset = header.next_offset
            position += header.size
        self.next_offset = next_offset
        self.max_timestamp, self.max_ts_offset = max_ts, max_off
        self._bytes_since_index = self.size - start
        if self.size and self.first_append_ns is None:
            self.first_append_ns = first_ts if first_ts is not None else self._first_timestamp()

    def _first_timestamp(self) -> int | None:
        try:
            return self.header_at(0).max_timestamp
        except CorruptBatchError:
            return None

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

    # ------------------------------------------------------------------------------------------ errors

    def _offset_near(self, position: int) -> int:
        """The offset of the indexed batch at or before ``position``: a lower bound for what is there."""
        i = bisect_right(self.offset_index.values, position) - 1
        return self.base_offset if i < 0 else self.base_offset + self.offset_index.keys[i]

    def corruption(self, position: int, expected: int, reason: str) -> CorruptSegmentError:
        """A CorruptSegmentError naming the offsets that cannot be trusted around ``position``.

        The range runs from the offset expected at ``position`` to just before the next batch that can still
        be found: the one right after the bad batch when its length still leads to a sane header, else the
        next index entry, else the segment's end.
        """
        index = self.offset_index
        i = bisect_right(index.values, position)
        last = (self.base_offset + index.keys[i] if i < len(index) else self.next_offset) - 1
        try:
            bad = self.header_at(position)
            after = self.header_at(position + bad.size) if position + bad.size < self.size else None
            if after is None:
                last = min(last, self.next_offset - 1)
            elif after.base_offset > expected:
                last = min(last, after.base_offset - 1)
        except CorruptBatchError:
            pass
        return CorruptSegmentError(str(self.path), expected, max(expected, last), reason)

    def info(self, *, active: bool) -> SegmentInfo:
        max_ts = None if self.max_timestamp == NO_TIMESTAMP else self.max_timestamp
        return SegmentInfo(self.base_offset, self.next_offset, self.size, max_ts, self.path, active)

    def forget_index_files(self) -> None:
        """Delete the index files (blocking); the in-memory indexes stay and are written whole next time.

        Used before compaction rewrites the log file, so a crash in between can never pair the new file
        with positions that belong to the old one.
        """
        self._index_stale = True
        self.offset_index.delete()
        self.time_index.delete()

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, offsets {self.base_offset}..{self.next_offset}, {self.size} bytes)"
