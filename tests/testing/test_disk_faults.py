"""Disk faults change exactly what they say, inside a segment's data and never in its preallocated zeros."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tidelog.testing import disk_faults
from tidelog.testing.fault_run import FaultProfile
from tidelog.testing.faults import corrupt_follower

DATA = bytes(range(1, 201)) * 50  # 10,000 non-zero bytes
ZEROS = bytes(4096)  # room written ahead of time


@pytest.fixture
def segment(tmp_path: Path) -> Path:
    path = tmp_path / "streams" / "s@1" / "0" / "00000000000000000000.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(DATA + ZEROS)
    (path.parent / "hw-checkpoint").write_bytes(b"checkpoint")
    return path


def test_partition_files_finds_logs_and_named_files(segment: Path, tmp_path: Path) -> None:
    assert disk_faults.partition_files(tmp_path, "s", 0) == [segment]
    assert disk_faults.partition_files(tmp_path, "s", 0, "hw-checkpoint") == [segment.parent / "hw-checkpoint"]
    assert disk_faults.partition_files(tmp_path, "s", 1) == []


def test_data_end_stops_before_preallocated_zeros(segment: Path) -> None:
    assert disk_faults.data_end(segment) == len(DATA)


def test_flip_bits_changes_that_many_bits_in_the_range(segment: Path) -> None:
    said = disk_faults.flip_bits(segment, random.Random(1), count=5, start=100, end=200)
    after = segment.read_bytes()
    changed = [i for i, (a, b) in enumerate(zip(DATA + ZEROS, after, strict=True)) if a != b]
    assert changed and all(100 <= i < 200 for i in changed)
    assert sum(bin(a ^ b).count("1") for a, b in zip(DATA + ZEROS, after, strict=True)) <= 5
    assert "flipped 5 bit(s)" in said


def test_truncate_tail_cuts_inside_the_data(segment: Path) -> None:
    disk_faults.truncate_tail(segment, random.Random(2), fraction=0.5)
    size = segment.stat().st_size
    assert len(DATA) // 2 <= size < len(DATA)
    assert segment.read_bytes() == DATA[:size]


def test_roll_back_restores_an_older_chunk(segment: Path) -> None:
    older = disk_faults.snapshot(segment)
    segment.write_bytes(bytes(reversed(DATA)) + ZEROS)
    disk_faults.roll_back(segment, older[:5000], random.Random(3), chunk=1000)
    after = segment.read_bytes()
    newer = DATA[::-1]
    changed = [i for i in range(len(DATA)) if after[i] != newer[i]]
    assert changed, "one chunk must differ from the newer bytes"
    start = changed[0] // 1000 * 1000
    expected = older[start : start + 1000] if start < 5000 else bytes(1000)
    assert after[start : start + 1000] == expected


@pytest.mark.slow
async def test_a_follower_with_flipped_bits_repairs_and_rejoins(tmp_path: Path) -> None:
    """Bit rot on a crashed follower's log: it must not keep the damaged records nor serve them; replicas end
    identical up to the HW (the other corruptions run with ``python -m tidelog.testing.faults
    corrupt-follower-truncate`` and the like)."""
    report = await corrupt_follower(tmp_path, FaultProfile.short(), "bitflip")
    print(report)
    assert report.ok, str(report)
    assert "flipped 10 bit(s)" in " ".join(report.notes)
