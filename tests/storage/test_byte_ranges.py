"""ByteRanges: the verified parts of a segment file."""

from __future__ import annotations

from tidelog.storage.byte_ranges import ByteRanges


def test_byte_ranges_merge_and_report_gaps() -> None:
    ranges = ByteRanges()
    ranges.add(10, 20)
    ranges.add(30, 40)
    assert ranges.missing(0, 50) == [(0, 10), (20, 30), (40, 50)]
    ranges.add(20, 30)
    assert ranges.missing(0, 50) == [(0, 10), (40, 50)]
    assert ranges.missing(12, 38) == []
    ranges.truncate(35)
    assert ranges.missing(0, 50) == [(0, 10), (35, 50)]
