"""A leader's registers come from its log: the last registers block wins, a checkpoint shortens the scan, and a
log truncated below a checkpoint is rescanned rather than trusted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.storage.logutil import open_log
from tidelog.broker.appends.registers import REGISTERS_CHECKPOINT_FILE, PartitionRegisters
from tidelog.protocol.labels import EMPTY, LabelSet, encode_labels
from tidelog.protocol.records import NewRecord, build_batch

pytestmark = pytest.mark.asyncio

A = LabelSet.of(("owner", "a"))
B = LabelSet.of(("owner", "b"))


async def append(log: object, value: bytes, registers: LabelSet | None = None) -> None:
    from tidelog.storage.log import Log

    assert isinstance(log, Log)
    block = None if registers is None else encode_labels(registers)
    await log.append(build_batch([NewRecord(value)], timestamp=1, registers=block), 0, registers=True)


async def test_registers_are_those_of_the_last_block(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert await PartitionRegisters(log).current() == EMPTY
    await append(log, b"1", A)
    await append(log, b"2")
    await append(log, b"3", B)
    await append(log, b"4")
    assert await PartitionRegisters(log).current() == B
    await log.close()


async def test_the_checkpoint_is_used_and_a_truncated_log_is_rescanned(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    await append(log, b"1", A)
    await append(log, b"2", B)
    registers = PartitionRegisters(log)
    assert await registers.current() == B
    registers.committed(3, A)  # as a commit would record it, then the HW passes it
    await append(log, b"3", A)
    await registers.checkpoint(3)
    assert (tmp_path / REGISTERS_CHECKPOINT_FILE).exists()
    assert await PartitionRegisters(log).current() == A  # from the checkpoint, nothing to scan
    await log.truncate_to(2)  # below the checkpoint: e.g. the checkpoint came from a later leadership
    assert await PartitionRegisters(log).current() == B
    await log.close()


async def test_a_produce_batch_cannot_carry_registers(tmp_path: Path) -> None:
    from tidelog.protocol.records.errors import InvalidBatchError

    log = open_log(tmp_path)
    with pytest.raises(InvalidBatchError, match="registers"):
        await log.append(build_batch([NewRecord(b"x")], timestamp=1, registers=encode_labels(A)), 0)
    await log.close()


@pytest.mark.parametrize("damage", [b"", b"tidelog registers 1\n", b"\xff\x00 garbage", b"tidelog registers 9\n0\n"])
async def test_a_damaged_checkpoint_is_rebuilt_from_the_log(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path)
    await append(log, b"1", A)
    await append(log, b"2", B)
    registers = PartitionRegisters(log)
    assert await registers.current() == B
    await registers.checkpoint(2)
    await log.close()
    (tmp_path / REGISTERS_CHECKPOINT_FILE).write_bytes(damage)
    log = open_log(tmp_path)  # a restart
    with caplog.at_level(logging.WARNING):
        assert await PartitionRegisters(log).current() == B  # scanned from the log start instead
    assert REGISTERS_CHECKPOINT_FILE in caplog.text and "ignoring the registers checkpoint" in caplog.text
    await log.close()
