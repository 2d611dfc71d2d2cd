"""The bound on open segment files: idle segments release their descriptors and reopen on demand, losing nothing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.storage.config import FlushPolicy
from tidelog.storage.log import Log
from tidelog.storage.open_files import OPEN_FILES

from .logutil import make_batch, read_everything, small_config

LIMIT = 6
SLACK = 1
"""Segment files open beyond the limit while appending to and reading every log: the one segment a read or an
append has just opened (it is never the one closed to make room)."""


@pytest.fixture
def bound() -> Iterator[int]:
    before = OPEN_FILES.limit
    OPEN_FILES.set_limit(LIMIT)
    yield LIMIT
    OPEN_FILES.set_limit(before)


def open_segment_files(root: Path) -> int:
    """Descriptors of this process open on ``.log`` files under ``root`` (the kernel's count, not the cache's)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith(".log"):
            count += 1
    return count


async def test_more_logs_than_the_bound_stay_within_it_and_every_record_reads_back(tmp_path: Path, bound: int) -> None:
    config = small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=1024, preallocate_bytes=0)
    logs = [await Log.open_async(tmp_path / str(i), config) for i in range(4 * bound)]
    assert open_segment_files(tmp_path) <= bound + SLACK
    for turn in range(12):  # enough to roll every log: sealed segments too
        for i, log in enumerate(logs):
            await log.append(make_batch(2, size=60, tag=f"{i}.{turn}"), 0)
            assert open_segment_files(tmp_path) <= bound + SLACK
    assert all(len(log.segments) > 1 for log in logs)
    assert OPEN_FILES.released
    for i, log in enumerate(logs):
        data = read_everything(log)  # every CRC checked on the way (reads verify what they have not seen)
        for turn in range(12):
            assert f"{i}.{turn}-0-".encode() in data, f"log {i} lost its batch {turn}"
        assert open_segment_files(tmp_path) <= bound + SLACK
    for log in logs:
        await log.close()
    assert open_segment_files(tmp_path) == 0


async def test_a_segment_with_unsynced_appends_keeps_its_descriptor_until_flushed(tmp_path: Path, bound: int) -> None:
    """Under flush policy never an append is not fsynced: its segment is not released (a write-back error must
    reach the fsync that makes it durable) until the log is flushed."""
    dirty = await Log.open_async(tmp_path / "dirty", small_config(flush_policy=FlushPolicy.NEVER))
    await dirty.append(make_batch(1), 0)
    others = [await Log.open_async(tmp_path / str(i), small_config()) for i in range(2 * bound)]
    assert not dirty._segments[-1].releasable()
    assert open_segment_files(tmp_path / "dirty") == 1
    await dirty.flush()
    for log in others:  # each read touches its segment: the flushed one is now the least recently used
        log.read(0, 100)
    await (await Log.open_async(tmp_path / "last", small_config())).close()
    assert open_segment_files(tmp_path / "dirty") == 0
    assert b"v-0-" in read_everything(dirty)
    for log in [dirty, *others]:
        await log.close()


async def test_a_released_segment_reopened_after_crash_recovery_still_verifies(tmp_path: Path, bound: int) -> None:
    config = small_config(flush_policy=FlushPolicy.ALWAYS, segment_max_bytes=512)
    live = await Log.open_async(tmp_path / "live", config)
    for turn in range(10):
        await live.append(make_batch(3, size=50, tag=f"t{turn}"), 0)
    crashed = tmp_path / "crashed"
    shutil.copytree(live.directory, crashed)  # the disk as a crash leaves it: no clean-shutdown marker
    await live.close()
    with max(crashed.glob("*.log")).open("ab") as tail:  # and a torn tail
        tail.write(b"\x17" * 7)

    log = await Log.open_async(crashed, config)
    assert not log.recovery.clean_shutdown and len(log.segments) > 2
    others = [await Log.open_async(tmp_path / str(i), small_config()) for i in range(2 * bound)]
    assert open_segment_files(crashed) == 0, "the recovered log's idle segments kept their descriptors"
    data = read_everything(log)
    for turn in range(10):
        assert f"t{turn}-2-".encode() in data
    assert log.end_offset == 30
    for each in [log, *others]:
        await each.close()
    reopened = Log.open(crashed, config)
    assert reopened.recovery.clean_shutdown and reopened.end_offset == 30
    await reopened.close()
