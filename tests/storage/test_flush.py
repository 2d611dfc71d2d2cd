"""Flush policies and group commit: who waits for which fsync, and where fsync runs."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from tidelog.clock import ManualClock, SystemClock
from tidelog.storage.config import FlushPolicy
from tidelog.storage.flush import INLINE_MAX_BYTES, Flusher, FlushFailedError, FlushShares, RoundState
from tidelog.storage.log import Log
from tidelog.storage.recovery import MARKER_FILE

from .logutil import make_batch, small_config

BIG = INLINE_MAX_BYTES + 1
"""A write this large is never synced inline: tests that block a round in its fsync use it (an inline fsync
would block the event loop itself)."""


class FakeTarget:
    """A syncable that records its fsyncs (and the threads they ran on); optionally blocks in the first one
    until ``gate`` opens, fails, or takes ``took`` seconds of ``clock`` time each (a slow disk, deterministically).
    """

    def __init__(
        self,
        gate: threading.Event | None = None,
        fail: bool = False,
        clock: ManualClock | None = None,
        took: list[float] | None = None,
    ) -> None:
        self.gate = gate
        self.fail = fail
        self.clock = clock
        self.took = took if took is not None else []
        self.started = threading.Event()
        self.synced = threading.Event()
        self.syncs = 0
        self.threads: list[int] = []
        self.pins = 0

    def sync(self) -> None:
        self.threads.append(threading.get_ident())
        self.started.set()
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.fail:
            raise OSError(5, "Input/output error")
        if self.clock is not None and self.took:
            self.clock.advance(self.took.pop(0))
        self.syncs += 1
        self.synced.set()

    @property
    def inline(self) -> list[bool]:
        """For each fsync so far: did it run on this (the event loop's) thread?"""
        here = threading.get_ident()
        return [thread == here for thread in self.threads]

    def pin(self) -> None:
        self.pins += 1

    def unpin(self) -> None:
        self.pins -= 1


async def _until(condition: object, turns: int = 1000) -> None:
    """Let the loop run until ``condition()`` holds (bounded)."""
    for _ in range(turns):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def test_appenders_arriving_during_an_fsync_share_the_next_one() -> None:
    gate = threading.Event()
    target = FakeTarget(gate)
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    first = asyncio.ensure_future(flusher.wait_durable(flusher.note_write(target, BIG)))
    assert await asyncio.to_thread(target.started.wait, 10)  # round 1 is in its fsync
    later = [asyncio.ensure_future(flusher.wait_durable(flusher.note_write(target))) for _ in range(10)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in later)  # round 1 cannot cover writes made while it ran
    gate.set()
    await asyncio.gather(first, *later)
    assert flusher.fsync_rounds == 2 and target.syncs == 2
    assert target.inline == [False, False]  # a round in flight: the next one goes to the worker too
    assert flusher.durable == flusher.written == 11
    assert target.pins == 0
    assert flusher.state is RoundState.IDLE


async def test_a_lone_append_is_synced_inline_before_its_wait_returns() -> None:
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    seq = flusher.note_write(target, 1024)
    await flusher.after_write(seq)
    assert target.syncs == 1 and target.inline == [True]
    assert flusher.durable == seq and flusher.inline_rounds == flusher.fsync_rounds == 1
    assert target.pins == 0 and flusher.state is RoundState.IDLE


async def test_a_large_unsynced_write_goes_to_the_worker() -> None:
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    await flusher.after_write(flusher.note_write(target, BIG))
    assert target.inline == [False] and flusher.inline_rounds == 0 and flusher.durable == 1


async def test_a_burst_in_one_loop_turn_shares_one_worker_round() -> None:
    """The first append of the turn syncs inline; the rest of the turn's appends share one worker round."""
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())

    async def append() -> None:
        await flusher.after_write(flusher.note_write(target, 100))

    await asyncio.gather(*(append() for _ in range(20)))
    assert target.inline == [True, False]
    assert flusher.fsync_rounds == 2 and flusher.durable == 20


