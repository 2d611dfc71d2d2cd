"""Reading a segment: finding the batch that holds an offset or a timestamp, planning and reading whole batches.

Reads find the batch containing an offset in two steps: the sparse offset index gives the nearest indexed batch
at or before it, then batch *headers* (not records) are read forward from there. Every byte read is CRC-checked
once in this process and remembered (:meth:`SegmentReads.verify_range` is what lets ``sendfile`` serve a range
without copying it through Python each time). An index entry that names the wrong batch means the index is
damaged: it is rebuilt in memory and the lookup tried again.
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from typing import NamedTuple

from tidelog.protocol.records import BatchHeader, crc_ok
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.batch_scan import read_header
from tidelog.storage.segment_state import SegmentState


class Planned(NamedTuple):
    """A run of whole batches ``[position, end)`` covering offsets ``[first_offset, next_offset)``."""

    position: int
    end: int
    first_offset: int
    next_offset: int


class SegmentReads(SegmentState):
    """The reads of a segment; they never change what it holds (an index rebuilt in memory aside)."""

    __slots__ = ()

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
