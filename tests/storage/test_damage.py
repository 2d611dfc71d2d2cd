"""Damage found on disk while the log runs: reads serve before and after it, never through it (issue 15)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.protocol.records import HEADER_SIZE, iter_batches
from tidelog.replication.idempotence.producer_snapshot import iter_log_headers
from tidelog.storage.damage import DAMAGE_FILE, DamageRegistry
from tidelog.storage.damage_repair import RepairRefusedError
from tidelog.storage.errors import OffsetDamagedError
from tidelog.storage.log import Log

from .logutil import BASE_TS, batch_offsets, make_batch, open_log, read_everything

BATCHES = 30  # three records each: batch i holds offsets 3i..3i+2


async def filled(path: Path) -> list[Path]:
    """A closed log of BATCHES batches over several segments; its segment files, oldest first."""
    log = open_log(path, segment_max_bytes=1000)
    for i in range(BATCHES):
        await log.append(make_batch(3, size=40, tag=str(i)), 1)
    await log.close()
    return log_files(path)


def log_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.log"))


def flip(files: list[Path], offset: int, *, at: int) -> None:
    """Flip one byte ``at`` bytes into the batch holding ``offset`` (past HEADER_SIZE: its records)."""
    for path in files:
        for position, header in iter_batches(path.read_bytes(), verify=False):
            if header.base_offset <= offset <= header.last_offset:
                fd = os.open(path, os.O_RDWR)
                try:
                    old = os.pread(fd, 1, position + at)
                    os.pwrite(fd, bytes([old[0] ^ 0x5A]), position + at)
                finally:
                    os.close(fd)
                return
    raise AssertionError(f"no batch holds offset {offset}")


def read_from(log: Log, offset: int, *, ranged: bool) -> list[tuple[int, int]]:
    if not ranged:
        return batch_offsets(log.read(offset, 10**6))
    file = log.read_range(offset, 10**6)
    if file is None:
        return []
    with file:
        return batch_offsets(os.pread(file.fd, file.length, file.position))


def read_around(log: Log) -> list[tuple[int, int]]:
    """Every batch's offsets, read as a consumer reads: on past each damaged range."""
    everything: list[tuple[int, int]] = []
    offset = log.start_offset
    while offset < log.end_offset:
        try:
            got = batch_offsets(log.read(offset, 500))
        except OffsetDamagedError as exc:
            offset = exc.next_offset
            continue
        everything += got
        offset = got[-1][1] + 1
    return everything


@pytest.mark.parametrize("ranged", [False, True], ids=["read", "read_range"])
async def test_reads_stop_before_damage_name_it_and_resume_after(tmp_path: Path, ranged: bool) -> None:
    flip(await filled(tmp_path), 30, at=HEADER_SIZE + 3)
    log = open_log(tmp_path, segment_max_bytes=1000)
    served: list[tuple[int, int]] = []
    offset = 0
    while offset < 30:
        got = read_from(log, offset, ranged=ranged)
        assert got, f"nothing served from {offset}"
        served += got
        offset = got[-1][1] + 1
    assert served == [(3 * i, 3 * i + 2) for i in range(10)]  # everything before the damaged batch
    with pytest.raises(OffsetDamagedError) as info:
        read_from(log, 31, ranged=ranged)
    assert (info.value.first, info.value.last, info.value.next_offset) == (30, 32, 33)
    assert read_from(log, 33, ranged=ranged)[0] == (33, 35)
    assert [(r.first, r.last, r.confirmed) for r in log.damage.ranges] == [(30, 32, False)]
    assert log.damage.found_total == 1
    await log.close()


async def test_the_range_and_its_confirmation_survive_a_reopen(tmp_path: Path) -> None:
    flip(await filled(tmp_path), 45, at=HEADER_SIZE + 10)
    log = open_log(tmp_path, segment_max_bytes=1000)
    with pytest.raises(OffsetDamagedError):
        log.read(45, 100)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=1000)
    with pytest.raises(OffsetDamagedError):
        log.read(45, 100)  # known without reading the bytes again
    with pytest.raises(KeyError, match=r"known: 45\.\.47"):
        log.damage.confirm(45, 46)
    log.damage.confirm(45, 47)
    await log.close()
    log = open_log(tmp_path, segment_max_bytes=1000)
    assert batch_offsets(log.read(45, 100))[0] == (48, 50)  # passed over, like a compacted gap
    everything = batch_offsets(read_everything(log))
    assert (45, 47) not in everything and len(everything) == BATCHES - 1
    await log.close()


