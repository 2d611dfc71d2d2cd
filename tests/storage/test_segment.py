"""Segment: appending placed batches, truncation, closing (its reads and state have their own test modules)."""

from __future__ import annotations

import os

import pytest

from tidelog.storage.segment import Segment
from tidelog.storage.segment_state import NO_TIMESTAMP

from .logutil import BASE_TS, SEGMENT_BASE, fill_segment


def test_append_tracks_size_offsets_and_timestamps(segment: Segment) -> None:
    batches = fill_segment(segment, 10)
    assert segment.size == sum(map(len, batches)) == os.path.getsize(segment.path)
    assert segment.next_offset == SEGMENT_BASE + 30
    assert segment.max_timestamp == BASE_TS + 90
    assert segment.first_append_ns == BASE_TS
    assert 0 < len(segment.offset_index) < 10  # sparse: about one entry per 300 bytes of log


def test_truncate_to_drops_whole_batches_and_keeps_state_right(segment: Segment) -> None:
    batches = fill_segment(segment, 20)
    assert segment.truncate_to(SEGMENT_BASE + 31)  # inside batch 10 (offsets 130..132): it goes whole
    assert segment.next_offset == SEGMENT_BASE + 30
    assert segment.size == sum(map(len, batches[:10])) == os.path.getsize(segment.path)
    assert segment.max_timestamp == BASE_TS + 90
    assert all(p < segment.size for p in segment.offset_index.values)
    fill_segment(segment, 2)  # appends continue at the new end
    assert segment.next_offset == SEGMENT_BASE + 36
    assert not segment.truncate_to(SEGMENT_BASE + 36)


def test_truncate_everything(segment: Segment) -> None:
    fill_segment(segment, 5)
    segment.truncate_to(SEGMENT_BASE)
    assert (segment.size, segment.next_offset, segment.max_timestamp) == (0, SEGMENT_BASE, NO_TIMESTAMP)
    assert len(segment.offset_index) == 0 and len(segment.time_index) == 0


def test_close_is_deferred_while_pinned(segment: Segment) -> None:
    segment.pin()
    segment.close()
    assert segment.closed
    segment.sync()  # the descriptor is still usable by the flush thread
    segment.unpin()
    with pytest.raises(ValueError):
        _ = segment.fd
