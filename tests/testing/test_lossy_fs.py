"""The lossy filesystem's rules, called directly (no mount): data waits for fsync, a power loss drops it, a failed
fsync dooms what it covered, a full disk refuses growth only."""

from __future__ import annotations

import errno
from pathlib import Path

import mfusepy  # type: ignore[import-untyped]
import pytest

from tidelog.testing.lossy_disk import lossy_disk_available
from tidelog.testing.lossy_fs import LossyOperations


@pytest.fixture
def fs(tmp_path: Path) -> LossyOperations:
    ops = LossyOperations(tmp_path)
    ops.mkdir("/d", 0o755)
    ops.create("/d/f", 0o644)
    return ops


def _size(fs: LossyOperations, path: str) -> int:
    return int(fs.getattr(path)["st_size"])


def test_the_machine_can_mount_one() -> None:
    assert lossy_disk_available() is None, lossy_disk_available()


def test_writes_wait_for_fsync_and_a_power_loss_drops_the_rest(fs: LossyOperations, tmp_path: Path) -> None:
    fs.write("/d/f", b"hello", 0, 0)
    assert fs.read("/d/f", 100, 0, 0) == b"hello" and (tmp_path / "d" / "f").read_bytes() == b""
    fs.fsync("/d/f", 1, 0)
    assert (tmp_path / "d" / "f").read_bytes() == b"hello"
    fs.write("/d/f", b" world", 5, 0)
    fs.truncate("/d/f", 2)
    fs.write("/d/f", b"!", 4, 0)
    assert fs.read("/d/f", 100, 0, 0) == b"he\x00\x00!" and _size(fs, "/d/f") == 5
    assert fs.command("power-loss") == "ok dropped 7 unsynced bytes"
    assert fs.read("/d/f", 100, 0, 0) == b"hello" and _size(fs, "/d/f") == 5


def test_a_rename_carries_unsynced_data_and_an_unlink_drops_it(fs: LossyOperations, tmp_path: Path) -> None:
    fs.write("/d/f", b"abc", 0, 0)
    fs.rename("/d/f", "/d/g")
    assert fs.read("/d/g", 10, 0, 0) == b"abc"
    fs.fsync("/d/g", 0, 0)
    assert (tmp_path / "d" / "g").read_bytes() == b"abc"
    fs.create("/d/h", 0o644)
    fs.write("/d/h", b"x", 0, 0)
    fs.unlink("/d/h")
    assert fs.command("status").startswith("ok pending=0 ")


def test_a_failed_fsync_dooms_its_data_and_the_next_fsync_lies(fs: LossyOperations, tmp_path: Path) -> None:
    fs.write("/d/f", b"old", 0, 0)
    fs.fsync("/d/f", 1, 0)
    fs.write("/d/f", b"NEW", 0, 0)
    fs.command("fail eio-fsync")
    with pytest.raises(OSError) as failed:
        fs.fsync("/d/f", 1, 0)
    assert failed.value.errno == errno.EIO
    fs.command("heal")
    fs.fsync("/d/f", 1, 0)  # succeeds, as Linux's does after reporting the error once
    assert fs.read("/d/f", 10, 0, 0) == b"NEW"  # still readable from the cache
    assert (tmp_path / "d" / "f").read_bytes() == b"old"  # never written
    fs.write("/d/f", b"Z", 2, 0)  # a later write over part of it does reach the disk, over the doomed bytes
    fs.fsync("/d/f", 1, 0)
    assert fs.read("/d/f", 10, 0, 0) == b"NEZ" and (tmp_path / "d" / "f").read_bytes() == b"olZ"
    fs.command("power-loss")
    assert fs.read("/d/f", 10, 0, 0) == b"olZ"


def test_io_errors_and_a_full_disk(fs: LossyOperations) -> None:
    fs.write("/d/f", bytes(8), 0, 0)
    fs.fsync("/d/f", 1, 0)
    fs.command("fail enospc")
    fs.write("/d/f", b"in", 2, 0)  # inside the file: its blocks exist
    with pytest.raises(mfusepy.FuseOSError) as full:
        fs.write("/d/f", b"grow", 6, 0)
    assert full.value.errno == errno.ENOSPC
    with pytest.raises(mfusepy.FuseOSError):
        fs.create("/d/new", 0o644)
    fs.command("heal")
    fs.command("fail eio-write")
    with pytest.raises(mfusepy.FuseOSError) as eio:
        fs.write("/d/f", b"x", 0, 0)
    assert eio.value.errno == errno.EIO
    assert fs.command("status") == "ok pending=2 eio-write=1 eio-fsync=0 enospc=2"
    assert fs.command("fail fire").startswith("error unknown command")
