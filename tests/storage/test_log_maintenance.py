"""Log maintenance: truncation, prefix deletion, compaction (tidelog.storage.log_maintenance)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.protocol.records import (
    check_batch,
    iter_batches,
    records_of,
)
from tidelog.storage.errors import OffsetOutOfRangeError

from .logutil import BASE_TS, all_records, batch_offsets, make_batch, open_log, read_everything


async def test_truncate_within_and_across_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    before = read_everything(log)
    await log.truncate_to(51)  # inside the batch 50..51: it goes whole
    assert log.end_offset == 50
    assert all(s.base_offset <= 50 for s in log.segments)
    assert read_everything(log) == before[: _prefix_len(before, 50)]
    await log.append(make_batch(2, tag="new"), 2)
    assert [r.offset for r in all_records(log)] == list(range(52))
    await log.truncate_to(0)
    assert (log.start_offset, log.end_offset, len(log.segments)) == (0, 0, 1)
    await log.truncate_to(0)  # nothing left: a no-op
    await log.close()


def _prefix_len(data: bytes, offset: int) -> int:
    return sum(h.size for _, h in iter_batches(data) if h.last_offset < offset)


async def test_truncate_then_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    await log.truncate_to(20)
    expected = read_everything(log)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=1000)
    assert log.end_offset == 20 and read_everything(log) == expected
    await log.close()


async def test_delete_segments_before_never_takes_the_active_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    bases = [s.base_offset for s in log.segments]
    deleted = await log.delete_segments_before(bases[2] + 1)  # segment 2 still holds offsets ≥ that
    assert deleted == bases[:2] and log.start_offset == bases[2]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert await log.delete_segments_before(10**9) == bases[2:-1]
    assert len(log.segments) == 1 and log.start_offset == bases[-1]
    assert read_everything(log)
    await log.close()


async def test_compaction_keeps_newest_per_key_and_reads_skip_gaps(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):  # even batches: one record of key k0..k2 plus a unique key; odd ones: k0..k2 only
        keys = [b"k%d" % (i % 3), b"solo%d" % i] if i % 2 == 0 else [b"k%d" % (i % 3)]
        await log.append(make_batch(2, size=40, tag=f"r{i}", keys=keys), 1)
    upto = log.segments[-1].base_offset
    result = await log.compact(upto, now_ns=BASE_TS)
    assert result is not None and result.records_removed > 0
    records = all_records(log)
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets) and len(offsets) < 60
    below = [r for r in records if r.offset < upto]
    keys = [r.key for r in below]
    assert all(keys.count(k) == 1 for k in keys if k and k.startswith(b"k"))
    spans = batch_offsets(read_everything(log))
    gap = next(o for o in range(upto) if not any(a <= o <= b for a, b in spans))  # a batch dropped whole
    assert check_batch(log.read(gap, 1)).base_offset > gap  # reading there returns the next batch
    expected = read_everything(log)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=1000)
    assert read_everything(log) == expected
    assert list(records_of(expected))
    await log.close()


async def test_compaction_with_nothing_eligible(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await log.append(make_batch(2, keys=[b"a"]), 1)
    assert await log.compact(10) is None
    await log.close()
