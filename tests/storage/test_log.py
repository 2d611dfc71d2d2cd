"""Log: what a producer, a consumer, a follower and the broker's housekeeping see."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from tidelog.clock import ManualClock
from tidelog.protocol.records import (
    CRC_POS,
    NewRecord,
    build_batch,
    check_batch,
    decode_records,
    iter_batches,
    rebuild_batch,
    records_of,
)
from tidelog.storage.config import FlushPolicy
from tidelog.storage.errors import CorruptBatchError, InvalidBatchError, LogClosedError, OffsetOutOfRangeError
from tidelog.storage.log import Log

from .logutil import BASE_TS, all_records, batch_offsets, make_batch, open_log, read_everything, small_config, stored


async def test_append_assigns_dense_offsets_and_reads_back_identical_bytes(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first, second = make_batch(3, tag="a"), make_batch(5, tag="b")
    r1 = await log.append(first, leader_epoch=7)
    r2 = await log.append(second, leader_epoch=8)
    assert (r1.base_offset, r1.last_offset, r1.batches, r1.size) == (0, 2, 1, len(first))
    assert (r2.base_offset, r2.last_offset) == (3, 7)
    assert log.end_offset == 8 and log.start_offset == 0
    assert log.read(0, 10**6) == stored(first, 0, 7) + stored(second, 3, 8)
    header = check_batch(log.read(4, 1))
    assert (header.base_offset, header.leader_epoch) == (3, 8)
    await log.close()


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


async def test_read_limits(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=10**6)
    batches = [make_batch(2, tag=str(i)) for i in range(10)]
    for data in batches:
        await log.append(data, 1)
    size = len(stored(batches[0], 0, 1))
    assert len(log.read(0, 1)) == size  # at least one whole batch
    assert len(log.read(0, 3 * size + 5)) == 3 * size
    assert batch_offsets(log.read(3, 10**6, max_offset=8)) == [(2, 3), (4, 5), (6, 7)]
    assert log.read(0, 10**6, max_offset=1) == b""  # the first batch ends at 1: not below the bound
    assert log.read(20, 100) == b""  # at the end: nothing yet
    with pytest.raises(OffsetOutOfRangeError):
        log.read(21, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    await log.close()


async def test_reads_move_across_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    expected = []
    for i in range(40):
        expected.append(stored(make_batch(2, size=50, tag=str(i)), 2 * i, 1))
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    assert len(log.segments) > 5
    assert read_everything(log, chunk=1) == b"".join(expected)
    assert read_everything(log, chunk=10**6) == b"".join(expected)
    await log.close()


async def test_read_range_serves_the_same_bytes_through_sendfile(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=2000)
    for i in range(30):
        await log.append(make_batch(3, tag=str(i)), 2)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=2000)  # reopened: nothing verified yet
    offset, received = 0, b""
    left, right = socket.socketpair()
    with left, right:
        while True:
            file_range = log.read_range(offset, 500)
            if file_range is None:
                break
            with file_range:
                sent = os.sendfile(left.fileno(), file_range.fd, file_range.position, file_range.length)
                assert sent == file_range.length
            received += right.recv(file_range.length, socket.MSG_WAITALL)
            offset = file_range.next_offset
    assert received == read_everything(log)
    assert offset == log.end_offset == 90
    await log.close()


async def test_file_range_survives_deletion_of_its_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    file_range = log.read_range(0, 10**6)
    assert file_range is not None
    expected = log.read(0, 10**6)
    await log.delete_segments_before(log.end_offset)
    assert os.pread(file_range.fd, file_range.length, file_range.position) == expected
    file_range.close()
    await log.close()


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


async def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):  # batch i: records at BASE_TS + 100 i + 0, 1
        records = [NewRecord(b"x" * 40, timestamp=BASE_TS + 100 * i + j) for j in range(2)]
        await log.append(build_batch(records, timestamp=0), 1)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(BASE_TS + 1001) == 21  # second record of batch 10
    assert log.offset_for_timestamp(BASE_TS + 1002) == 22
    assert log.offset_for_timestamp(BASE_TS + 2901) == 59
    assert log.offset_for_timestamp(BASE_TS + 2902) is None
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


async def test_closed_log_refuses_everything(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await log.append(make_batch(1), 1)
    await log.close()
    await log.close()  # idempotent
    with pytest.raises(LogClosedError):
        await log.append(make_batch(1), 1)
    with pytest.raises(LogClosedError):
        log.read(0, 10)
    with pytest.raises(LogClosedError):
        await log.truncate_to(0)


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


async def test_open_async_and_context_manager(tmp_path: Path) -> None:
    async with await Log.open_async(tmp_path, small_config()) as log:
        await log.append(make_batch(2), 1)
    assert log.closed
    async with await Log.open_async(tmp_path, small_config()) as log:
        assert log.recovery.clean_shutdown and log.end_offset == 2


async def test_offset_for_timestamp_after_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(30):
        await log.append(make_batch(2, size=40, timestamp=BASE_TS + 1000 * i), 1)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=1000)
    assert log.offset_for_timestamp(BASE_TS + 15_500) == 32
    assert log.offset_for_timestamp(BASE_TS + 29_000) == 58
    assert log.offset_for_timestamp(BASE_TS + 29_001) is None
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
