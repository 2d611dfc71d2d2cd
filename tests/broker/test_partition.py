"""Writing to a led partition: acks ALL answers once the append is fsynced and committed, or times out."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tidelog.api.errors import RequestTimeoutError
from tidelog.api.wire.messages import Acks
from tidelog.broker.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.storage.batch import NewRecord, build_batch
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log


async def _partition(tmp_path: Path, isr: tuple[str, ...]) -> Partition:
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, len(isr), 0)
    return Partition(stream, PartitionRecord("s", 0, isr, "b", isr), log, "b", min_isr=1)


def _batch(n: int) -> bytes:
    return build_batch([NewRecord(value=b"v%d" % i) for i in range(n)], timestamp=1_700_000_000_000_000_000)


async def test_acks_all_on_a_sole_replica_returns_fsynced_and_committed(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, ("b",))
    for expected_base in (0, 3, 6):
        appended = await partition.append(_batch(3), Acks.ALL, 5)
        assert (appended.base_offset, appended.last_offset) == (expected_base, expected_base + 2)
        assert partition.high_watermark == appended.last_offset + 1
        assert partition.log.flusher.durable == partition.log.flusher.written
    await partition.close()


async def test_acks_all_times_out_while_the_isr_lags_and_keeps_the_write(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, ("b", "c"))  # "c" never fetches: the HW cannot move
    with pytest.raises(RequestTimeoutError):
        await partition.append(_batch(2), Acks.ALL, 0.05)
    assert partition.log_end == 2 and partition.high_watermark == 0
    assert not await partition.wait_for_data(0, 0.01)
    appended = await partition.append(_batch(1), Acks.LEADER, 5)  # LEADER: the leader's own (fsynced) log
    assert appended.base_offset == 2 and partition.high_watermark == 0
    await partition.close()


async def test_an_append_whose_caller_is_cancelled_mid_fsync_still_commits(tmp_path: Path) -> None:
    """A client gone while its batch is being fsynced: the batch is in the log, and the HW must still reach it
    without waiting for another write (a replicated leader fsyncs on the worker, so the caller really waits)."""
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, 2, 0)
    partition = Partition(stream, PartitionRecord("s", 0, ("b", "c"), "b", ("b",)), log, "b", min_isr=1)
    task = asyncio.ensure_future(partition.append(_batch(2), Acks.LEADER, 5))
    for _ in range(10_000):
        if partition.log_end:
            break
        await asyncio.sleep(0)
    assert partition.log_end == 2 and not task.done()  # written, the fsync still running
    task.cancel()
    assert await partition.wait_for_data(1, 5.0), "the cancelled append's records never committed"
    assert partition.high_watermark == 2
    await partition.close()
