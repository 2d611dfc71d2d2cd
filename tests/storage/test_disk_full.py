"""A full disk refuses writes and never takes the log down: a real tmpfs, filled to the last page."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.storage.config import FlushPolicy
from tidelog.storage.errors import DiskFullError
from tidelog.storage.log import Log
from tidelog.testing.small_disk import Ballast, mount_small_disk

from .logutil import make_batch, read_everything, small_config

SEGMENT_BYTES = 16 * 1024


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    try:
        with mount_small_disk(tmp_path / "disk", 1024 * 1024) as mounted:
            yield mounted
    except OSError as exc:
        pytest.skip(str(exc))


def _config(**overrides: object) -> dict[str, object]:
    settings: dict[str, object] = {
        "segment_max_bytes": SEGMENT_BYTES,
        "flush_policy": FlushPolicy.ALWAYS,
        "preallocate_bytes": 0,
    }
    settings.update(overrides)
    return settings


async def _fill_segment(log: Log, size: int) -> list[bytes]:
    """Append batches of ``size`` record bytes until one more would roll the active segment."""
    batches = []
    while log.segments[-1].size + len(make_batch(1, size=size)) <= SEGMENT_BYTES:
        batch = make_batch(1, size=size, tag=f"b{len(batches)}")
        await log.append(batch, 0)
        batches.append(batch)
    return batches


async def test_a_write_that_rolls_onto_a_full_disk_is_refused_and_the_next_one_succeeds(disk: Path) -> None:
    ballast = Ballast(disk / "ballast")
    log = Log.open(disk / "log", small_config(**_config()))
    await _fill_segment(log, 1000)
    before = read_everything(log)
    end, segments = log.end_offset, len(log.segments)
    ballast.fill()
    two = make_batch(1, size=1000, tag="x") + make_batch(1, size=1000, tag="y")  # the first may land, then a roll
    with pytest.raises(DiskFullError, match=r"the disk is full.*writes resume once space is freed"):
        await log.append(two, 0)
    assert (log.end_offset, len(log.segments)) == (end, segments)  # undone whole: nothing of it is kept
    assert read_everything(log) == before
    with pytest.raises(DiskFullError):  # still full: still refused, still healthy
        await log.append(make_batch(1, size=1000), 0)
    ballast.free()
    result = await log.append(two, 0)  # no reopen
    assert (result.base_offset, result.last_offset) == (end, end + 1)
    await log.close()
    reopened = Log.open(disk / "log", small_config(**_config()))
    assert reopened.end_offset == end + 2
    assert read_everything(reopened, chunk=10**6).startswith(before)
    await reopened.close()


async def test_a_seal_that_finds_the_disk_full_does_not_poison_the_log(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: the roll's write fits in the last free page, the background seal's index files do not."""
    ballast = Ballast(disk / "ballast")
    log = Log.open(disk / "log", small_config(**_config(index_interval_bytes=256)))
    await _fill_segment(log, 1000)
    acknowledged = log.end_offset
    ballast.fill(keep=4096)
    with caplog.at_level(logging.WARNING):
        await log.append(make_batch(1, size=1000, tag="rolled"), 0)  # rolls; the new segment takes the last page
        await log.delete_segments_before(0)  # deletes nothing; waits for the background seal first
    assert log.flusher.failed is None  # not poisoned: it was, and refused every write until a restart
    assert "the disk is full" in caplog.text
    with pytest.raises(DiskFullError):
        await log.append(make_batch(1, size=3500), 0)  # more than the rest of the new segment's page
    ballast.free()
    await log.append(make_batch(1, size=3500, tag="after"), 0)
    assert log.end_offset == acknowledged + 2
    data = read_everything(log, chunk=10**6)
    await log.close()
    reopened = Log.open(disk / "log", small_config(**_config(index_interval_bytes=256)))
    assert read_everything(reopened, chunk=10**6) == data
    await reopened.close()


async def test_a_write_beyond_preallocated_room_on_a_full_disk_is_undone(disk: Path) -> None:
    """A lone batch growing the file past its zero-filled room hits the full disk mid-write: cut back."""
    ballast = Ballast(disk / "ballast")
    log = Log.open(disk / "log", small_config(**_config(segment_max_bytes=256 * 1024)))
    await log.append(make_batch(1, size=100), 0)
    size = log.segments[-1].size
    ballast.fill(keep=4096)
    big = make_batch(1, size=12_000)  # three pages: the first fits, the rest does not
    with pytest.raises(DiskFullError):
        await log.append(big, 0)
    assert log.segments[-1].size == size and (disk / "log" / log.segments[-1].path.name).stat().st_size == size
    ballast.free()
    await log.append(big, 0)
    assert log.end_offset == 2
    await log.close()


async def test_a_log_closed_on_a_full_disk_closes_and_reopens_with_everything(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ballast = Ballast(disk / "ballast")
    log = Log.open(disk / "log", small_config(**_config(index_interval_bytes=256)))
    await _fill_segment(log, 1000)
    data = read_everything(log, chunk=10**6)
    ballast.fill()
    with caplog.at_level(logging.WARNING):
        await log.close()  # its index files and clean-shutdown marker find no room
    assert log.closed and "without a clean-shutdown marker" in caplog.text
    ballast.free()
    reopened = Log.open(disk / "log", small_config(**_config(index_interval_bytes=256)))
    assert not reopened.recovery.clean_shutdown
    assert read_everything(reopened, chunk=10**6) == data
    await reopened.close()
