"""Installing copied segment files (far-horizon catch-up) and resetting a log: results, refusals, crash safety.

Crashes are simulated by failing one step (an exception injected into the file operation it makes), dropping
the log the way a crash would (:func:`crash`), and reopening: the log must open, hold a prefix of the leader's
batches byte for byte, know the leader epochs of what it holds, and have no staging directory left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.storage.logutil import crash, make_batch, open_log, read_everything
from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError
from tidelog.storage import segment_install
from tidelog.storage.log import Log
from tidelog.storage.segment_install import STAGING_DIR, StagedSegment, staging_directory, verify_staged

EPOCHS = [(1, 6), (2, 5), (4, 7)]  # (leader epoch, batches): ~ 3 segments of 4 KiB at 4 batches each


async def leader_log(path: Path) -> Log:
    """A leader with several sealed segments written in three leader epochs."""
    log = open_log(path)
    n = 0
    for epoch, count in EPOCHS:
        for _ in range(count):
            await log.append(make_batch(3, size=300, tag=f"b{n}"), leader_epoch=epoch)
            n += 1
    await log.roll()
    return log


def stage(leader: Log, follower: Log, *, since: int = 0) -> list[StagedSegment]:
    """Copy the leader's sealed segments holding offsets at or after ``since`` into the follower's staging."""
    staging = staging_directory(follower.directory)
    staging.mkdir(exist_ok=True)
    staged = []
    for info in leader.segments[:-1]:
        if info.next_offset > since:
            target = staging / info.path.name
            shutil.copyfile(info.path, target)
            staged.append(verify_staged(target, info.base_offset))
    return staged


def assert_prefix_of(follower: Log, leader: Log) -> None:
    """The follower holds the leader's batches from its start to its end, byte for byte, and nothing else."""
    start, end = follower.start_offset, follower.end_offset
    assert leader.start_offset <= start or end == start
    mine = read_everything(follower)
    if end > start:
        assert mine == read_everything(leader, start)[: len(mine)]
    assert follower.end_offset <= leader.end_offset
    for entry in follower._epochs.entries:
        assert entry.start_offset < follower.end_offset  # nothing claimed beyond what it holds
        assert leader.end_offset_for_epoch(entry.epoch).epoch == entry.epoch


async def test_a_reset_log_installs_the_leaders_segments_and_matches_it_after_a_reopen(tmp_path: Path) -> None:
    leader = await leader_log(tmp_path / "leader")
    await leader.delete_segments_before(leader.segments[1].base_offset)  # retention: the start moved up
    follower = open_log(tmp_path / "follower")
    await follower.append(make_batch(1, tag="old"), leader_epoch=0)  # ends below the leader's start
    staged = stage(leader, follower)
    await follower.reset_to(staged[0].base_offset)
    assert (follower.start_offset, follower.end_offset, follower.latest_epoch) == (staged[0].base_offset,) * 2 + (-1,)
    await follower.install_segments(staged)
    assert read_everything(follower) == read_everything(leader)
    assert [s.base_offset for s in follower.segments[:-1]] == [s.base_offset for s in leader.segments[:-1]]
    assert follower.segments[-1].base_offset == leader.end_offset and follower.segments[-1].size == 0
    for epoch, _ in EPOCHS:
        assert follower.end_offset_for_epoch(epoch) == leader.end_offset_for_epoch(epoch)
    assert not staging_directory(follower.directory).exists() or not os.listdir(staging_directory(follower.directory))
    await follower.close()
    reopened = open_log(tmp_path / "follower")
    try:
        assert reopened.recovery.clean_shutdown
        assert read_everything(reopened) == read_everything(leader)
        for epoch, _ in EPOCHS:
            assert reopened.end_offset_for_epoch(epoch) == leader.end_offset_for_epoch(epoch)
        await reopened.append(make_batch(1, tag="next"), leader_epoch=5)  # the log takes appends after it
        assert reopened.end_offset == leader.end_offset + 1
    finally:
        await reopened.close()
        await leader.close()