async def test_a_slow_fsync_sends_the_next_rounds_to_the_worker_until_fsyncs_are_fast_again() -> None:
    clock = ManualClock()
    target = FakeTarget(clock=clock, took=[0.050])  # the first fsync stalls 50 ms, the others take no time
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, clock, cpu_ns=lambda: 0)  # an otherwise idle loop
    for _ in range(12):
        await flusher.after_write(flusher.note_write(target, 100))
        await asyncio.sleep(0)  # the next append comes in a later turn of the loop, as a client's would
    assert target.syncs == 12 and flusher.durable == 12
    # 50 ms weighs 6.25 ms in the moving average; each fast worker round takes it down by 1/8, and under
    # 2 ms after ten of them the flusher goes back to syncing inline.
    assert target.inline == [True] + [False] * 9 + [True, True]


async def test_a_busy_loop_keeps_fsyncs_on_the_worker() -> None:
    """Inline only while the loop's thread was mostly idle since the last look, and never while a worker round
    of any log on the loop is in flight."""
    clock = ManualClock()
    cpu = [0]  # the loop thread's CPU time, as the test says it went
    shares = FlushShares()  # the logs of one broker

    def flusher() -> Flusher:
        return Flusher(FlushPolicy.ALWAYS, 1000, clock, shares=shares, cpu_ns=lambda: cpu[0])

    def busy(wall_ms: float, cpu_ms: float) -> None:
        clock.advance(wall_ms / 1000)
        cpu[0] += int(cpu_ms * 1_000_000)

    a, b = FakeTarget(), FakeTarget()
    fa, fb = flusher(), flusher()
    await fa.after_write(fa.note_write(a, 100))
    await asyncio.sleep(0)
    busy(1, 0.2)  # 20 % busy: another log's lone append syncs inline too
    await fb.after_write(fb.note_write(b, 100))
    await asyncio.sleep(0)
    busy(1, 0.9)  # 90 % busy
    await fa.after_write(fa.note_write(a, 100))
    await asyncio.sleep(0)
    busy(1, 0.5)
    await fa.after_write(fa.note_write(a, 100))
    assert a.inline == [True, False, True] and b.inline == [True]

    gate = threading.Event()
    blocked = FakeTarget(gate)
    fc = flusher()
    slow_round = asyncio.ensure_future(fc.after_write(fc.note_write(blocked, BIG)))
    assert await asyncio.to_thread(blocked.started.wait, 10)  # a worker round of another log is in flight
    await asyncio.sleep(0)
    busy(10, 0)
    await fb.after_write(fb.note_write(b, 100))
    assert b.inline == [True, False]
    gate.set()
    await slow_round
    await asyncio.sleep(0)
    busy(10, 0)
    await fb.after_write(fb.note_write(b, 100))
    assert b.inline == [True, False, True]


@pytest.mark.parametrize("size", [100, BIG], ids=["inline", "worker"])
async def test_a_failed_fsync_fails_waiters_and_stays_failed(size: int) -> None:
    target = FakeTarget(fail=True)
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    with pytest.raises(FlushFailedError):
        await flusher.after_write(flusher.note_write(target, size))
    with pytest.raises(FlushFailedError):
        flusher.check()
    with pytest.raises(FlushFailedError):
        await flusher.flush()


@pytest.mark.parametrize("size", [100, BIG], ids=["inline", "worker"])
async def test_on_durable_runs_once_the_fsync_returned_and_before_the_waiter_resumes(size: int) -> None:
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    order: list[str] = []

    def on_durable() -> None:
        order.append(f"durable: {target.syncs} fsync, durable {flusher.durable}")

    await flusher.after_write(flusher.note_write(target, size), on_durable)
    order.append("returned")
    assert order == ["durable: 1 fsync, durable 1", "returned"]


@pytest.mark.parametrize("size", [100, BIG], ids=["inline", "worker"])
async def test_on_durable_never_runs_when_the_fsync_fails(size: int) -> None:
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    called: list[int] = []
    with pytest.raises(FlushFailedError):
        await flusher.after_write(flusher.note_write(FakeTarget(fail=True), size), lambda: called.append(1))
    assert called == []


