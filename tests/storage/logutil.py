"""Helpers shared by the log, segment, recovery and retention tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidelog.protocol.records import NewRecord, Record, assign_offsets, build_batch, iter_batches, records_of
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log
from tidelog.storage.segment import Segment
from tidelog.storage.segment_state import Placed

BASE_TS = 1_700_000_000_000_000_000
SEGMENT_BASE = 100  # the base offset of the segment fixture (conftest.py)


def make_batch(
    count: int = 3, *, size: int = 20, tag: str = "v", timestamp: int = BASE_TS, keys: list[bytes] | None = None
) -> bytes:
    """A batch of ``count`` records whose values are recognisable (``tag``, index) and ``size`` bytes long."""
    records = []
    for i in range(count):
        value = f"{tag}-{i}-".encode().ljust(size, b".")
        records.append(NewRecord(value, key=None if keys is None else keys[i % len(keys)]))
    return build_batch(records, timestamp=timestamp)


def stored(data: bytes, base_offset: int, epoch: int) -> bytes:
    """What a single batch looks like in the log once its offsets were assigned."""
    out = bytearray(data)
    assign_offsets(out, 0, base_offset, epoch)
    return bytes(out)


def small_config(**overrides: Any) -> LogConfig:
    settings: dict[str, Any] = {
        "segment_max_bytes": 4096,
        "index_interval_bytes": 256,
        "flush_policy": FlushPolicy.NEVER,
    }
    settings.update(overrides)
    return LogConfig(**settings)


def open_log(path: Path, **overrides: Any) -> Log:
    return Log.open(path, small_config(**overrides))


def read_everything(log: Log, start: int | None = None, chunk: int = 1000) -> bytes:
    """Every batch from ``start`` (default: the log start) to the end, through repeated reads."""
    offset = log.start_offset if start is None else start
    parts = []
    while offset < log.end_offset:
        data = log.read(offset, chunk)
        if not data:
            break
        parts.append(data)
        offset = max(h.next_offset for _, h in iter_batches(data))
    return b"".join(parts)


def all_records(log: Log) -> list[Record]:
    return list(records_of(read_everything(log)))


def batch_offsets(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in iter_batches(data)]


async def crash(log: Log) -> None:
    """Drop a log the way a process crash would: no index write-out, no clean-shutdown marker.

    Background seals and flush rounds are let finish first: their worker threads would otherwise race with
    the next open (a real crash stops them too; the subprocess crash test covers that case).
    """
    await log._settle()
    await log.flusher.flush()
    for segment in log._segments:
        segment.close()


def fill_segment(segment: Segment, batches: int, *, count: int = 3, size: int = 40) -> list[bytes]:
    """Append ``batches`` batches one by one; returns each batch as stored."""
    out = []
    for i in range(batches):
        offset = segment.next_offset
        data = stored(make_batch(count, size=size, tag=f"b{i}", timestamp=BASE_TS + i * 10), offset, 1)
        segment.append([data], [Placed(offset, offset + count, len(data), BASE_TS + i * 10)], now_ns=BASE_TS)
        out.append(data)
    return out
