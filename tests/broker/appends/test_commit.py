"""An open append's commit runs on the leader's write path and answers every outcome as a value: the committed
offsets, or an :class:`AppendRefused` naming the code, the log end and the registers (never an exception)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tidelog.broker.appends.commit import AppendRefused, Committed, Expectations
from tidelog.broker.appends.streamed import AppendLimits, OpenAppend
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.labels import EMPTY, LabelSet
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import BatchBuilder
from tidelog.storage.batch_check import ProduceLimits
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

TS = 1_700_000_000_000_000_000


async def _partition(tmp_path: Path) -> Partition:
    log = await Log.open_async(tmp_path / "log", LogConfig(flush_policy=FlushPolicy.ALWAYS))
    return Partition(
        StreamRecord("s", "s", "", 1, 1, 0), PartitionRecord("s", 0, ("b",), "b", ("b",)), log, "b", min_isr=1
    )


def _open(partition: Partition, tmp_path: Path, expectations: Expectations, append_id: int = 1) -> OpenAppend:
    limits = AppendLimits(tmp_path, 1 << 20, 0, 5.0, ProduceLimits.of(1 << 20, 1 << 20, 60_000))
    opened = OpenAppend(append_id, partition, expectations, TS, Acks.ALL, 5.0, limits)
    builder = BatchBuilder(TS)
    builder.append(b"a", timestamp=TS)
    builder.append(b"b", timestamp=TS + 1)
    opened.add(memoryview(builder.drain()))
    return opened


async def test_a_commit_whose_expectations_hold_is_written_and_returns_its_offsets(tmp_path: Path) -> None:
    partition = await _partition(tmp_path)
    union = LabelSet.of(("owner", "a"))
    committed = await _open(partition, tmp_path, Expectations(expected_offset=0, union_registers=union)).commit()
    assert committed == Committed(0, 1, 2, union)
    assert partition.log_end == 2 and partition.high_watermark == 2
    await partition.close()


async def test_an_expectation_that_fails_is_a_refusal_with_the_log_end_and_nothing_is_written(tmp_path: Path) -> None:
    partition = await _partition(tmp_path)
    await _open(partition, tmp_path, Expectations(expected_offset=0)).commit()
    refused = await _open(partition, tmp_path, Expectations(expected_offset=0), append_id=2).commit()
    assert isinstance(refused, AppendRefused)
    assert (refused.code, refused.log_end, refused.registers) == (ErrorCode.INCORRECT_OFFSET, 2, EMPTY)
    assert partition.log_end == 2
    await partition.close()


async def test_the_write_paths_refusal_is_the_appends_answer(tmp_path: Path) -> None:
    partition = await _partition(tmp_path)
    opened = _open(partition, tmp_path, Expectations())
    partition.update_record(msgspec.structs.replace(partition.record, readonly=True))
    refused = await opened.commit()
    assert isinstance(refused, AppendRefused)
    assert refused.code == ErrorCode.READONLY and refused.log_end == 0
    assert partition.log_end == 0
    await partition.close()
