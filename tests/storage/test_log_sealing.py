"""Log rolls: on size, on age, on request (tidelog.storage.log_sealing)."""

from __future__ import annotations

from pathlib import Path

from tidelog.clock import ManualClock
from tidelog.storage.log import Log

from .logutil import all_records, make_batch, open_log, small_config


async def test_roll_on_size_never_splits_a_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    data = b"".join(make_batch(2, size=100, tag=str(i)) for i in range(12))  # ~3.2 KB in one append
    result = await log.append(data, 1)
    assert result.batches == 12
    infos = log.segments
    assert len(infos) >= 4 and all(s.size <= 1000 for s in infos)
    assert [s.base_offset for s in infos] == sorted({s.base_offset for s in infos})
    assert [r.offset for r in all_records(log)] == list(range(24))
    await log.close()


async def test_roll_on_age_through_the_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    log = Log.open(tmp_path, small_config(segment_max_age_ms=60_000), clock=clock)
    await log.append(make_batch(1), 1)
    clock.advance(59)
    await log.append(make_batch(1), 1)
    assert len(log.segments) == 1
    clock.advance(1)
    await log.append(make_batch(1), 1)
    assert [s.base_offset for s in log.segments] == [0, 2]
    await log.close()


async def test_explicit_roll(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await log.roll()  # empty active segment: nothing to do
    assert len(log.segments) == 1
    await log.append(make_batch(2), 1)
    await log.roll()
    assert [(s.base_offset, s.active) for s in log.segments] == [(0, False), (2, True)]
    await log.append(make_batch(2), 1)
    assert log.segments[-1].next_offset == 4
    await log.close()
