"""Zeros written ahead of the active segment's end: appends overwrite them, seals and closes trim them, recovery
tells them from damage, and a fill never writes over an append."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from pathlib import Path

import pytest

from tidelog.clock import ManualClock
from tidelog.protocol.records import iter_batches
from tidelog.storage import segment as segment_module
from tidelog.storage.config import FlushPolicy
from tidelog.storage.flush import FlushFailedError
from tidelog.storage.log import Log
from tidelog.storage.preallocation import MAX_FILL_RATE, PIECE_BYTES, RATE_WINDOW_NS, AppendRate, Preallocation
from tidelog.storage.recovery import write_recovery_point
from tidelog.storage.recovery_damage import DamagedLogError

from .logutil import crash, make_batch, open_log, read_everything, small_config

KiB = 1024
RESERVE = 256 * KiB


def _open(path: Path, clock: ManualClock | None = None, *, measured: bool = True, **overrides: object) -> Log:
    """An ``ALWAYS`` log that fills 256 KiB ahead; ``measured``: its append rate already found low (a log
    fills nothing in its first rate window)."""
    settings: dict[str, object] = {
        "flush_policy": FlushPolicy.ALWAYS,
        "segment_max_bytes": 1024 * KiB,
        "preallocate_bytes": RESERVE,
    }
    settings.update(overrides)
    log = Log.open(path, small_config(**settings), clock=clock)
    if measured:
        log._append_rate.add(0, -RATE_WINDOW_NS)
        log._append_rate.add(0, 0)
    return log


async def _fills_done(log: Log) -> None:
    """Wait (bounded) until no zero fill runs on any segment of ``log``."""
    deadline = time.monotonic() + 10
    while any(s.preallocation.running for s in log._segments):
        assert time.monotonic() < deadline, "a zero fill did not finish within 10 s"
        await asyncio.sleep(0.005)


def _file_size(log: Log, index: int = -1) -> int:
    return os.stat(log.segments[index].path).st_size


def _zeros_after_first_segment(directory: Path, count: int) -> list[Path]:
    files = sorted(directory.glob("*.log"))
    with open(files[0], "ab") as f:
        f.write(bytes(count))
    return files


def _tail(log: Log) -> bytes:
    active = log._segments[-1]
    return active.path.read_bytes()[active.size :]


async def test_an_always_log_writes_zeros_ahead_and_appends_overwrite_them(tmp_path: Path) -> None:
    log = _open(tmp_path)
    await log.append(make_batch(3, size=100, tag="first"), 1)
    await _fills_done(log)
    active = log._segments[-1]
    size_after_fill = _file_size(log)
    assert size_after_fill == active.size + PIECE_BYTES  # a small segment: one piece of room, not the reserve
    assert _tail(log) == bytes(PIECE_BYTES)
    for i in range(20):
        await log.append(make_batch(3, size=100, tag=str(i)), 1)
    await _fills_done(log)
    assert _file_size(log) == size_after_fill  # the appends landed in the zeros: the file did not grow
    assert _tail(log) == bytes(size_after_fill - active.size)
    content = read_everything(log)
    await log.close()
    reopened = _open(tmp_path)
    assert reopened.recovery.clean_shutdown
    assert read_everything(reopened) == content
    await reopened.close()


async def test_the_room_is_refilled_as_appends_use_it_and_stops_at_the_segment_size(tmp_path: Path) -> None:
    log = _open(tmp_path, segment_max_bytes=600 * KiB)
    for i in range(60):  # about 6 KiB each: 360 KiB, beyond the first reserve
        await log.append(make_batch(3, size=2000, tag=str(i)), 1)
        await _fills_done(log)
        active = log._segments[-1]
        room = _file_size(log) - active.size
        assert 0 < room <= RESERVE and _file_size(log) <= 600 * KiB
        wanted_room = min(RESERVE, max(PIECE_BYTES, active.size))
        assert room >= wanted_room // 4 or _file_size(log) == 600 * KiB  # refilled once a quarter was left
    await log.close()


async def test_a_roll_and_a_close_trim_the_room(tmp_path: Path) -> None:
    log = _open(tmp_path, segment_max_bytes=8 * KiB)
    for i in range(30):
        await log.append(make_batch(3, size=200, tag=str(i)), 1)
        await _fills_done(log)
    assert len(log.segments) > 2
    for index, segment in enumerate(log.segments[:-1]):
        assert _file_size(log, index) == segment.size  # sealed: batches only
    assert _file_size(log) > log.segments[-1].size
    content = read_everything(log)
    paths = [s.path for s in log.segments]
    sizes = [s.size for s in log.segments]
    await log.close()
    assert [p.stat().st_size for p in paths] == sizes  # closed: no zeros left anywhere
    reopened = _open(tmp_path, segment_max_bytes=8 * KiB)
    assert reopened.recovery.clean_shutdown and reopened.recovery.scanned == []
    assert read_everything(reopened) == content
    await reopened.close()


async def test_after_a_crash_recovery_trims_the_zeros_without_reporting_a_cut(tmp_path: Path) -> None:
    log = _open(tmp_path)
    for i in range(5):
        await log.append(make_batch(3, size=100, tag=str(i)), 1)
    await _fills_done(log)
    content = read_everything(log)
    end = log.end_offset
    zeros = _file_size(log) - log.segments[-1].size
    await crash(log)
    reopened = _open(tmp_path)
    report = reopened.recovery
    assert not report.clean_shutdown
    assert report.truncated_bytes == 0 and report.truncated_at is None and report.deleted_segments == []
    assert report.preallocated_bytes == zeros > 0
    assert reopened.end_offset == end and read_everything(reopened) == content
    assert _file_size(reopened) == reopened.segments[-1].size
    await reopened.append(make_batch(2, tag="after"), 1)  # and the log goes on, filling ahead again
    await _fills_done(reopened)
    assert _file_size(reopened) > reopened.segments[-1].size
    assert read_everything(reopened).startswith(content)
    await reopened.close()


async def test_a_zero_tail_on_an_earlier_segment_is_trimmed_and_the_later_segments_kept(tmp_path: Path) -> None:
    # Segments are trimmed, durably, before anything in the next one is acknowledged: zeros after the batches of
    # a segment that is not the last are what a lost write leaves, not room written ahead. Here the next segment
    # goes on at the next offset, so no offset is missing: the zeros are cut, nothing else (storage.recovery_damage).
    log = open_log(tmp_path, segment_max_bytes=1000)  # NEVER: nothing is sealed before the crash
    for i in range(12):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    content = read_everything(log)
    await crash(log)
    write_recovery_point(tmp_path, 0)  # as if no seal had been fsynced yet: every segment is scanned
    files = _zeros_after_first_segment(tmp_path, 100)
    assert len(files) >= 3
    reopened = open_log(tmp_path, segment_max_bytes=1000)
    report = reopened.recovery
    assert report.trimmed_bad_tails == [0] and report.cuts == 0 and report.deleted_segments == []
    assert report.truncated_bytes == 0 and report.preallocated_bytes == 0
    assert read_everything(reopened) == content
    await reopened.close()


async def test_a_zero_tail_on_an_earlier_segment_with_offsets_missing_is_damage(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(12):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    await crash(log)
    write_recovery_point(tmp_path, 0)
    files = _zeros_after_first_segment(tmp_path, 0)
    data = files[0].read_bytes()
    position, header = list(iter_batches(data))[-1]
    files[0].write_bytes(data[:position] + bytes(header.size))  # its last batch lost: its offsets are missing
    with pytest.raises(DamagedLogError) as info:
        open_log(tmp_path, segment_max_bytes=1000)
    assert info.value.damage.first_offset == header.base_offset
    assert info.value.damage.next_good_offset == header.next_offset
    reopened = Log.open(tmp_path, small_config(segment_max_bytes=1000), truncate_damaged=True)
    assert reopened.recovery.cuts == 1 and reopened.end_offset == header.base_offset
    assert len(reopened.recovery.deleted_segments) == len(files) - 1
    await reopened.close()


async def test_other_flush_policies_write_no_zeros(tmp_path: Path) -> None:
    for policy in (FlushPolicy.NEVER, FlushPolicy.INTERVAL):
        directory = tmp_path / policy.value
        log = _open(directory, flush_policy=policy)
        for i in range(5):
            await log.append(make_batch(3, size=100, tag=str(i)), 1)
        await _fills_done(log)
        assert _file_size(log) == log.segments[-1].size
        await log.close()
    log = _open(tmp_path / "off", preallocate_bytes=0)
    await log.append(make_batch(3, size=100), 1)
    assert _file_size(log) == log.segments[-1].size
    await log.close()


@pytest.mark.parametrize("wait_for_fill", [False, True])
async def test_truncation_stops_the_fill_and_later_appends_are_never_overwritten(
    tmp_path: Path, wait_for_fill: bool
) -> None:
    log = _open(tmp_path, preallocate_bytes=4 * 1024 * KiB, segment_max_bytes=8 * 1024 * KiB)
    for round_ in range(5):
        for i in range(4):
            await log.append(make_batch(3, size=500, tag=f"{round_}-{i}"), 1)
        if wait_for_fill:
            await _fills_done(log)
        await log.truncate_to(log.end_offset - 6)  # while a 4 MiB fill is likely still running
        assert _file_size(log) >= log.segments[-1].size
    for i in range(4):
        await log.append(make_batch(3, size=500, tag=f"last-{i}"), 1)
    content = read_everything(log)
    await _fills_done(log)
    assert read_everything(log) == content
    assert set(_tail(log)) <= {0}
    await log.close()
    reopened = _open(tmp_path, preallocate_bytes=4 * 1024 * KiB, segment_max_bytes=8 * 1024 * KiB)
    assert reopened.recovery.clean_shutdown and read_everything(reopened) == content
    await reopened.close()


def test_a_fill_and_appends_racing_past_it_never_write_the_same_bytes(tmp_path: Path) -> None:
    """The locking protocol alone, with a real file and a real thread: appends start exactly at the end of what
    is allocated (the worst case) while the fill runs, and each must survive the fill."""
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for attempt in range(20):
            os.ftruncate(fd, 0)
            reserve = Preallocation(0)
            reserve.start()
            target = 16 * PIECE_BYTES
            filler = threading.Thread(target=reserve.fill, args=(fd, target))
            filler.start()
            appended: list[tuple[int, bytes]] = []
            size = 0
            while filler.is_alive() and len(appended) < 200:
                data = os.urandom(100 + attempt) + bytes([1])
                end = size + len(data)
                if reserve.write_beyond(end):
                    with reserve.lock:
                        os.pwrite(fd, data, size)
                        reserve.wrote(end)
                else:
                    os.pwrite(fd, data, size)
                    reserve.wrote(end)
                appended.append((size, data))
                size = end
            filler.join(10)
            assert not filler.is_alive() and not reserve.running
            for position, data in appended:
                assert os.pread(fd, len(data), position) == data
            file_size = os.fstat(fd).st_size
            assert file_size >= size
            assert os.pread(fd, file_size - size, size) == bytes(file_size - size)
    finally:
        os.close(fd)


def test_a_stopped_fill_writes_nothing_more(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        reserve = Preallocation(0)
        reserve.start()
        reserve.stop(0)
        reserve.fill(fd, 8 * PIECE_BYTES)
        assert os.fstat(fd).st_size == 0 and not reserve.running
        assert reserve.wanted(0, RESERVE, 1024 * KiB) == PIECE_BYTES  # the room grows with the segment
        reserve.wrote(RESERVE - 100)
        assert reserve.wanted(RESERVE - 100, RESERVE, 1024 * KiB) == 2 * RESERVE - 200  # no room left after it
        reserve.wrote(4 * RESERVE)
        assert reserve.wanted(4 * RESERVE, RESERVE, 8 * RESERVE) == 5 * RESERVE  # at most the reserve
        assert reserve.wanted(100, RESERVE, 1024 * KiB) == 0  # plenty of room
        assert reserve.wanted(100, RESERVE, 50) == 0  # the segment cannot grow further
    finally:
        os.close(fd)


async def test_a_log_streamed_into_fills_no_zeros_until_it_slows_down(tmp_path: Path) -> None:
    clock = ManualClock()
    log = _open(tmp_path, clock, measured=False, segment_max_bytes=64 * 1024 * KiB, preallocate_bytes=1024 * KiB)
    batch = make_batch(8, size=1000)  # about 8 KiB
    for _ in range(600):  # 8 KiB every 1/300 of a window: about 48 MB/s, streaming
        await log.append(batch, 1)
        clock.advance(ns=RATE_WINDOW_NS // 300)
        await _fills_done(log)
    active = log._segments[-1]
    assert _file_size(log) == active.size  # no fill, not even before the first window ended
    for _ in range(3):  # then a few appends a second: fills again
        clock.advance(0.5)
        await log.append(batch, 1)
    await _fills_done(log)
    assert active.size + 1000 * KiB < _file_size(log) <= active.size + 1024 * KiB
    await log.close()


def test_append_rate_is_measured_per_window() -> None:
    rate = AppendRate()
    assert rate.streaming  # until a window says otherwise
    per_window = MAX_FILL_RATE * RATE_WINDOW_NS // 1_000_000_000
    rate.add(per_window // 2, 0)
    rate.add(per_window // 2, RATE_WINDOW_NS)
    assert not rate.streaming  # exactly the limit: not above it
    rate.add(per_window // 2, RATE_WINDOW_NS + 1)
    assert not rate.streaming  # the window is not over yet
    rate.add(per_window // 2 + 2, 2 * RATE_WINDOW_NS)
    assert rate.streaming  # just above the limit over the whole window


# -- announcing a write to an observer (a leader's followers) before it lands in the room -----------------------


class _Heard:
    """A write observer told before the write, as a leader's is: it records (first offset, end offset, the
    log's end meanwhile, the bytes)."""

    before_write = True

    def __init__(self, log: Log) -> None:
        self.log = log
        self.heard: list[tuple[int, int, int, bytes]] = []

    def on_write(self, first: int, end: int, parts: object) -> None:
        assert isinstance(parts, list)
        self.heard.append((first, end, self.log.end_offset, b"".join(bytes(part) for part in parts)))