async def test_a_prefix_is_extended_from_a_segment_boundary_and_its_own_tail_is_sealed(tmp_path: Path) -> None:
    leader = await leader_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    first = leader.segments[0]
    await follower.append_as_follower(leader.read(0, 1 << 20, max_offset=first.next_offset))
    assert follower.end_offset == first.next_offset
    await follower.install_segments(stage(leader, follower, since=first.next_offset))
    assert read_everything(follower) == read_everything(leader)
    assert follower.end_offset_for_epoch(1) == leader.end_offset_for_epoch(1)
    await crash(follower)  # no clean shutdown: recovery must accept what install left
    reopened = open_log(tmp_path / "follower")
    assert read_everything(reopened) == read_everything(leader)
    await reopened.close()
    await leader.close()


async def test_overlapping_or_corrupt_files_are_refused_and_change_nothing(tmp_path: Path) -> None:
    leader = await leader_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    await follower.append_as_follower(leader.read(0, 1 << 20, max_offset=3))
    staged = stage(leader, follower)
    with pytest.raises(InvalidBatchError, match="overlaps"):
        await follower.install_segments(staged)  # the first one starts at 0, below our end
    assert follower.end_offset == 3 and len(follower.segments) == 1
    path = staged[1].path
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside the first batch's records: only the CRC can tell
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptBatchError):
        verify_staged(path, staged[1].base_offset)
    with pytest.raises(InvalidBatchError):
        verify_staged(staged[2].path, staged[1].base_offset)  # the name says which base it must have
    await follower.close()
    await leader.close()


async def test_an_older_leader_epoch_than_the_logs_latest_is_refused(tmp_path: Path) -> None:
    leader = await leader_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    staged = stage(leader, follower)
    await follower.reset_to(staged[0].base_offset)
    await follower.append(make_batch(1), leader_epoch=9)  # the follower knows a newer epoch than the files
    await follower.truncate_to(staged[0].base_offset)
    follower._epochs.assign(9, 0)  # a history the files contradict
    with pytest.raises(InvalidBatchError, match="older"):
        await follower.install_segments(staged)
    await follower.close()
    await leader.close()


