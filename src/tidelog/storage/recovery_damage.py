"""Damage that start-up recovery finds in the middle of a log: a bad batch with intact, CRC-valid batches after it.

(Damage found while the log runs, in segments recovery trusts, is :mod:`tidelog.storage.damage`'s on branches
that have it; this module is only the decision recovery makes for the segments it scans.)

Recovery (:mod:`tidelog.storage.recovery`) scans the segments a crash may have torn and stops at the first
batch that is torn or fails its CRC. What it does next depends on what lies *after* that batch:

- **nothing valid** (the file ends inside the batch, or only garbage or zeros follow): a **torn tail**, the
  normal result of a crash in the middle of a write. What was torn was never acknowledged under flush
  ``always``; cutting it is correct (and logged with offsets).
- **CRC-valid batches** at higher offsets, in the same segment or in a later one: **damage in the middle**.
  A crash does not do that; bit rot or a bad sector does. The batches after the damage were written,
  fsynced and most likely acknowledged: they are not cut without an operator's word (a single replica) or a
  replica to fetch them from (see :mod:`tidelog.broker.partitions.damaged`).

:class:`RecoveryDamage` describes such damage; :class:`DamagedLogError` is what opening a log raises when it
finds some and was not allowed to cut it. :func:`find_damage` decides between the two cases.

Finding the next good batch: when the bad batch's length field still leads to a valid batch, that is it;
otherwise the rest of the segment is searched for a header (format version byte in its place, the high bytes of
the expected offset in front of it) whose batch passes its CRC. The search runs only when damage was found.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidelog.protocol.records import FORMAT_VERSION, PREFIX, BatchHeader, check_batch
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.errors import StorageError

if TYPE_CHECKING:
    from tidelog.storage.segment import Segment

READ_CHUNK = 8 * 1024 * 1024
_FORMAT_POS = 16  # the format version byte follows base_offset (8), batch_length (4) and leader epoch (4)


@dataclass(frozen=True, slots=True)
class RecoveryDamage:
    """A damaged stretch of one segment followed by intact batches."""

    path: str
    """The segment file holding the damage."""
    position: int
    """Byte position in that file of the first bad byte (the start of the first bad batch)."""
    first_offset: int
    """The first offset that cannot be read: one past the last good batch before the damage."""
    next_good_offset: int
    """Base offset of the first intact batch after the damage."""
    intact_batches: int
    """CRC-valid batches from ``next_good_offset`` on (in this segment's run and every later segment)."""
    intact_records: int
    """Records in those batches."""
    last_intact_offset: int
    """The last offset of the intact batches counted."""
    reason: str
    """Why the first bad batch was refused (torn, CRC mismatch, offsets out of order)."""
    next_good_segment: int
    """Base offset of the segment holding the first intact batch (this one's, or a later one's)."""

    @property
    def bad_tail_only(self) -> bool:
        """No offset is missing: the first intact batch is at the offset expected at the damage. When it starts
        a later segment, only bytes after this segment's last batch are bad, and cutting them loses nothing."""
        return self.next_good_offset == self.first_offset and self.next_good_segment == self.next_good_offset

    def describe(self) -> str:
        """One line naming the file, the damaged offsets and what follows them."""
        if self.next_good_offset > self.first_offset:
            lost = f"offsets {self.first_offset}..{self.next_good_offset - 1} unreadable"
        else:
            lost = f"no offset missing (bad bytes after offset {self.first_offset - 1})"
        return (
            f"damaged batch at byte {self.position} of {self.path} ({self.reason}): {lost}, followed by "
            f"{self.intact_batches} intact batch(es) ({self.intact_records} record(s), offsets "
            f"{self.next_good_offset}..{self.last_intact_offset})"
        )


class DamagedLogError(StorageError):
    """Opening a log found damage in the middle (:class:`RecoveryDamage`) and was not allowed to cut it."""

    def __init__(self, directory: str, damage: RecoveryDamage) -> None:
        super().__init__(f"{directory}: {damage.describe()}; not cut: intact data follows the damage")
        self.directory = directory
        self.damage = damage


def find_damage(segments: list[Segment], index: int, position: int, reason: str) -> RecoveryDamage | None:
    """Whether CRC-valid batches follow the bad batch at ``position`` of ``segments[index]``.

    ``segments[index].next_offset`` must be the offset expected at ``position`` (one past the last good batch,
    as :meth:`Segment.rebuild` leaves it). Returns None for a torn tail (nothing valid follows), else the
    damage and what follows it. Blocking: reads the rest of that segment and every later one.
    """
    segment = segments[index]
    expected = segment.next_offset
    runs = [(later.base_offset, _valid(later, 0)) for later in segments[index + 1 :]]
    found = _next_batch(segment, position, expected)
    if found is not None:
        runs.insert(0, (segment.base_offset, _valid(segment, found)))
    first: tuple[int, BatchHeader] | None = None
    batches = records = 0
    last = expected - 1
    for base, run in runs:
        for header in run:
            if header.base_offset <= last:
                break  # offsets went back: not part of this log's sequence
            first = first or (base, header)
            batches, records, last = batches + 1, records + header.record_count, header.last_offset
    if first is None:
        return None
    where, header = first
    return RecoveryDamage(
        str(segment.path), position, expected, header.base_offset, batches, records, last, reason, where
    )


def _next_batch(segment: Segment, position: int, expected: int) -> int | None:
    """Where the first CRC-valid batch after ``position`` (at an offset ≥ ``expected``) starts, or None."""
    end = os.fstat(segment.fd).st_size
    if end - position <= _FORMAT_POS:
        return None
    data = _read(segment.fd, position, end)  # the rest of the segment; offsets below are relative to position
    length: int = PREFIX.unpack_from(data, 0)[1]
    by_length = [length + PREFIX.size] if length > 0 else []
    high = (expected >> 32).to_bytes(4, "big")
    pattern = re.compile(b"(?=" + re.escape(high) + b".{12}" + re.escape(bytes((FORMAT_VERSION,))) + b")", re.S)
    searched = (m.start() for m in pattern.finditer(data, 1))
    for candidate in itertools.chain(by_length, searched):
        if 0 < candidate <= len(data) - _FORMAT_POS and _valid_at(data, candidate, expected):
            return position + candidate
    return None


def _read(fd: int, start: int, end: int) -> bytes:
    chunks = []
    while start < end:
        chunk = os.pread(fd, min(READ_CHUNK, end - start), start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
    return b"".join(chunks)


def _valid_at(data: bytes, position: int, expected: int) -> bool:
    try:
        return check_batch(data, position).base_offset >= expected
    except CorruptBatchError:
        return False


def _valid(segment: Segment, start: int) -> Iterator[BatchHeader]:
    """The batches of ``segment`` from ``start`` up to its first bad one (CRC-checked)."""
    try:
        for _, header in segment.scan(start, os.fstat(segment.fd).st_size, verify=True):
            yield header
    except CorruptBatchError:
        return
