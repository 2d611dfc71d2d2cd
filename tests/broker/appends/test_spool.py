"""The append spool: what it seals is a valid batch whether it stayed in memory or went to a file, and it keeps
nothing of a chunk it refuses."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import crc32c
import pytest

from tidelog.broker.appends.spool import MEMORY_BYTES, AppendSpool, AppendTooLargeError, Declared
from tidelog.clock import SystemClock
from tidelog.protocol.labels import LabelSet, decode_labels, encode_labels
from tidelog.protocol.records import (
    REGISTERS_FLAG,
    TRANSACTIONAL_FLAG,
    BatchBuilder,
    check_batch,
    decode_records,
    registers_block,
)
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.batch_check import ProduceLimits

FIRST_TS = 1_700_000_000_000_000_000
LIMITS = ProduceLimits.of(1 << 20, 1 << 30, 3_600_000)

# What an append asks of its partition before its commit: only the clock (its spool checks timestamps with it).
NO_PARTITION = SimpleNamespace(clock=SystemClock())


def chunks(count: int, per_chunk: int, size: int) -> tuple[list[bytes], list[bytes], BatchBuilder]:
    builder = BatchBuilder(FIRST_TS)
    values: list[bytes] = []
    out: list[bytes] = []
    for c in range(count):
        for i in range(per_chunk):
            value = os.urandom(size)
            values.append(value)
            builder.append(value, timestamp=FIRST_TS + c * per_chunk + i)
        out.append(builder.drain())
    return out, values, builder


@pytest.mark.parametrize(("count", "per_chunk", "size"), [(1, 3, 10), (4, 100, 1000), (6, 300, 1000)])
@pytest.mark.parametrize("declare", [False, True])
def test_sealed_batch_holds_every_record(tmp_path: Path, count: int, per_chunk: int, size: int, declare: bool) -> None:
    parts, values, _ = chunks(count, per_chunk, size)
    spool = AppendSpool(tmp_path, FIRST_TS, 1 << 30, LIMITS)
    for i, part in enumerate(parts):
        declared = Declared(per_chunk, crc32c.crc32c(part), FIRST_TS + (i + 1) * per_chunk - 1) if declare else None
        spool.add(memoryview(part), declared)
    assert spool.in_file == (sum(map(len, parts)) > MEMORY_BYTES)
    registers = LabelSet.of(("owner", "me"))
    batch = spool.seal(registers=encode_labels(registers))
    header = check_batch(batch)  # the combined CRC is the CRC of the whole batch
    assert header.attributes & (TRANSACTIONAL_FLAG | REGISTERS_FLAG) == TRANSACTIONAL_FLAG | REGISTERS_FLAG
    assert header.record_count == len(values) and header.last_offset_delta == len(values) - 1
    assert header.max_timestamp == FIRST_TS + len(values) - 1
    assert [r.value for r in decode_records(batch)] == values
    assert decode_labels(registers_block(batch) or b"") == registers
    del batch
    spool.discard()
    assert not list(tmp_path.iterdir())


def test_a_refused_chunk_leaves_the_spool_as_it_was(tmp_path: Path) -> None:
    parts, values, _ = chunks(2, 5, 10)
    spool = AppendSpool(tmp_path, FIRST_TS, 1 << 20, LIMITS)
    spool.add(memoryview(parts[0]))
    with pytest.raises(CorruptBatchError):
        spool.add(memoryview(parts[1][:-1]))
    with pytest.raises(CorruptBatchError):
        spool.add(memoryview(parts[1]), Declared(5, crc32c.crc32c(parts[1]) ^ 1, FIRST_TS))
    spool.add(memoryview(parts[1]))
    assert [r.value for r in decode_records(spool.seal(registers=None))] == values


def test_the_size_limit_counts_record_bytes(tmp_path: Path) -> None:
    parts, _, _ = chunks(2, 10, 100)
    spool = AppendSpool(tmp_path, FIRST_TS, len(parts[0]) + 10, LIMITS)
    spool.add(memoryview(parts[0]))
    with pytest.raises(AppendTooLargeError, match="max_append_bytes"):
        spool.add(memoryview(parts[1]))


def test_an_empty_append_has_no_batch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no records"):
        AppendSpool(tmp_path, FIRST_TS, 100, LIMITS).seal(registers=None)


def test_a_spool_that_cannot_be_written_fails_the_append_cleanly(tmp_path: Path) -> None:
    """A full disk (here: a spool directory that is gone) fails the append with a clear status, keeps nothing."""
    import asyncio

    from tidelog.broker.appends.commit import Expectations
    from tidelog.broker.appends.streamed import AppendLimits, OpenAppend
    from tidelog.protocol.errors import ErrorCode

    async def run() -> None:
        limits = AppendLimits(tmp_path / "gone", 1 << 30, 0, 5.0, LIMITS)
        opened = OpenAppend(1, NO_PARTITION, Expectations(), FIRST_TS, None, 1.0, limits)  # type: ignore[arg-type]
        parts, _, _ = chunks(3, 400, 1000)  # over MEMORY_BYTES: the spool moves to a file, which fails
        for part in parts:
            opened.add(memoryview(part))
        assert opened.failure is not None and opened.failure.code == ErrorCode.UNAVAILABLE
        assert "could not spool" in opened.failure.message
        assert opened.failed.done()

    asyncio.run(run())


def test_a_spool_on_a_full_disk_fails_the_append_with_disk_full(tmp_path: Path) -> None:
    """A real tmpfs filled to the last byte: the append is refused with the retriable DISK_FULL, keeping nothing."""
    import asyncio

    from tidelog.broker.appends.commit import Expectations
    from tidelog.broker.appends.streamed import AppendLimits, OpenAppend
    from tidelog.protocol.errors import SPECS, ErrorCode
    from tidelog.testing.small_disk import Ballast, mount_small_disk

    async def run(disk: Path) -> None:
        Ballast(disk / "ballast").fill()
        limits = AppendLimits(disk, 1 << 30, 0, 5.0, LIMITS)
        opened = OpenAppend(1, NO_PARTITION, Expectations(), FIRST_TS, None, 1.0, limits)  # type: ignore[arg-type]
        parts, _, _ = chunks(3, 400, 1000)  # over MEMORY_BYTES: the spool moves to a file, which fails
        for part in parts:
            opened.add(memoryview(part))
        assert opened.failure is not None and opened.failure.code == ErrorCode.DISK_FULL
        assert SPECS[ErrorCode.DISK_FULL].retriable
        assert "disk is full" in opened.failure.message and "once space is freed" in opened.failure.message

    try:
        mounted = mount_small_disk(tmp_path / "disk", 256 * 1024)
        disk = mounted.__enter__()
    except OSError as exc:
        pytest.skip(str(exc))
    try:
        asyncio.run(run(disk))
    finally:
        mounted.__exit__(None, None, None)


def test_records_that_frame_but_do_not_decode_are_refused_even_when_declared(tmp_path: Path) -> None:
    """A declared chunk was only counted by its framing: a key length past its record was spooled, and every
    reader of the committed append failed on it."""
    builder = BatchBuilder(FIRST_TS)
    builder.append(b"value-1", key=b"k")
    builder.append(b"value-2", key=b"k")
    chunk = bytearray(builder.drain())
    key_length_at = 1 + 1 + 1 + 1  # length, attributes, timestamp delta, offset delta (one byte each)
    chunk[key_length_at] = 0x7E  # a key of 63 bytes in a record of a dozen
    spool = AppendSpool(tmp_path, FIRST_TS, 1 << 20, LIMITS)
    with pytest.raises(CorruptBatchError, match="record 0: key of 63 bytes"):
        spool.add(memoryview(bytes(chunk)), Declared(2, crc32c.crc32c(chunk), FIRST_TS))
    assert spool.count == 0


def test_an_appends_timestamps_and_record_sizes_are_bounded(tmp_path: Path) -> None:
    import time

    from tidelog.protocol.records.errors import InvalidBatchError, RecordTooLargeError

    now = time.time_ns()
    spool = AppendSpool(tmp_path, now, 1 << 30, LIMITS)
    builder = BatchBuilder(now)
    builder.append(b"later", timestamp=now + 2 * 3_600_000_000_000)
    ahead = builder.drain()
    with pytest.raises(InvalidBatchError, match=r"max_timestamp_ahead_ms \(3600000\)"):
        spool.add(memoryview(ahead), Declared(1, crc32c.crc32c(ahead), now))  # the declared maximum is not trusted
    builder = BatchBuilder(now)
    builder.append(bytes((1 << 20) + 1))
    with pytest.raises(RecordTooLargeError, match=r"max_message_bytes \(1048576\)"):
        spool.add(memoryview(builder.drain()))
    builder = BatchBuilder(now)
    builder.append(b"fine", timestamp=now + 5)
    spool.add(memoryview(builder.drain()))
    assert check_batch(spool.seal(registers=None)).max_timestamp == now + 5
