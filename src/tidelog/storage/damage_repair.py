"""Restoring a damaged range in place from a replica's copy of the same batches.

Replication copies batches byte for byte (offsets, leader epoch and CRC included), so a replica that holds the
offsets of a damaged range holds exactly the bytes the damaged span of the segment file held when it was
written: the same batches, the same length. Restoring is then an overwrite of that span — no truncation of the
records after it, no change to the offset or time index, no leadership change — and is only done when
everything agrees:

- the replica's batches pass their CRCs and cover exactly ``first..last``;
- the damaged span of the segment (from the end of the batch before ``first``, or the segment's start, to the
  batch at ``last + 1``, or the segment's end) is exactly as long as they are.

Otherwise :class:`RepairRefusedError` says why and nothing is written. The log runs this under its lock
(:meth:`~tidelog.storage.log.Log.repair_damaged`): the bytes are written and fsynced in a worker thread, then
read back and CRC-checked before the range is forgotten.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass

from tidelog.protocol.records import iter_batches
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.damage import DamagedRange
from tidelog.storage.errors import StorageError
from tidelog.storage.segment import Segment
from tidelog.storage.segment_read import Planned


class RepairRefusedError(StorageError):
    """A replica's copy cannot replace a damaged range in place (the message says why); nothing was written."""


@dataclass(frozen=True, slots=True)
class Patch:
    """Where a replica's copy goes: ``data`` over ``plan``'s span of ``segment``."""

    segment: Segment
    plan: Planned
    data: bytes


def covering(copy: bytes, damaged: DamagedRange) -> bytes:
    """The batches of ``copy`` (a replica's fetch answer from ``damaged.first``) that cover exactly the range."""
    end = 0
    try:
        for position, header in iter_batches(copy, verify=True):
            if position == 0 and header.base_offset != damaged.first:
                raise RepairRefusedError(
                    f"the replica's copy starts at offset {header.base_offset}, not {damaged.first}"
                )
            if header.last_offset > damaged.last:
                break
            end = position + header.size
            if header.last_offset == damaged.last:
                return copy[:end]
    except CorruptBatchError as exc:
        raise RepairRefusedError(f"the replica's copy is damaged too: {exc}") from None
    raise RepairRefusedError(f"the replica's copy does not end at offset {damaged.last} on a batch boundary")


def locate(segments: list[Segment], damaged: DamagedRange, data: bytes) -> Patch:
    """The span of the segment file ``data`` replaces; refused unless it is exactly as long as ``data``."""
    i = bisect_right(segments, damaged.first, key=lambda s: s.base_offset) - 1
    if i < 0 or damaged.last >= segments[i].next_offset:
        raise RepairRefusedError(f"offsets {damaged.first}..{damaged.last} are not within one segment any more")
    segment = segments[i]
    position = 0
    if damaged.first > segment.base_offset:
        found = segment.find(damaged.first - 1)
        if found is None or found[1].next_offset != damaged.first:
            raise RepairRefusedError(f"no batch of {segment.path.name} ends right before offset {damaged.first}")
        position = found[0] + found[1].size
    end = segment.size
    if damaged.next_offset < segment.next_offset:
        after = segment.find(damaged.next_offset)
        if after is None or after[1].base_offset != damaged.next_offset:
            raise RepairRefusedError(f"no batch of {segment.path.name} starts at offset {damaged.next_offset}")
        end = after[0]
    if end - position != len(data):
        raise RepairRefusedError(
            f"the damaged span of {segment.path.name} is {end - position} bytes, the replica's copy {len(data)}"
        )
    return Patch(segment, Planned(position, end, damaged.first, damaged.next_offset), data)


def write_patch(patch: Patch) -> None:
    """Blocking: write the copy over the damaged span and fsync it."""
    view = memoryview(patch.data)
    position = patch.plan.position
    while view:
        written = os.pwrite(patch.segment.fd, view, position)
        view, position = view[written:], position + written
    patch.segment.sync()