async def test_a_damaged_header_bounds_the_range_by_what_can_still_be_found(tmp_path: Path) -> None:
    files = await filled(tmp_path)
    flip(files, 60, at=8)  # the batch length: the next header cannot be found from here
    log = open_log(tmp_path, segment_max_bytes=1000)
    everything = read_around(log)
    assert everything[-1] == (3 * BATCHES - 3, 3 * BATCHES - 1)  # the reads went on past the damage
    (damaged,) = log.damage.ranges
    assert damaged.first == 60 and damaged.last >= 62
    assert all(last < damaged.first or first > damaged.last for first, last in everything)
    assert [o for o in range(3 * BATCHES) if not damaged.first <= o <= damaged.last] == [
        o for first, last in everything for o in range(first, last + 1)
    ]
    await log.close()


async def test_truncation_and_retention_forget_ranges_whose_bytes_are_gone(tmp_path: Path) -> None:
    flip(await filled(tmp_path), 30, at=HEADER_SIZE + 3)
    flip(log_files(tmp_path), 75, at=HEADER_SIZE + 3)
    log = open_log(tmp_path, segment_max_bytes=1000)
    read_around(log)
    assert [(r.first, r.last) for r in log.damage.ranges] == [(30, 32), (75, 77)]
    await log.truncate_to(60)
    assert [(r.first, r.last) for r in log.damage.ranges] == [(30, 32)]
    await log.delete_segments_before(40)
    assert log.start_offset > 32
    assert log.damage.ranges == []
    await log.close()
    assert DamageRegistry.load(tmp_path).ranges == []


def test_an_unreadable_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / DAMAGE_FILE).write_bytes(b"\x00not json")
    assert DamageRegistry.load(tmp_path).ranges == []


async def test_a_replicas_copy_restores_the_range_in_place(tmp_path: Path) -> None:
    sound = open_log(tmp_path / "replica", segment_max_bytes=1000)
    for i in range(BATCHES):
        await sound.append(make_batch(3, size=40, tag=str(i)), 1)
    copy = sound.read(30, 10**6)
    flip(await filled(tmp_path / "damaged"), 30, at=HEADER_SIZE + 3)
    log = open_log(tmp_path / "damaged", segment_max_bytes=1000)
    assert read_around(log) != batch_offsets(read_everything(sound))
    (damaged,) = log.damage.ranges
    with pytest.raises(RepairRefusedError, match="starts at offset 33"):
        await log.repair_damaged(damaged, sound.read(33, 10**6))
    with pytest.raises(RepairRefusedError, match="damaged too"):
        await log.repair_damaged(damaged, copy[:20] + bytes([copy[20] ^ 1]) + copy[21:])
    await log.repair_damaged(damaged, copy)
    assert log.damage.ranges == [] and log.damage.repaired_total == 1
    assert read_everything(log) == read_everything(sound)
    await log.close()
    await sound.close()
    assert DamageRegistry.load(tmp_path / "damaged").ranges == []


async def test_the_producer_state_scan_passes_over_damage(tmp_path: Path) -> None:
    flip(await filled(tmp_path), 30, at=HEADER_SIZE + 3)
    log = open_log(tmp_path, segment_max_bytes=1000)
    headers = [(h.base_offset, h.last_offset) for h in iter_log_headers(log, 0)]
    assert headers == [(3 * i, 3 * i + 2) for i in range(BATCHES) if i != 10]
    await log.close()


async def test_a_timestamp_lookup_landing_on_damage_answers_where_it_starts(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_max_bytes=1000)
    for i in range(BATCHES):
        await log.append(make_batch(3, size=40, tag=str(i), timestamp=BASE_TS + i * 1000), 1)
    await log.close()
    flip(log_files(tmp_path), 30, at=HEADER_SIZE + 3)
    log = open_log(tmp_path, segment_max_bytes=1000)
    assert log.offset_for_timestamp(BASE_TS + 10 * 1000) == 30
    with pytest.raises(OffsetDamagedError):
        log.read(30, 100)
    await log.close()