async def test_on_durable_runs_at_once_when_nothing_needs_an_fsync() -> None:
    flusher = Flusher(FlushPolicy.NEVER, 1000, SystemClock())
    called: list[int] = []
    await flusher.after_write(flusher.note_write(FakeTarget(), 100), lambda: called.append(1))
    assert called == [1]


async def test_a_failing_on_durable_neither_fails_the_append_nor_stops_the_round() -> None:
    gate = threading.Event()
    target = FakeTarget(gate)
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())

    def broken() -> None:
        raise RuntimeError("bug in a callback")

    first = asyncio.ensure_future(flusher.after_write(flusher.note_write(target, BIG), broken))
    second = asyncio.ensure_future(flusher.after_write(flusher.note_write(target, BIG)))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert flusher.durable == 2 and flusher.failed is None


async def test_on_durable_is_skipped_for_a_waiter_that_was_cancelled() -> None:
    gate = threading.Event()
    target = FakeTarget(gate)
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    called: list[int] = []
    waiter = asyncio.ensure_future(flusher.after_write(flusher.note_write(target, BIG), lambda: called.append(1)))
    assert await asyncio.to_thread(target.started.wait, 10)
    waiter.cancel()
    gate.set()
    await flusher.flush()
    assert called == [] and flusher.durable == 1


async def test_interval_policy_flushes_on_the_clock() -> None:
    clock = ManualClock()
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.INTERVAL, 200, clock)
    seq = flusher.note_write(target)
    await flusher.after_write(seq)  # does not wait for an fsync
    await _until(lambda: clock.sleepers == 1)
    assert target.syncs == 0
    clock.advance(0.199)
    await asyncio.sleep(0)
    assert target.syncs == 0
    clock.advance(0.001)
    assert await asyncio.to_thread(target.synced.wait, 10)
    await _until(lambda: flusher.durable == seq)
    await flusher.close()
    assert clock.sleepers == 0


async def test_never_policy_does_not_fsync_until_asked() -> None:
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.NEVER, 200, SystemClock())
    await flusher.after_write(flusher.note_write(target))
    assert target.syncs == 0
    await flusher.flush()
    assert target.syncs == 1
    await flusher.close()


async def test_concurrent_log_appends_share_fsyncs(tmp_path: Path) -> None:
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=10**6))
    results = await asyncio.gather(*(log.append(make_batch(2, tag=str(i)), 1) for i in range(50)))
    assert len(results) == 50
    # The first syncs inline (nobody else waits yet); the other 49, appended in the same turn, share one round.
    assert log.flusher.fsync_rounds == 2 and log.flusher.inline_rounds == 1
    assert log.flusher.durable == log.flusher.written
    for _ in range(3):  # one appender at a time: one fsync each
        await log.append(make_batch(1), 1)
    assert log.flusher.fsync_rounds == 5
    await log.close()


async def test_appenders_woken_together_share_their_next_round(tmp_path: Path) -> None:
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=10**6))

    async def appender(i: int) -> None:
        for n in range(5):
            await log.append(make_batch(1, tag=f"{i}-{n}"), 1)

    await asyncio.gather(*(appender(i) for i in range(16)))
    # Round 1 (inline) and 2 (the rest of the first turn) cover the first appends; after that each round wakes
    # all 16 appenders at once, and their next appends share one round: about one round per wave, never one
    # per append.
    assert log.flusher.written == 80 and log.flusher.durable == 80
    assert log.flusher.inline_rounds == 1 and log.flusher.fsync_rounds <= 7
    await log.close()


