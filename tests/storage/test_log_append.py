"""Log appends: validation, placement, ordering, follower appends (tidelog.storage.log_append)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidelog.protocol.records import (
    CRC_POS,
    NewRecord,
    build_batch,
    check_batch,
    decode_records,
    rebuild_batch,
)
from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError
from tidelog.storage.config import FlushPolicy

from .logutil import all_records, batch_offsets, make_batch, open_log, stored


async def test_append_of_several_batches_at_once(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data = make_batch(2, tag="x") + make_batch(4, tag="y") + make_batch(1, tag="z")
    result = await log.append(data, 1)
    assert (result.base_offset, result.last_offset, result.batches) == (0, 6, 3)
    assert batch_offsets(log.read(0, 10**6)) == [(0, 1), (2, 5), (6, 6)]
    assert [r.offset for r in all_records(log)] == list(range(7))
    await log.close()


def _flip_crc(data: bytes) -> bytes:
    out = bytearray(data)
    out[CRC_POS] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: b"", InvalidBatchError),
        (lambda: _flip_crc(make_batch(2)), CorruptBatchError),
        (lambda: make_batch(2) + _flip_crc(make_batch(2)), CorruptBatchError),  # the second batch is bad
        (lambda: make_batch(2)[:-3], CorruptBatchError),  # torn
        (lambda: make_batch(2) + b"\x00" * 10, CorruptBatchError),  # trailing junk
        (lambda: make_batch(40, size=200), InvalidBatchError),  # above max_batch_bytes
        (lambda: build_batch([NewRecord(b"c")], timestamp=1, control=True), InvalidBatchError),
        (lambda: _sparse_batch(), InvalidBatchError),  # fewer records than offsets
    ],
)
async def test_bad_appends_store_nothing(tmp_path: Path, make: object, error: type[Exception]) -> None:
    log = open_log(tmp_path, max_batch_bytes=2000)
    await log.append(make_batch(2), 1)
    before = (log.end_offset, log.size_bytes, log.read(0, 10**6))
    with pytest.raises(error):
        await log.append(make(), 1)  # type: ignore[operator]
    assert (log.end_offset, log.size_bytes, log.read(0, 10**6)) == before
    await log.close()


def _sparse_batch() -> bytes:
    full = make_batch(3)
    header = check_batch(full)
    return rebuild_batch(header, decode_records(full)[:1])


async def test_control_append_requires_control_batches(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    marker = build_batch([NewRecord(b"commit")], timestamp=1, control=True)
    result = await log.append(marker, 1, control=True)
    assert result.base_offset == 0
    with pytest.raises(InvalidBatchError):
        await log.append(make_batch(1), 1, control=True)
    with pytest.raises(ValueError):
        await log.append(make_batch(1), -1)
    await log.close()


async def test_follower_append_keeps_offsets_and_refuses_overlap(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    a = stored(make_batch(3, tag="a"), 0, 4)
    b = stored(make_batch(2, tag="b"), 10, 5)  # a compacted leader may skip offsets
    result = await log.append_as_follower(a + b)
    assert (result.base_offset, result.last_offset) == (0, 11) and log.end_offset == 12
    assert log.read(0, 10**6) == a + b
    assert log.read(5, 10**6) == b  # an offset in the gap reads the next batch
    with pytest.raises(InvalidBatchError, match="overlaps"):
        await log.append_as_follower(stored(make_batch(1), 11, 5))
    assert log.end_offset == 12
    await log.close()


async def test_a_follower_append_reports_its_end_once_durable(tmp_path: Path) -> None:
    log = open_log(tmp_path, flush_policy=FlushPolicy.ALWAYS)
    seen: list[tuple[int, int]] = []  # (end offset given, fsync rounds done) when told
    await log.append_as_follower(
        stored(make_batch(3), 0, 1) + stored(make_batch(2), 7, 1),
        lambda end: seen.append((end, log.flusher.fsync_rounds)),
    )
    assert seen == [(9, 1)]  # after the last batch (offsets 7..8), once its fsync was done
    with pytest.raises(InvalidBatchError):  # refused: nothing written, nothing reported
        await log.append_as_follower(stored(make_batch(1), 2, 1), lambda end: seen.append((end, -1)))
    assert seen == [(9, 1)]
    await log.close()


async def test_an_append_waits_behind_an_operation_queued_for_the_lock(tmp_path: Path) -> None:
    """A free lock is skipped by an append only while nobody is queued for it: a truncation that waits for an
    operation in progress runs before an append that arrives after it."""
    log = open_log(tmp_path)
    await log.append(make_batch(2), 1)
    await log.append(make_batch(2), 1)
    assert log.end_offset == 4
    async with log._holding_lock():  # stands in for a retention run or a compaction in progress
        truncation = asyncio.ensure_future(log.truncate_to(2))
        await asyncio.sleep(0.01)  # queued behind the holder
        append = asyncio.ensure_future(log.append(make_batch(1), 1))
        await asyncio.sleep(0.01)
        assert not truncation.done() and not append.done()
    await asyncio.wait_for(truncation, 5)
    result = await asyncio.wait_for(append, 5)
    assert result.base_offset == 2  # after the truncation, not at 4 before it
    assert log.end_offset == 3
    await log.close()


async def test_concurrent_appends_are_ordered_and_contiguous(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=3000, flush_policy=FlushPolicy.ALWAYS)
    payloads = [make_batch(1 + i % 4, size=60, tag=f"p{i}") for i in range(60)]
    results = await asyncio.gather(*(log.append(p, 1) for p in payloads))
    assert [r.base_offset for r in results] == sorted(r.base_offset for r in results)
    assert results[0].base_offset == 0 and log.end_offset == sum(1 + i % 4 for i in range(60))
    for payload, result in zip(payloads, results, strict=True):
        assert log.read(result.base_offset, 1) == stored(payload, result.base_offset, 1)
    assert log.flusher.durable == log.flusher.written
    await log.close()


async def test_cancelled_appends_leave_the_log_consistent(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000, flush_policy=FlushPolicy.ALWAYS)
    await log.append(make_batch(2, size=300), 1)
    waiting_for_fsync = asyncio.ensure_future(log.append(make_batch(2, size=300), 1))  # rolls, then waits
    await asyncio.sleep(0)
    waiting_for_fsync.cancel()  # written already: only the acknowledgement is lost
    with pytest.raises(asyncio.CancelledError):
        await waiting_for_fsync
    assert log.end_offset == 4
    truncation = asyncio.ensure_future(log.truncate_to(2))  # holds the lock across its fsync
    await asyncio.sleep(0)
    waiting_for_lock = asyncio.ensure_future(log.append(make_batch(5), 1))
    await asyncio.sleep(0)
    waiting_for_lock.cancel()  # never got the lock: nothing written
    with pytest.raises(asyncio.CancelledError):
        await waiting_for_lock
    await truncation
    result = await log.append(make_batch(1, tag="after"), 1)
    assert result.base_offset == 2
    offsets = [r.offset for r in all_records(log)]
    assert offsets == [0, 1, 2] == list(range(log.end_offset))
    await log.close()


async def test_follower_gap_beyond_a_segments_offset_range_starts_a_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await log.append(make_batch(2), 1)
    far = 2**33
    await log.append_as_follower(stored(make_batch(3, tag="far"), far, 2))
    assert [s.base_offset for s in log.segments] == [0, far]
    assert log.end_offset == far + 3 and check_batch(log.read(far + 1, 1)).base_offset == far
    await log.close()
    log = open_log(tmp_path)
    assert log.end_offset == far + 3
    await log.close()
