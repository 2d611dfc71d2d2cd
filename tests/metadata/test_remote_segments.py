"""The remote segment list record: where offloaded data starts and ends, also once retention emptied it."""

from __future__ import annotations

import msgspec

from tidelog.metadata.remote_segments import RemoteSegmentList, decode_list
from tidelog.storage.remote_segment import RemoteSegment


def segment(base: int, end: int) -> RemoteSegment:
    return RemoteSegment(f"p/{base:020d}-{end:020d}-x", base, end, 10, "x" * 64, ((0, base),), -1)


def test_bounds_follow_the_segments_and_the_offloaded_end_outlives_them() -> None:
    assert (RemoteSegmentList().start_offset, RemoteSegmentList().end_offset) == (None, None)
    listed = RemoteSegmentList((segment(0, 10), segment(10, 25)), 7, 25)
    assert (listed.start_offset, listed.end_offset) == (0, 25)
    emptied = RemoteSegmentList((), 7, 25)  # retention took every segment: uploads go on from 25, not from 0
    assert (emptied.start_offset, emptied.end_offset) == (None, 25)


def test_a_record_without_the_newer_fields_still_decodes() -> None:
    old = msgspec.msgpack.encode({"segments": []})
    assert decode_list(old) == RemoteSegmentList()
