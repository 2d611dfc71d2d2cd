"""fsync through io_uring: real rings, real files; and the flusher's rounds going through them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tidelog.clock import SystemClock
from tidelog.storage import uring
from tidelog.storage.config import FlushPolicy
from tidelog.storage.flush import Flusher, FlushFailedError
from tidelog.storage.log import Log

from .logutil import make_batch, read_everything, small_config


def _ring() -> uring.FsyncRing:
    ring = uring.ring_for(asyncio.get_running_loop())
    if ring is None:
        pytest.skip(f"io_uring unavailable here: {uring._unavailable}")
    return ring


async def _fdatasync(ring: uring.FsyncRing, fds: list[int]) -> OSError | None:
    done: asyncio.Future[OSError | None] = asyncio.get_running_loop().create_future()
    assert ring.fdatasync(fds, done.set_result)
    return await asyncio.wait_for(done, 10)


async def test_a_group_completes_once_every_descriptor_is_synced(tmp_path: Path) -> None:
    ring = _ring()
    fds = [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT, 0o644) for i in range(3)]
    try:
        for round_ in range(50):
            for fd in fds:
                os.pwrite(fd, b"x" * 100, round_ * 100)
            assert await _fdatasync(ring, fds) is None
        assert ring.in_flight == 0
    finally:
        for fd in fds:
            os.close(fd)


async def test_an_error_on_any_descriptor_is_the_group_s_error(tmp_path: Path) -> None:
    ring = _ring()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    closed = os.open(tmp_path / "g", os.O_RDWR | os.O_CREAT, 0o644)
    os.close(closed)
    try:
        error = await _fdatasync(ring, [fd, closed])
        assert isinstance(error, OSError) and error.errno == 9  # EBADF
        assert await _fdatasync(ring, [fd]) is None  # the ring goes on
    finally:
        os.close(fd)


async def test_more_requests_than_the_queue_holds_are_refused_not_lost(tmp_path: Path) -> None:
    ring = _ring()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert not ring.fdatasync([fd] * (uring.ENTRIES + 1), lambda error: None)
        assert ring.in_flight == 0
        assert await _fdatasync(ring, [fd] * uring.ENTRIES) is None
    finally:
        os.close(fd)


async def test_log_rounds_that_do_not_run_inline_go_through_the_ring(tmp_path: Path) -> None:
    _ring()
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=10**6))
    log.flusher.allow_inline = False  # as on a replicated leader: every round on the ring
    for wave in range(5):
        await asyncio.gather(*(log.append(make_batch(2, tag=f"{wave}-{i}"), 1) for i in range(20)))
    assert log.flusher.ring_rounds >= 5 and log.flusher.inline_rounds == 0
    assert log.flusher.durable == log.flusher.written
    content = read_everything(log)
    await log.close()
    reopened = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=10**6))
    assert reopened.recovery.clean_shutdown and read_everything(reopened) == content
    await reopened.close()


class _ClosedDescriptor:
    """A flush target whose descriptor is no longer open: its ring fsync fails with EBADF."""

    sync_fd = 10**6

    def sync(self) -> None:
        raise AssertionError("synced on a thread: expected the ring")

    def pin(self) -> None:
        pass

    def unpin(self) -> None:
        pass


async def test_a_failed_ring_fsync_fails_the_waiters_and_the_flusher_stays_failed() -> None:
    _ring()
    flusher = Flusher(FlushPolicy.ALWAYS, 1000, SystemClock())
    flusher.allow_inline = False
    with pytest.raises(FlushFailedError, match="Bad file descriptor"):
        await flusher.after_write(flusher.note_write(_ClosedDescriptor(), 100))
    assert flusher.ring_rounds == 1
    with pytest.raises(FlushFailedError):
        flusher.check()


async def test_turned_off_rounds_go_to_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uring, "_enabled", True)  # restored after the test, whatever set_enabled does here
    uring.set_enabled(False)
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS))
    log.flusher.allow_inline = False
    await asyncio.gather(*(log.append(make_batch(1), 1) for _ in range(5)))
    assert log.flusher.ring_rounds == 0 and log.flusher.fsync_rounds >= 1
    await log.close()


async def test_a_flusher_told_not_to_use_the_ring_syncs_on_threads(tmp_path: Path) -> None:
    _ring()  # available: the flusher's own setting is what keeps its rounds off it
    log = Log.open(tmp_path, small_config(flush_policy=FlushPolicy.ALWAYS))
    log.flusher.allow_inline = log.flusher.use_ring = False  # as on a replicated partition's leader
    await asyncio.gather(*(log.append(make_batch(1), 1) for _ in range(5)))
    assert log.flusher.ring_rounds == 0 and log.flusher.fsync_rounds >= 1
    assert log.flusher.durable == log.flusher.written
    await log.close()