async def test_a_staging_directory_left_over_is_removed_when_the_log_opens(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    await log.append(make_batch(), leader_epoch=0)
    await log.close()
    staging = tmp_path / "p" / STAGING_DIR
    staging.mkdir()
    (staging / "00000000000000000003.log").write_bytes(b"half a download")
    reopened = open_log(tmp_path / "p")
    assert not staging.exists() and reopened.end_offset == 3
    await reopened.close()


async def drop(log: Log) -> None:
    """:func:`crash`, also for a log a failed step poisoned (it refuses the flush ``crash`` lets finish)."""
    if log.flusher.failed is None:
        await crash(log)
    for segment in log._segments:
        segment.close()


# -- crash safety --------------------------------------------------------------------------------------------------


class Boom(Exception):
    pass


def fail_on_call(n: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``real``, except that its ``n``-th call (from 1) raises :class:`Boom` before doing anything."""
    calls = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == n:
            raise Boom(f"injected failure at call {n} of {real.__name__}")
        return real(*args, **kwargs)

    return wrapper


STEPS = [
    ("replace", 1),
    ("replace", 2),
    ("replace", 3),
    ("fsync_directory", 1),
    ("fsync_directory", 3),
    ("fsync_directory", 4),
    ("persist_indexes", 1),
    ("persist_indexes", 3),
    ("create", 1),
    ("write_recovery_point", 1),
]


def inject(monkeypatch: pytest.MonkeyPatch, step: str, n: int) -> None:
    from tidelog.storage import log_maintenance as log_module
    from tidelog.storage.segment import Segment

    if step == "replace":
        monkeypatch.setattr(segment_install.os, "replace", fail_on_call(n, os.replace))
    elif step == "fsync_directory":
        monkeypatch.setattr(segment_install, "fsync_directory", fail_on_call(n, segment_install.fsync_directory))
    elif step == "persist_indexes":
        monkeypatch.setattr(Segment, "persist_indexes", fail_on_call(n, Segment.persist_indexes))
    elif step == "create":
        monkeypatch.setattr(Segment, "create", classmethod(fail_on_call(n, Segment.create.__func__)))  # type: ignore[attr-defined]
    elif step == "write_recovery_point":
        monkeypatch.setattr(log_module, "write_recovery_point", fail_on_call(n, log_module.write_recovery_point))


@pytest.mark.parametrize("reset", [True, False], ids=["after-reset", "extending"])
@pytest.mark.parametrize(("step", "n"), STEPS, ids=[f"{s}-{n}" for s, n in STEPS])
async def test_a_failure_at_any_install_step_leaves_a_prefix_consistent_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reset: bool, step: str, n: int
) -> None:
    leader = await leader_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    if reset:
        staged = stage(leader, follower)
        await follower.reset_to(0)
    else:
        boundary = leader.segments[0].next_offset
        await follower.append_as_follower(leader.read(0, 1 << 20, max_offset=boundary - 1))
        await follower.append_as_follower(leader.read(follower.end_offset, 1 << 20, max_offset=boundary))
        staged = stage(leader, follower, since=boundary)
    before = follower.end_offset
    inject(monkeypatch, step, n)
    with pytest.raises(Boom):
        await follower.install_segments(staged)
    monkeypatch.undo()
    assert follower.end_offset >= before
    assert_prefix_of(follower, leader)  # the open log object is consistent too
    await drop(follower)
    reopened = open_log(tmp_path / "follower")
    try:
        assert reopened.end_offset >= before
        assert_prefix_of(reopened, leader)
        assert not (tmp_path / "follower" / STAGING_DIR).exists()
        while reopened.end_offset < leader.end_offset:  # and fetching carries on from where it stands
            await reopened.append_as_follower(leader.read(reopened.end_offset, 1 << 20))
        assert read_everything(reopened) == read_everything(leader, reopened.start_offset)
    finally:
        await reopened.close()
        await leader.close()


@pytest.mark.parametrize("n", [1, 2, 3])
async def test_a_failure_while_resetting_leaves_an_empty_or_shorter_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    leader = await leader_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    while follower.end_offset < leader.end_offset:
        await follower.append_as_follower(leader.read(follower.end_offset, 1 << 20))
    from tidelog.storage.segment import Segment

    monkeypatch.setattr(Segment, "delete", fail_on_call(n, Segment.delete))
    with pytest.raises(Boom):
        await follower.reset_to(100)
    monkeypatch.undo()
    await drop(follower)
    reopened = open_log(tmp_path / "follower")
    try:
        assert_prefix_of(reopened, leader)
    finally:
        await reopened.close()
        await leader.close()


REPO = Path(__file__).resolve().parents[2]
CHILD = """
import asyncio, shutil, sys
from pathlib import Path
from tidelog.storage.log import Log
from tidelog.storage.segment_install import staging_directory, verify_staged
from tests.storage.logutil import small_config

async def main(leader_dir: str, follower_dir: str) -> None:
    leader = Log.open(leader_dir, small_config())
    follower = Log.open(follower_dir, small_config())
    await follower.reset_to(0)
    staging = staging_directory(follower.directory)
    for info in leader.segments[:-1]:
        staging.mkdir(exist_ok=True)
        target = staging / info.path.name
        shutil.copyfile(info.path, target)
        await follower.install_segments([verify_staged(target, info.base_offset)])
        print(follower.end_offset, flush=True)
    print("done", flush=True)
    await asyncio.sleep(60)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.parametrize("kill_after", [0, 1, 2])
async def test_sigkill_during_installs_leaves_a_log_that_opens_as_a_prefix(tmp_path: Path, kill_after: int) -> None:
    await (await leader_log(tmp_path / "leader")).close()
    child = subprocess.Popen(  # noqa: ASYNC220 - the child is read line by line, killed at once
        [sys.executable, "-c", CHILD, str(tmp_path / "leader"), str(tmp_path / "follower")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        reported = [child.stdout.readline() for _ in range(kill_after)]
    finally:
        child.kill()  # mid-install of the next segment, or just after one
        child.wait(timeout=30)
    acknowledged = int(reported[-1]) if reported else 0
    leader = open_log(tmp_path / "leader")
    reopened = open_log(tmp_path / "follower")
    try:
        assert reopened.end_offset >= acknowledged
        assert_prefix_of(reopened, leader)
        assert not (tmp_path / "follower" / STAGING_DIR).exists()
    finally:
        await reopened.close()
        await leader.close()