def _listen(log: Log) -> list[tuple[int, int, int, bytes]]:
    """Record what an observer told before the write hears."""
    observer = _Heard(log)
    log.add_write_observer(observer)
    return observer.heard


def _failing_write(*_args: object) -> None:
    raise OSError(errno.EIO, "Input/output error")


async def test_a_write_into_the_room_is_announced_just_before_it_reaches_the_file(tmp_path: Path) -> None:
    log = _open(tmp_path)
    heard = _listen(log)
    await log.append(make_batch(2, size=100, tag="grows"), 1)  # no room yet: it grows the file
    await _fills_done(log)
    await log.append(make_batch(3, size=100, tag="room"), 1)
    grew, overwrote = heard
    assert grew[:3] == (0, 2, 2)  # heard after the write: the log end had moved
    assert overwrote[:3] == (2, 5, 2)  # heard before it: the log still ended at 2
    assert grew[3] + overwrote[3] == read_everything(log)  # what they heard is byte for byte what was stored
    await log.close()


async def test_a_write_that_fails_after_its_announcement_poisons_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _open(tmp_path)
    await log.append(make_batch(2, size=100, tag="kept"), 1)
    await _fills_done(log)
    kept = read_everything(log)
    heard = _listen(log)
    monkeypatch.setattr(segment_module, "write_at", _failing_write)
    with pytest.raises(OSError, match="Input/output error"):
        await log.append(make_batch(3, size=100, tag="lost"), 1)
    monkeypatch.undo()
    assert [h[:2] for h in heard] == [(2, 5)]  # a follower may hold offsets 2-4 now...
    with pytest.raises(FlushFailedError):  # ...so they are never given to other batches
        await log.append(make_batch(1, size=100, tag="other"), 1)
    assert log.end_offset == 2
    with pytest.raises(FlushFailedError):
        await log.close()
    reopened = _open(tmp_path)
    assert read_everything(reopened) == kept
    assert (await reopened.append(make_batch(1, size=100, tag="after"), 1)).base_offset == 2
    await reopened.close()


async def test_a_write_that_grows_the_file_is_announced_only_once_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _open(tmp_path, measured=False)  # a log assumed streamed into: no room is filled
    heard = _listen(log)
    monkeypatch.setattr(segment_module, "write_at", _failing_write)
    with pytest.raises(OSError, match="Input/output error"):
        await log.append(make_batch(2, size=100, tag="refused"), 1)
    monkeypatch.undo()
    assert heard == []  # nobody heard of it: its offsets are still free, and the log goes on
    assert (await log.append(make_batch(2, size=100, tag="next"), 1)).base_offset == 0
    assert [h[:3] for h in heard] == [(0, 2, 2)]
    await log.close()
