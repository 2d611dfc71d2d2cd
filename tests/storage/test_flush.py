"""Flush policies and group commit: who waits for which fsync, and where fsync runs."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from tidelog.clock import ManualClock, SystemClock
from tidelog.storage.config import FlushPolicy
from tidelog.storage.flush import Flusher, FlushFailedError
from tidelog.storage.log import Log
from tidelog.storage.recovery import MARKER_FILE

from .logutil import make_batch, small_config


class FakeTarget:
    """A syncable that records its fsyncs; optionally blocks in the first one until ``gate`` opens."""

    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.gate = gate
        self.fail = fail
        self.started = threading.Event()
        self.synced = threading.Event()
        self.syncs = 0
        self.threads: set[int] = set()
        self.pins = 0

    def sync(self) -> None:
        self.threads.add(threading.get_ident())
        self.started.set()
        if self.gate is not None:
            self.gate.wait(timeout=10)
        if self.fail:
            raise OSError(5, "Input/output error")
        self.syncs += 1
        self.synced.set()

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
    first = asyncio.ensure_future(flusher.wait_durable(flusher.note_write(target)))
    assert await asyncio.to_thread(target.started.wait, 10)  # round 1 is in its fsync
    later = [asyncio.ensure_future(flusher.wait_durable(flusher.note_write(target))) for _ in range(10)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in later)  # round 1 cannot cover writes made while it ran
    gate.set()
    await asyncio.gather(first, *later)
    assert flusher.fsync_rounds == 2 and target.syncs == 2
    assert flusher.durable == flusher.written == 11
    assert target.pins == 0


async def test_fsync_never_runs_on_the_event_loop_thread() -> None:
    target = FakeTarget()
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    await flusher.after_write(flusher.note_write(target))
    assert target.syncs == 1 and threading.get_ident() not in target.threads


async def test_a_failed_fsync_fails_waiters_and_stays_failed() -> None:
    target = FakeTarget(fail=True)
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    with pytest.raises(FlushFailedError):
        await flusher.after_write(flusher.note_write(target))
    with pytest.raises(FlushFailedError):
        flusher.check()
    with pytest.raises(FlushFailedError):
        await flusher.flush()


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
    assert log.flusher.fsync_rounds <= 2  # all 50 are written before the first round starts
    assert log.flusher.durable == log.flusher.written
    for _ in range(3):  # one appender at a time: one fsync each
        await log.append(make_batch(1), 1)
    assert log.flusher.fsync_rounds <= 5
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
