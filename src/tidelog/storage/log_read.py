"""Reading: whole batches, file ranges for ``os.sendfile``, offsets by timestamp, raw sealed segments.

Readers never take the log's lock: reads are synchronous and run on the event loop thread between writes, and
they stop at each segment's committed size. :meth:`ReadingLog.read` returns whole batches, CRC-checked every
time. :meth:`ReadingLog.read_range` returns a file and byte range for ``os.sendfile``; its guarantee is that
every byte in the range has passed its CRC *in this process*: when appended (the log validated the batch before
writing it), when recovery scanned it, or on first serving (the range is read and checked once, and the segment
remembers it). A read at an offset that compaction removed returns the next batch after it; a segment with
nothing at or after the offset is skipped. Bytes that fail their CRC when read are recorded as a damaged range
(:mod:`tidelog.storage.damage`): reads serve everything before and after it and never pass through it.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tidelog.protocol.records import ENCRYPTED_FLAG, check_batch, decode_records
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.encryption import open_batch
from tidelog.storage.errors import CorruptSegmentError, OffsetOutOfRangeError
from tidelog.storage.log_state import LogState
from tidelog.storage.segment import Segment
from tidelog.storage.segment_read import Planned

T = TypeVar("T")
_DAMAGE_ATTEMPTS = 8  # damaged ranges one read may find and record before it gives up with the last one


@dataclass(frozen=True, slots=True)
class FileRange:
    """Whole, CRC-verified batches ``[position, position + length)`` of a segment file, for ``os.sendfile``.

    ``fd`` is a duplicate descriptor owned by this object: it stays valid (and keeps showing the same
    bytes) even if the segment is deleted, truncated or compacted meanwhile. Close it (or use ``with``).
    """

    fd: int
    path: Path
    position: int
    length: int
    first_offset: int
    next_offset: int
    """The offset to read from next: one past the last batch in the range."""

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> FileRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ReadingLog(LogState):
    """Reads; none of them takes the lock."""

    def _locate(self, start_offset: int, max_bytes: int, max_offset: int | None) -> tuple[Segment, Planned] | None:
        self._check_open()
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
        start, end = self.start_offset, self.end_offset
        if not start <= start_offset <= end:
            raise OffsetOutOfRangeError(start_offset, start, end)
        limit = end if max_offset is None else min(max_offset, end)
        if self._damage:
            start_offset, limit = self._damage.plan(start_offset, limit)
        if start_offset >= limit:
            return None
        first = bisect_right(self._segments, start_offset, key=lambda s: s.base_offset) - 1
        for segment in self._segments[max(0, first) :]:
            found = segment.find(start_offset)
            if found is None:
                continue  # nothing at or after the offset here (a compacted-away range): try the next segment
            plan = segment.plan(found[0], max_bytes, limit)
            return None if plan is None else (segment, plan)
        return None

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one containing ``start_offset`` (or the next one after it).

        At least one batch even if it is larger than ``max_bytes``; then as many as fit. Only batches whose
        last offset is below ``max_offset`` (an exclusive bound such as the high watermark) are returned.
        Empty at the end. Raises :class:`OffsetOutOfRangeError` outside ``[start_offset, end_offset]`` and
        :class:`OffsetDamagedError` inside a damaged range; batches before one are served, never one that
        fails its CRC (finding one records its range).
        """

        def read() -> bytes:
            located = self._locate(start_offset, max_bytes, max_offset)
            if located is None:
                return b""
            segment, plan = located
            return segment.read(plan)

        return self._around_damage(read)

    def read_range(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> FileRange | None:
        """Like :meth:`read`, but a file range to ``os.sendfile`` from; None when there is nothing to read."""

        def read() -> FileRange | None:
            located = self._locate(start_offset, max_bytes, max_offset)
            if located is None:
                return None
            segment, plan = located
            try:
                segment.verify_range(plan)
            except CorruptSegmentError:
                segment.read(plan)  # checks the plan from its first batch on: names the damaged batch exactly
                raise
            return FileRange(
                os.dup(segment.fd),
                segment.path,
                plan.position,
                plan.end - plan.position,
                plan.first_offset,
                plan.next_offset,
            )

        return self._around_damage(read)

    def _around_damage(self, read: Callable[[], T]) -> T:
        """Run ``read``; when it finds damage, record the range and read again (now bounded by it)."""
        last: CorruptSegmentError | None = None
        for _ in range(_DAMAGE_ATTEMPTS):
            try:
                return read()
            except CorruptSegmentError as exc:
                self._damage.record(exc)
                last = exc
        assert last is not None
        raise last

    def offset_for_timestamp(self, timestamp_ns: int) -> int | None:
        """The first offset whose record timestamp is ≥ ``timestamp_ns``; None if there is none. A damaged batch
        there answers its base offset (and is recorded): a read from it names the damaged range."""
        self._check_open()
        for segment in self._segments:
            found = segment.batch_for_timestamp(timestamp_ns)
            if found is None:
                continue
            position, header = found
            try:
                plan = Planned(position, position + header.size, header.base_offset, header.next_offset)
                data = segment.read(plan)
                checked = check_batch(data)
                if checked.attributes & ENCRYPTED_FLAG:
                    data = open_batch(data, 0, checked, self.keyring)
                    checked = check_batch(data)
                records = decode_records(data, 0, header=checked)
            except CorruptSegmentError as exc:
                self._damage.record(exc)
                return header.base_offset
            except CorruptBatchError as exc:
                raise segment.corruption(position, header.base_offset, f"records: {exc}") from None
            for record in records:  # one batch, off the hot path
                if record.timestamp >= timestamp_ns:
                    return record.offset
            return header.base_offset
        return None

    def sealed_segment_range(self, base_offset: int, position: int, max_bytes: int) -> tuple[FileRange, int] | None:
        """Raw bytes of the *sealed* segment based at ``base_offset``, from ``position``, at most ``max_bytes``,
        and the segment's size: what a follower copying whole segment files downloads. None when no sealed
        segment has that base.

        Not CRC-checked here (the copier checks every batch of the whole file); the range's ``first_offset``
        and ``next_offset`` are the segment's.
        """
        self._check_open()
        segments = self._segments
        i = bisect_left(segments, base_offset, key=lambda s: s.base_offset)
        if i >= len(segments) - 1 or segments[i].base_offset != base_offset:
            return None  # unknown, deleted, or the active segment (which fetching copies)
        segment = segments[i]
        start = min(max(0, position), segment.size)
        length = min(max(0, max_bytes), segment.size - start)
        file = FileRange(os.dup(segment.fd), segment.path, start, length, segment.base_offset, segment.next_offset)
        return file, segment.size