async def test_a_lone_log_append_is_on_disk_and_fsynced_when_append_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No zero fill: its own fdatasyncs would be counted, and the file would be longer than the log's bytes.
    config = small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=10**6, preallocate_bytes=0)
    log = Log.open(tmp_path, config)
    await log.append(make_batch(2), 1)
    synced: list[tuple[tuple[int, int], int]] = []  # (file identity, its size when synced)
    real = os.fdatasync

    def spy(fd: int) -> None:
        real(fd)
        stat = os.fstat(fd)
        synced.append(((stat.st_dev, stat.st_ino), stat.st_size))

    monkeypatch.setattr(os, "fdatasync", spy)
    active = os.stat(log.segments[-1].path)
    for n in range(6):  # inline or on the worker, as the loop's load has it: the same guarantee
        if n % 2:
            await asyncio.sleep(0)
        await log.append(make_batch(3, tag=str(n)), 1)
        assert len(synced) == n + 1  # one fsync per lone append, made before append returned...
        assert synced[-1] == ((active.st_dev, active.st_ino), log.size_bytes)  # ...after its bytes were written
    await log.close()


async def test_log_with_never_policy_flushes_on_request_and_close(tmp_path: Path) -> None:
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.NEVER))
    await log.append(make_batch(2), 1)
    assert log.flusher.fsync_rounds == 0
    await log.flush()
    assert log.flusher.fsync_rounds == 1
    await log.append(make_batch(2), 1)
    await log.close()
    assert log.flusher.durable == log.flusher.written


async def test_log_interval_policy_with_manual_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.INTERVAL, flush_interval_ms=50), clock=clock)
    await log.append(make_batch(2), 1)
    await _until(lambda: clock.sleepers == 1)
    assert log.flusher.durable == 0
    clock.advance(0.05)
    for _ in range(100):  # the fsync runs in a worker thread: give it real time, bounded
        if log.flusher.durable == log.flusher.written:
            break
        await asyncio.sleep(0.01)
    assert log.flusher.durable == log.flusher.written
    await log.close()


async def test_fsync_failure_poisons_the_log_and_skips_the_clean_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS))
    await log.append(make_batch(2), 1)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(FlushFailedError):
        await log.append(make_batch(2), 1)
    with pytest.raises(FlushFailedError):
        await log.append(make_batch(2), 1)
    with pytest.raises(FlushFailedError):
        await log.close()
    monkeypatch.undo()
    assert not (tmp_path / MARKER_FILE).exists()
    reopened = Log.open(tmp_path, small_config())
    assert not reopened.recovery.clean_shutdown and reopened.recovery.scanned == [0]
    await reopened.close()


async def test_the_durable_end_stays_at_the_last_fsync_that_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a replica whose disk failed keeps when it reopens (broker.partitions.failed_logs): the log end at its
    last good fsync, not what the failed one left in the file (and the page cache)."""
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS))
    await log.append(make_batch(2), 1)
    await log.append(make_batch(2), 1)
    assert log.durable_end == log.end_offset == 4
    await log.truncate_to(2)
    assert log.durable_end == 2  # nothing at or above a cut is known durable, even before its fsync

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    await log.append(make_batch(3), 1)
    assert log.durable_end == 5
    monkeypatch.setattr(os, "fdatasync", broken)
    with pytest.raises(FlushFailedError):
        await log.append(make_batch(2), 1)
    assert log.end_offset == 7 and log.durable_end == 5  # written, readable, never made durable
    with pytest.raises(FlushFailedError):
        await log.close()


async def test_a_thousand_logs_appending_at_once_are_all_acknowledged(tmp_path: Path) -> None:
    """Flush-always appends to 1,000 single-replica logs at once: every one is acknowledged (the io_uring path this
    replaced left all but ~128 waiting forever once its completion queue overflowed)."""
    count = 1000
    config = small_config(flush_policy=FlushPolicy.ALWAYS)
    shares = FlushShares()  # as a broker's logs are opened
    logs = [Log.open(tmp_path / f"p{i}", config, flush_shares=shares) for i in range(count)]
    try:
        batch = make_batch(1)
        for _ in range(2):  # the second wave finds every flusher warmed up, most rounds on the worker threads
            appended = asyncio.gather(*(log.append(batch, 0) for log in logs))
            async with asyncio.timeout(60):  # a bound for a hang, not a speed target
                results = await appended
            assert len(results) == count
        assert all(log.end_offset == 2 and log.flusher.durable == log.flusher.written for log in logs)
    finally:
        async with asyncio.timeout(60):  # a close flushes: on a hung flusher it would hang too
            for log in logs:
                await log.close()
