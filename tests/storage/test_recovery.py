"""Recovery: clean reopen without a rescan, torn and corrupt tails cut, damaged indexes rebuilt, and damage in
sealed segments reported (never served, never silently dropped)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from tidelog.clock import ManualClock
from tidelog.protocol.records import iter_batches, records_of
from tidelog.storage.errors import OffsetDamagedError
from tidelog.storage.log import Log
from tidelog.storage.log_state import NEVER_SEAL_DELAY_MS
from tidelog.storage.recovery import MARKER_FILE, RECOVERY_POINT_FILE, write_recovery_point
from tidelog.storage.recovery_damage import DamagedLogError

from .logutil import crash, make_batch, open_log, read_everything, small_config


async def _build(path: Path, batches: int = 40, *, close: bool = True) -> tuple[Log, bytes]:
    """A log of ``batches`` 2-record batches over several 1000-byte segments."""
    log = open_log(path, segment_max_bytes=1000)
    for i in range(batches):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    content = read_everything(log)
    if close:
        await log.close()
    return log, content


def _reopen(path: Path) -> Log:
    return open_log(path, segment_max_bytes=1000)


def _segment_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.log"))


def read_everything_from_files(path: Path) -> bytes:
    """Every segment file's bytes, in offset order (the log's content while it cannot be opened)."""
    return b"".join(f.read_bytes() for f in _segment_files(path))


def _append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x01]))


async def test_clean_reopen_scans_nothing(tmp_path: Path) -> None:
    _, content = await _build(tmp_path)
    assert (tmp_path / MARKER_FILE).exists()
    log = _reopen(tmp_path)
    assert log.recovery.clean_shutdown and log.recovery.scanned == [] and log.recovery.rebuilt_indexes == []
    assert not (tmp_path / MARKER_FILE).exists()  # removed before anything is written
    assert read_everything(log) == content and log.end_offset == 80
    await log.close()


async def test_unclean_reopen_scans_only_the_last_segment(tmp_path: Path) -> None:
    log, content = await _build(tmp_path, close=False)
    last = log.segments[-1].base_offset
    await crash(log)
    log = _reopen(tmp_path)
    assert not log.recovery.clean_shutdown and log.recovery.scanned == [last]
    assert log.recovery.truncated_bytes == 0
    assert read_everything(log) == content
    await log.close()


@pytest.mark.parametrize("cut", [1, 30, 61, 100])
async def test_torn_tail_is_truncated_and_appends_continue(tmp_path: Path, cut: int) -> None:
    log, content = await _build(tmp_path, close=False)
    await crash(log)
    last = _segment_files(tmp_path)[-1]
    batches = list(iter_batches(last.read_bytes()))
    position, header = batches[-1]
    os.truncate(last, position + header.size - cut)  # the last batch lost its final bytes
    log = _reopen(tmp_path)
    assert log.recovery.truncated_at == (log.segments[-1].base_offset, position)
    assert log.end_offset == header.base_offset
    assert read_everything(log) == content[: len(content) - header.size]
    result = await log.append(make_batch(2, tag="again"), 2)
    assert result.base_offset == header.base_offset
    await log.close()


async def test_garbage_after_the_last_batch_is_cut(tmp_path: Path) -> None:
    log, content = await _build(tmp_path, close=False)
    await crash(log)
    _append_bytes(_segment_files(tmp_path)[-1], b"\x00\x00\x00\x00\x00\x00\x00\x50" + os.urandom(200))
    log = _reopen(tmp_path)
    assert log.recovery.truncated_bytes == 208
    assert read_everything(log) == content
    await log.close()


@pytest.mark.parametrize("where", ["body", "length"])
async def test_damage_in_the_middle_of_the_active_segment_is_not_cut(tmp_path: Path, where: str) -> None:
    log, content = await _build(tmp_path, close=False)
    await crash(log)
    last = _segment_files(tmp_path)[-1]
    batches = list(iter_batches(last.read_bytes()))
    position, header = batches[1]
    _flip(last, position + (70 if where == "body" else 9))  # a bit of the record section, or of batch_length
    before = last.read_bytes()
    with pytest.raises(DamagedLogError) as info:
        _reopen(tmp_path)
    damage = info.value.damage
    assert (damage.path, damage.position) == (str(last), position)
    assert (damage.first_offset, damage.next_good_offset) == (header.base_offset, header.next_offset)
    assert damage.intact_batches == len(batches) - 2 and damage.last_intact_offset == batches[-1][1].last_offset
    assert last.read_bytes() == before  # nothing was cut
    with pytest.raises(DamagedLogError):
        _reopen(tmp_path)  # still refused on the next attempt: nothing was lost meanwhile
    assert last.read_bytes() == before
    assert len(read_everything_from_files(tmp_path)) == len(content)


async def test_damage_in_the_middle_is_cut_when_allowed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, _ = await _build(tmp_path, close=False)
    await crash(log)
    last = _segment_files(tmp_path)[-1]
    batches = list(iter_batches(last.read_bytes()))
    position, header = batches[1]
    _flip(last, position + 70)
    with caplog.at_level(logging.WARNING, logger="tidelog.storage.recovery"):
        log = Log.open(tmp_path, small_config(segment_max_bytes=1000), truncate_damaged=True)
    report = log.recovery
    assert log.end_offset == header.base_offset and report.cut_from_offset == header.base_offset
    assert report.truncated_at == (log.segments[-1].base_offset, position) and report.cuts == 1
    assert report.damage is not None and report.damage.intact_batches == len(batches) - 2
    assert f"the log now ends at offset {header.base_offset}" in caplog.text and "intact" in caplog.text
    assert list(records_of(read_everything(log)))  # every byte left passes its CRC
    await log.close()


async def test_a_torn_tail_cut_is_logged_with_offsets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log, _ = await _build(tmp_path, close=False)
    await crash(log)
    last = _segment_files(tmp_path)[-1]
    position, header = list(iter_batches(last.read_bytes()))[-1]
    os.truncate(last, position + header.size - 5)
    with caplog.at_level(logging.WARNING, logger="tidelog.storage.recovery"):
        log = _reopen(tmp_path)
    assert log.recovery.cuts == 1 and log.recovery.cut_from_offset == header.base_offset
    assert "torn tail" in caplog.text and f"ends at offset {header.base_offset}" in caplog.text
    await log.close()


@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage", "stale", "timeindex"])
async def test_damaged_index_of_a_sealed_segment_is_rebuilt(tmp_path: Path, damage: str) -> None:
    _, content = await _build(tmp_path)
    first_sealed = _segment_files(tmp_path)[1]
    index = first_sealed.with_suffix(".index")
    assert index.stat().st_size >= 16
    if damage == "delete":
        index.unlink()
    elif damage == "truncate":
        os.truncate(index, 5)
    elif damage == "garbage":
        index.write_bytes(b"\xff" * 16)
    elif damage == "stale":  # entries naming positions that are not batch starts
        raw = bytearray(index.read_bytes())
        raw[-1] ^= 0x04
        index.write_bytes(bytes(raw))
    else:
        first_sealed.with_suffix(".timeindex").write_bytes(b"\x01" * 13)
    log = _reopen(tmp_path)
    base = int(first_sealed.stem)
    assert log.recovery.rebuilt_indexes == [base]
    assert read_everything(log) == content
    assert read_everything(log, start=base + 3, chunk=1)
    await log.close()
    assert _reopen(tmp_path).recovery.rebuilt_indexes == []  # the rebuilt index was written back


async def test_flip_in_a_sealed_segment_is_reported_with_offsets_not_served(tmp_path: Path) -> None:
    await _build(tmp_path)
    sealed = _segment_files(tmp_path)[1]
    data = sealed.read_bytes()
    batches = list(iter_batches(data))
    position, header = batches[2]
    _flip(sealed, position + 80)
    log = _reopen(tmp_path)
    assert log.recovery.truncated_bytes == 0  # nothing cut from a sealed segment
    with pytest.raises(OffsetDamagedError) as info:
        log.read(header.base_offset, 1)
    assert (info.value.first, info.value.last) == (header.base_offset, header.last_offset)
    assert [r.where for r in log.damage.ranges] == [str(sealed)]
    before = list(iter_batches(log.read(batches[0][1].base_offset, 10**6)))  # a read that would include it
    assert before[-1][1].next_offset == header.base_offset  # stops just before it
    with pytest.raises(OffsetDamagedError):
        log.read_range(header.base_offset, 1)
    good_before = log.read(batches[0][1].base_offset, 1)
    good_after = log.read(header.next_offset, 10**6)
    assert list(records_of(good_before)) and list(records_of(good_after))
    await log.close()


async def test_flip_in_a_sealed_segment_found_while_rebuilding_its_index(tmp_path: Path) -> None:
    await _build(tmp_path)
    sealed = _segment_files(tmp_path)[0]
    position, header = list(iter_batches(sealed.read_bytes()))[3]
    _flip(sealed, position + 75)
    sealed.with_suffix(".index").unlink()
    log = _reopen(tmp_path)
    assert log.recovery.corrupt_segments == [0]
    assert log.segments[0].size == sealed.stat().st_size  # the bytes are kept
    with pytest.raises(OffsetDamagedError) as info:
        log.read(header.base_offset, 1)
    assert info.value.first == header.base_offset
    await log.close()


async def test_leftovers_are_removed_and_foreign_files_kept(tmp_path: Path) -> None:
    _, content = await _build(tmp_path)
    first = _segment_files(tmp_path)[0]
    (tmp_path / (first.name + ".cleaned")).write_bytes(b"half a compaction")
    (tmp_path / (first.stem + ".index.tmp")).write_bytes(b"x")
    (tmp_path / f"{99999:020d}.index").write_bytes(b"")
    (tmp_path / f"{99999:020d}.timeindex").write_bytes(b"")
    (tmp_path / "hw-checkpoint").write_bytes(b"someone else's")
    log = _reopen(tmp_path)
    assert sorted(log.recovery.removed_files) == sorted(
        [first.name + ".cleaned", first.stem + ".index.tmp", f"{99999:020d}.index", f"{99999:020d}.timeindex"]
    )
    assert (tmp_path / "hw-checkpoint").exists()
    assert read_everything(log) == content
    await log.close()


async def test_marker_that_does_not_match_is_not_trusted(tmp_path: Path) -> None:
    _, content = await _build(tmp_path)
    last = _segment_files(tmp_path)[-1]
    _append_bytes(last, b"\x01" * 30)  # the tail changed after the clean shutdown was recorded (not zeros: see
    # test_preallocation for a zero tail)
    log = _reopen(tmp_path)
    assert not log.recovery.clean_shutdown and log.recovery.truncated_bytes == 30
    assert read_everything(log) == content
    await log.close()


async def test_damaged_marker_counts_as_unclean(tmp_path: Path) -> None:
    await _build(tmp_path)
    (tmp_path / MARKER_FILE).write_bytes(b"tidelog clean-shutdown 1\n1\n0 0\ncrc32c 00000000\n")
    log = _reopen(tmp_path)
    assert not log.recovery.clean_shutdown and log.recovery.scanned
    await log.close()


async def test_empty_directory_and_missing_directory(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "new" / "partition")
    assert (log.start_offset, log.end_offset) == (0, 0)
    assert log.read(0, 100) == b""
    await log.close()


async def test_a_torn_segment_above_the_recovery_point_with_later_ones_is_cut_only_when_allowed(tmp_path: Path) -> None:
    log, content = await _build(tmp_path, close=False)
    await crash(log)
    files = _segment_files(tmp_path)
    write_recovery_point(tmp_path, int(files[2].stem))  # as if the seal of segment 2 never completed
    position, header = list(iter_batches(files[2].read_bytes()))[-1]
    os.truncate(files[2], position + header.size - 7)  # and a power loss tore its tail
    with pytest.raises(DamagedLogError) as info:  # the later segments hold intact batches: not cut by itself
        _reopen(tmp_path)
    assert info.value.damage.next_good_offset == header.next_offset
    assert info.value.damage.intact_batches == sum(len(list(iter_batches(f.read_bytes()))) for f in files[3:])
    log = Log.open(tmp_path, small_config(segment_max_bytes=1000), truncate_damaged=True)
    assert log.recovery.scanned == [int(files[2].stem)]
    assert log.recovery.truncated_at == (int(files[2].stem), position)
    assert log.recovery.deleted_segments == [int(f.stem) for f in files[3:]]
    assert log.end_offset == header.base_offset and log.recovery.recovery_point == int(files[2].stem)
    assert content.startswith(read_everything(log))
    assert not any(f.exists() for f in files[3:])
    await log.close()


async def test_missing_recovery_point_means_scan_everything(tmp_path: Path) -> None:
    log, content = await _build(tmp_path, close=False)
    await crash(log)
    (tmp_path / RECOVERY_POINT_FILE).unlink()
    log = _reopen(tmp_path)
    assert log.recovery.scanned == [int(f.stem) for f in _segment_files(tmp_path)]
    assert read_everything(log) == content
    assert log.recovery.recovery_point == log.segments[-1].base_offset
    await log.close()


async def test_recovery_point_follows_seals_and_truncation(tmp_path: Path) -> None:
    log, _ = await _build(tmp_path, close=False)
    await log._settle()
    assert _recovery_point(tmp_path) == log.segments[-1].base_offset  # every sealed segment is durable
    target = log.segments[1].base_offset + 1
    await log.truncate_to(target)  # segment 1 takes appends again
    assert _recovery_point(tmp_path) == log.segments[1].base_offset
    for i in range(8):  # fill it up: it is sealed again, in the background
        await log.append(make_batch(2, size=50, tag=f"again{i}"), 1)
    await log._settle()
    assert _recovery_point(tmp_path) == log.segments[-1].base_offset
    await log.close()


def _recovery_point(path: Path) -> int:
    text = (path / RECOVERY_POINT_FILE).read_text().splitlines()
    return int(text[2])


async def test_never_policy_seals_once_the_kernel_had_time_to_write_back(tmp_path: Path) -> None:
    clock = ManualClock()
    log = Log.open(tmp_path, small_config(segment_max_bytes=1000), clock=clock)  # flush policy NEVER
    for i in range(12):
        await log.append(make_batch(2, size=50, tag=str(i)), 1)
    sealed_up_to = log.segments[-1].base_offset
    assert sealed_up_to > 0
    for _ in range(1000):  # let the seal tasks reach their timers
        if clock.sleepers:
            break
        await asyncio.sleep(0)
    assert not (tmp_path / RECOVERY_POINT_FILE).exists()  # nothing sealed yet: the recovery point is still 0
    clock.advance(NEVER_SEAL_DELAY_MS / 1000)
    for _ in range(500):  # the fsyncs run in worker threads: bounded wait
        if (tmp_path / RECOVERY_POINT_FILE).exists() and _recovery_point(tmp_path) == sealed_up_to:
            break
        await asyncio.sleep(0.01)
    assert _recovery_point(tmp_path) == sealed_up_to
    await log.close()


@pytest.mark.parametrize("damage", [b"", b"tidelog recovery-point 1\n1\n", b"\x00\xff" * 9])
async def test_a_damaged_recovery_point_means_scan_everything(tmp_path: Path, damage: bytes) -> None:
    log, content = await _build(tmp_path, close=False)
    await crash(log)
    (tmp_path / RECOVERY_POINT_FILE).write_bytes(damage)
    log = _reopen(tmp_path)
    assert log.recovery.scanned == [int(f.stem) for f in _segment_files(tmp_path)]
    assert read_everything(log) == content
    assert _recovery_point(tmp_path) == log.segments[-1].base_offset  # written again, valid
    await log.close()
