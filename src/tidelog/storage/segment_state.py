"""What a segment knows of its file, and how it learns it: the base every part of a segment builds on.

A segment (:mod:`tidelog.storage.segment`) keeps, beside its open file, what it derived from the batches in it:
the committed ``size``, ``next_offset``, the running maximum timestamp, the two sparse indexes
(:mod:`tidelog.storage.index`) and the byte ranges whose CRCs it has checked. This module holds that state and
the two ways it is made when a segment is opened: :meth:`SegmentState.load_indexes` trusts the index files after
sanity checks, :meth:`SegmentState.rebuild` scans the batches. Its names (``{base_offset:020d}.log``,
``.index``, ``.timeindex``) and its value types are here too. Reads are :mod:`tidelog.storage.segment_read`;
the file's lifecycle, appends and truncation are :mod:`tidelog.storage.segment`. They are one object in three
modules, as the log is: they share every field, and an append runs per batch.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tidelog.protocol.records import HEADER_SIZE, BatchHeader
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.batch_scan import read_header, scan_batches
from tidelog.storage.byte_ranges import ByteRanges
from tidelog.storage.errors import CorruptSegmentError
from tidelog.storage.index import DamagedIndexError, OffsetIndex, TimeIndex
from tidelog.storage.open_files import OPEN_FILES
from tidelog.storage.preallocation import Preallocation

NO_TIMESTAMP = -(2**63)
MAX_RELATIVE_OFFSET = 2**32 - 1
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"


_REOPENING = threading.Lock()


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


class ScanResult(NamedTuple):
    """How far a scan of a segment's batches got: ``end`` is just past the last good batch."""

    end: int
    batches: int
    error: CorruptBatchError | None


class SegmentState:
    """A segment file's descriptor and what the segment knows of the batches in it."""

    __slots__ = (
        "_bytes_since_index",
        "_close_pending",
        "_fd",
        "_index_stale",
        "_pins",
        "_shut",
        "_synced_writes",
        "_verified",
        "_writes",
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
        self._shut = False  # closed for good (a released descriptor reopens: see fd)
        self._writes = 0  # appends to the file, and how many of them an fdatasync has covered (releasable)
        self._synced_writes = 0
        self.sealed = False
        self.corrupt_from: int | None = None  # where the header chain of a sealed segment breaks, if it does
        self.preallocation = Preallocation(size)
        if fd >= 0:
            OPEN_FILES.opened(self)

    # ------------------------------------------------------------------------------------------ the file

    @property
    def path(self) -> Path:
        return self.directory / (segment_name(self.base_offset) + LOG_SUFFIX)

    @property
    def fd(self) -> int:
        """The file's descriptor, opened again if it was released (:mod:`tidelog.storage.open_files`)."""
        fd = self._fd
        if fd >= 0:
            OPEN_FILES.used(self)
            return fd
        return self._reopen()

    def _reopen(self) -> int:
        if self._shut:
            raise ValueError(f"{self.path.name} is closed")
        with _REOPENING:  # one reopen at a time: two threads must not both open it
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDWR)
                fd = self._fd
            else:
                return self._fd
        OPEN_FILES.opened(self)
        return fd

    @property
    def closed(self) -> bool:
        return self._shut or self._close_pending

    def releasable(self) -> bool:
        """Whether the descriptor may be closed now, to reopen when next used: open, not pinned by a worker
        thread, and every append to it covered by an fdatasync (:mod:`tidelog.storage.open_files` says why)."""
        return self._fd >= 0 and not self._pins and not self._close_pending and self._writes == self._synced_writes

    def release(self) -> None:
        """Close the descriptor to stay within the bound on open segment files; the next use reopens it."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def header_at(self, position: int) -> BatchHeader:
        raw = os.pread(self.fd, HEADER_SIZE, position)
        return read_header(raw, 0, position, self.size)

    def info(self, *, active: bool) -> SegmentInfo:
        max_ts = None if self.max_timestamp == NO_TIMESTAMP else self.max_timestamp
        return SegmentInfo(self.base_offset, self.next_offset, self.size, max_ts, self.path, active)

    def __repr__(self) -> str:
        return f"Segment({self.path.name}, offsets {self.base_offset}..{self.next_offset}, {self.size} bytes)"

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
