"""Segment reads: finding batches by offset, planning and reading whole batches, CRC checks and damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.protocol.records import iter_batches
from tidelog.storage.errors import CorruptSegmentError
from tidelog.storage.segment import Segment

from .logutil import SEGMENT_BASE, fill_segment


def test_find_returns_the_batch_containing_an_offset(segment: Segment) -> None:
    batches = fill_segment(segment, 20)
    position = 0
    for i, data in enumerate(batches):
        for offset in range(SEGMENT_BASE + 3 * i, SEGMENT_BASE + 3 * i + 3):
            found = segment.find(offset)
            assert found is not None
            assert found[0] == position and found[1].base_offset == SEGMENT_BASE + 3 * i
        position += len(data)
    assert segment.find(SEGMENT_BASE + 60) is None
    assert segment.find(0)[0] == 0  # type: ignore[index]  # before the segment: its first batch


def test_plan_and_read_return_whole_batches(segment: Segment) -> None:
    batches = fill_segment(segment, 20)
    size = len(batches[0])
    plan = segment.plan(0, size * 5 + 10, max_offset=10**9)
    assert plan is not None and plan.end == 5 * size and plan.next_offset == SEGMENT_BASE + 15
    assert segment.read(plan) == b"".join(batches[:5])
    one = segment.plan(0, 1, max_offset=10**9)  # smaller than a batch: still one whole batch
    assert one is not None and segment.read(one) == batches[0]
    capped = segment.plan(0, 10**6, max_offset=SEGMENT_BASE + 7)  # only batches ending below offset 107
    assert capped is not None and capped.next_offset == SEGMENT_BASE + 6
    assert segment.plan(0, 10**6, max_offset=SEGMENT_BASE + 2) is None


def test_wrong_index_entry_is_noticed_and_rebuilt(segment: Segment) -> None:
    fill_segment(segment, 20)
    segment.offset_index.values[1] += 1  # now points into the middle of a batch
    found = segment.find(SEGMENT_BASE + 50)
    assert found is not None and found[1].base_offset == SEGMENT_BASE + 48


def test_bit_flip_in_a_batch_is_reported_with_its_offsets(segment: Segment) -> None:
    batches = fill_segment(segment, 10)
    position = sum(map(len, batches[:4])) + 70  # inside batch 4's records (offsets 112..114)
    with open(segment.path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x10]))
    plan = segment.plan(0, 10**6, 10**9)
    assert plan is not None
    with pytest.raises(CorruptSegmentError) as info:
        segment.read(plan)
    assert (info.value.first_offset, info.value.last_offset) == (SEGMENT_BASE + 12, SEGMENT_BASE + 14)
    good = segment.plan(sum(map(len, batches[:5])), 10**6, 10**9)  # the batches after it still read
    assert good is not None
    assert list(iter_batches(segment.read(good)))


def test_verify_range_reads_only_unverified_parts(tmp_path: Path, segment: Segment) -> None:
    fill_segment(segment, 10)
    segment.seal_prepare()
    segment.persist_indexes()
    reopened = Segment.open(tmp_path, SEGMENT_BASE, 300)
    reopened.load_indexes()
    plan = reopened.plan(0, 10**6, 10**9)
    assert plan is not None
    assert reopened._verified.missing(0, plan.end) == [(0, plan.end)]
    reopened.verify_range(plan)
    assert reopened._verified.missing(0, plan.end) == []
    reopened.close()
