"""The log cleaner applies retention and compaction to led partitions, never past the high watermark."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.helpers import BOUND
from tidelog.broker.partitions.cleaner import LogCleaner
from tidelog.broker.partitions.partition import Partition
from tidelog.clock import ManualClock
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, Record, build_batch, decode_records, iter_batches
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log


async def _partition(tmp_path: Path, **config: object) -> Partition:
    log = await Log.open_async(
        tmp_path, LogConfig(segment_max_bytes=4096, max_batch_bytes=4096, flush_policy=FlushPolicy.NEVER, **config)
    )
    stream = StreamRecord("s", "s", "", 1, 1, 0)
    return Partition(stream, PartitionRecord("s", 0, ("b",), "b", ("b",)), log, "b", min_isr=1)


async def _append(partition: Partition, key: bytes | None, value: bytes | None, ts: int) -> None:
    await partition.append(build_batch([NewRecord(value=value, key=key, timestamp=ts)], timestamp=ts), Acks.ALL, 5)


def _read_all(partition: Partition) -> list[Record]:
    """Every committed record, reading segment by segment (a read stops at a segment's end)."""
    out: list[Record] = []
    offset = partition.log.start_offset
    while offset < partition.high_watermark:
        data = partition.read_committed(offset, 1 << 20)
        assert data, f"nothing readable at {offset} below the high watermark {partition.high_watermark}"
        for pos, header in iter_batches(data):
            out.extend(decode_records(data, pos, header=header))
            offset = header.next_offset
    return out


async def test_retention_by_message_count_deletes_oldest_sealed_segments(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, retention_max_messages=20)
    for i in range(200):
        await _append(partition, None, b"v" * 100, 1_000 + i)
    segments_before = len(partition.log.segments)
    cleaner = LogCleaner(lambda: [partition], interval=60, clock=ManualClock())
    deleted, _ = await cleaner.clean_once()
    assert deleted > 0
    assert len(partition.log.segments) == segments_before - deleted
    assert partition.log.start_offset > 0
    assert partition.log.end_offset - partition.log.start_offset >= 20  # retention keeps at least the limit
    remaining = _read_all(partition)
    assert [r.offset for r in remaining] == list(range(partition.log.start_offset, 200))
    await partition.close()


async def test_compaction_keeps_newest_per_key_below_the_high_watermark(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, compact=True)
    for i in range(120):
        await _append(partition, b"k%d" % (i % 3), b"%d" % i, 1_000 + i)
    cleaner = LogCleaner(lambda: [partition], interval=60, clock=ManualClock())
    _, compacted = await cleaner.clean_once()
    assert compacted > 0
    survivors = _read_all(partition)
    offsets = [r.offset for r in survivors]
    assert offsets == sorted(offsets)
    newest = {}
    for r in survivors:
        newest[r.key] = r.value
    assert newest == {b"k0": b"117", b"k1": b"118", b"k2": b"119"}  # the newest value of every key survives
    assert len(survivors) < 120
    await partition.close()


async def _pass(cleaner: LogCleaner, clock: ManualClock, seconds: float) -> None:
    """Advance the clock by ``seconds`` and wait for the background pass that wakes."""
    for _ in range(1000):
        if clock.sleepers:
            break
        await asyncio.sleep(0)
    assert clock.sleepers == 1, "the cleaner is not waiting for its next pass"
    waiter = asyncio.ensure_future(cleaner.wait_for_passes(1))
    await asyncio.sleep(0)
    clock.advance(seconds)
    await asyncio.wait_for(waiter, BOUND)


async def test_a_stream_with_its_own_cleaner_interval_is_cleaned_that_often(tmp_path: Path) -> None:
    own = await _partition(tmp_path / "own", retention_max_messages=20, cleaner_interval_ms=1000)
    default = await _partition(tmp_path / "default", retention_max_messages=20)
    clock = ManualClock()
    cleaner = LogCleaner(lambda: [own, default], interval=60, clock=clock)
    cleaner.start()
    try:

        async def fill(base: int) -> None:
            for i in range(100):
                await _append(own, None, b"v" * 100, base + i)
                await _append(default, None, b"v" * 100, base + i)

        await fill(1_000)
        await _pass(cleaner, clock, 1.0)  # the first pass cleans every log
        own_start, default_start = own.log.start_offset, default.log.start_offset
        assert own_start > 0 and default_start > 0
        await fill(2_000)
        await _pass(cleaner, clock, 1.0)  # 1 s later: only the stream with a 1 s interval
        assert own.log.start_offset > own_start
        assert default.log.start_offset == default_start
        for _ in range(59):
            await _pass(cleaner, clock, 1.0)
        assert default.log.start_offset > default_start  # the broker's 60 s interval has passed
    finally:
        await cleaner.stop()
        await own.close()
        await default.close()
