"""Retention: which sealed segments go by age, bytes and message count, and that the active one never does."""

from __future__ import annotations

from pathlib import Path

from tidelog.clock import ManualClock
from tidelog.storage.config import LogConfig
from tidelog.storage.log import Log
from tidelog.storage.retention import apply_retention, deletable_prefix
from tidelog.storage.segment_state import SegmentInfo

from .logutil import make_batch, read_everything, small_config

MS = 1_000_000


def _segments(*specs: tuple[int, int, int | None]) -> list[SegmentInfo]:
    """(base offset, size, max timestamp) per segment; the last is active and ends at base + 10."""
    out = []
    for i, (base, size, max_ts) in enumerate(specs):
        following = specs[i + 1][0] if i + 1 < len(specs) else base + 10
        out.append(SegmentInfo(base, following, size, max_ts, Path(f"{base}.log"), i == len(specs) - 1))
    return out


SEGS = _segments((0, 100, 1000 * MS), (10, 100, 2000 * MS), (20, 100, 3000 * MS), (30, 100, 4000 * MS))


def test_no_limits_delete_nothing() -> None:
    assert deletable_prefix(SEGS, LogConfig(), now_ns=10**15, end_offset=40) == 0


def test_age_deletes_segments_whose_newest_record_is_too_old() -> None:
    config = LogConfig(retention_max_age_ms=1500)
    assert deletable_prefix(SEGS, config, now_ns=3000 * MS, end_offset=40) == 1  # horizon 1500 ms
    assert deletable_prefix(SEGS, config, now_ns=3501 * MS, end_offset=40) == 2
    assert deletable_prefix(SEGS, config, now_ns=10**15, end_offset=40) == 3  # never the active segment


def test_age_stops_at_the_first_young_segment() -> None:
    segs = _segments((0, 100, 5000 * MS), (10, 100, 1000 * MS), (20, 100, 1000 * MS))
    assert deletable_prefix(segs, LogConfig(retention_max_age_ms=1), now_ns=3000 * MS, end_offset=30) == 0


def test_an_empty_sealed_segment_has_no_age_to_keep_it() -> None:
    segs = _segments((0, 0, None), (10, 100, 5000 * MS))
    assert deletable_prefix(segs, LogConfig(retention_max_age_ms=1), now_ns=3000 * MS, end_offset=20) == 1


def test_bytes_keep_at_least_the_limit() -> None:
    assert deletable_prefix(SEGS, LogConfig(retention_max_bytes=250), now_ns=0, end_offset=40) == 1
    assert deletable_prefix(SEGS, LogConfig(retention_max_bytes=200), now_ns=0, end_offset=40) == 2
    assert deletable_prefix(SEGS, LogConfig(retention_max_bytes=0), now_ns=0, end_offset=40) == 3


def test_messages_keep_at_least_the_limit() -> None:
    assert deletable_prefix(SEGS, LogConfig(retention_max_messages=25), now_ns=0, end_offset=40) == 1
    assert deletable_prefix(SEGS, LogConfig(retention_max_messages=20), now_ns=0, end_offset=40) == 2
    assert deletable_prefix(SEGS, LogConfig(retention_max_messages=41), now_ns=0, end_offset=40) == 0


def test_the_longest_prefix_of_any_limit_wins() -> None:
    config = LogConfig(retention_max_messages=35, retention_max_bytes=100)
    assert deletable_prefix(SEGS, config, now_ns=0, end_offset=40) == 3


def test_max_offset_caps_deletion() -> None:
    config = LogConfig(retention_max_bytes=0)
    assert deletable_prefix(SEGS, config, now_ns=0, end_offset=40, max_offset=25) == 2
    assert deletable_prefix(SEGS, config, now_ns=0, end_offset=40, max_offset=9) == 0


async def test_apply_retention_on_a_log(tmp_path: Path) -> None:
    clock = ManualClock()
    log = Log.open(tmp_path, small_config(segment_max_bytes=1000, retention_max_age_ms=60_000), clock=clock)
    for i in range(20):
        await log.append(make_batch(2, size=50, tag=str(i), timestamp=clock.now_ns()), 1)
    old_segments = len(log.segments)
    clock.advance(30)
    for i in range(20):
        await log.append(make_batch(2, size=50, tag=f"late{i}", timestamp=clock.now_ns()), 1)
    assert await apply_retention(log) == []  # nothing is a minute old yet
    clock.advance(31)
    deleted = await apply_retention(log)
    assert len(deleted) >= old_segments - 1
    assert log.start_offset == log.segments[0].base_offset > 0
    assert all(not (tmp_path / f"{b:020d}.log").exists() for b in deleted)
    assert read_everything(log)
    clock.advance(3600)
    await apply_retention(log)
    assert len(log.segments) == 1  # the active segment stays, whatever its age
    await log.close()
