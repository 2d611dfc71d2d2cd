"""Segment state: loaded from the index files or rebuilt from the batches, the same either way."""

from __future__ import annotations

from pathlib import Path

from tidelog.storage.segment import Segment

from .logutil import BASE_TS, SEGMENT_BASE, fill_segment


def test_loaded_state_equals_rebuilt_state(tmp_path: Path, segment: Segment) -> None:
    fill_segment(segment, 25)
    segment.seal_prepare()
    segment.persist_indexes()
    a = Segment.open(tmp_path, SEGMENT_BASE, 300)
    a.load_indexes()
    b = Segment.open(tmp_path, SEGMENT_BASE, 300)
    result = b.rebuild(verify=True, keep_tail=False)
    assert result.error is None and result.batches == 25
    for seg in (a, b):
        assert (seg.size, seg.next_offset, seg.max_timestamp) == (segment.size, segment.next_offset, BASE_TS + 240)
        assert seg.find(SEGMENT_BASE + 40) == segment.find(SEGMENT_BASE + 40)
    a.close()
    b.close()
