"""Storage benchmark: the partition log's append and read throughput beside a raw-file baseline.

    python -m benchmarks.storage [--quick]

Append: batches of 1,000 records (100 B and 1 KiB values) are built *before* the timed loop (this measures the
log, not the client's encoder), then appended one after another with flush policy ``never`` and ``always``.
The peer is a plain loop that writes the same bytes to one file with the same fsync cadence: no fsync for
``never``, one ``fdatasync`` per batch for ``always`` (the log's group commit issues exactly one per batch when
there is a single appender, so the two do the same durable work). Segments roll at the default 128 MiB.

Read: the 1 KiB log is read back sequentially from the page cache with ``Log.read`` (1 MiB per call, every
batch CRC-checked), beside ``os.pread`` of the same segment files in 1 MiB chunks.

Every measurement is repeated (5 times, 3 with ``--quick``) after one uncounted warm-up round, alternating
which side goes first, and the medians are reported as one JSON object per line; the last line is the
summary of targets. Both sides write into one
scratch directory (``$TMPDIR``, the same disk as the repository on the benchmark machines).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._common import Row, emit, log, median, scratch_dir
from tidelog.protocol.records import NewRecord, build_batch, iter_batches
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

BENCH = "storage"
RECORDS_PER_BATCH = 1000
MB = 1_000_000
READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Goal:
    """A target on a metric's ``ratio`` or on its ``value``."""

    metric: str
    on: str
    bound: float

    def met(self, row: Row) -> bool:
        measured = row.ratio if self.on == "ratio" else row.value
        return measured is not None and measured >= self.bound

    def __str__(self) -> str:
        return f"{self.on} >= {self.bound:g}"


GOALS = (
    Goal("append_1k_never", "ratio", 0.7),
    Goal("append_1k_always", "ratio", 0.7),
    Goal("read_1k", "value", 1000.0),
)


def _batches(value_size: int, distinct: int) -> list[bytes]:
    """A few distinct pre-built batches; the timed loops cycle through them."""
    out = []
    for b in range(distinct):
        records = [NewRecord(bytes([(b + i) % 251]) * value_size, key=b"k%d" % i) for i in range(RECORDS_PER_BATCH)]
        out.append(build_batch(records, timestamp=time.time_ns()))
    return out


def _sequence(batches: list[bytes], total_bytes: int) -> list[bytes]:
    count = max(4, total_bytes // len(batches[0]))
    return [batches[i % len(batches)] for i in range(count)]


async def _append_log(directory: Path, sequence: Sequence[bytes], policy: FlushPolicy) -> float:
    """Seconds to append ``sequence`` to a fresh log (open and close outside the timing)."""
    log_ = await Log.open_async(directory, LogConfig(flush_policy=policy))
    os.sync()  # start from no dirty backlog, as the baseline does
    try:
        started = time.perf_counter()
        for data in sequence:
            await log_.append(data, 1)
        elapsed = time.perf_counter() - started
    finally:
        await log_.close()
    return elapsed


def _append_raw(path: Path, sequence: Sequence[bytes], fsync_each: bool) -> float:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # a fresh file, as a new segment is
    os.sync()  # earlier rounds' dirty pages would otherwise slow whichever side runs next
    try:
        started = time.perf_counter()
        for data in sequence:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync_each:
                os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    return elapsed


def _append_metric(scratch: Path, name: str, value_size: int, policy: FlushPolicy, total: int, reps: int) -> Row:
    sequence = _sequence(_batches(value_size, 8), total)
    volume = sum(len(b) for b in sequence)
    ours: list[float] = []
    raw: list[float] = []
    fsync_each = policy is FlushPolicy.ALWAYS
    for rep in range(reps + 1):  # the first round warms the page cache and the allocator; it is not counted
        log_dir, raw_file = scratch / f"{name}-{rep}", scratch / f"{name}-{rep}.raw"
        if rep % 2:  # alternate which side goes first, so drift in the machine's state hits both alike
            raw_seconds = _append_raw(raw_file, sequence, fsync_each)
            log_seconds = asyncio.run(_append_log(log_dir, sequence, policy))
        else:
            log_seconds = asyncio.run(_append_log(log_dir, sequence, policy))
            raw_seconds = _append_raw(raw_file, sequence, fsync_each)
        _remove_tree(log_dir)
        raw_file.unlink()
        if rep:
            raw.append(volume / raw_seconds / MB)
            ours.append(volume / log_seconds / MB)
    log(f"{name}: log {median(ours):.0f} MB/s, raw {median(raw):.0f} MB/s ({len(sequence)} batches, {volume} bytes)")
    return Row(BENCH, name, median(ours), "MB/s", median(raw))


def _read_metric(scratch: Path, total: int, reps: int) -> Row:
    directory = scratch / "read_1k"
    sequence = _sequence(_batches(1024, 8), total)
    asyncio.run(_append_log(directory, sequence, FlushPolicy.NEVER))
    files = sorted(directory.glob("*.log"))
    volume = sum(f.stat().st_size for f in files)
    _read_raw(files)  # warm the page cache
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(reps):
        raw.append(volume / _timed(lambda: _read_raw(files)) / MB)
        ours.append(volume / _timed(lambda: _read_log(directory, volume)) / MB)
    _remove_tree(directory)
    log(f"read_1k: log {median(ours):.0f} MB/s, raw {median(raw):.0f} MB/s ({volume} bytes)")
    return Row(BENCH, "read_1k", median(ours), "MB/s", median(raw))


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _read_raw(files: Sequence[Path]) -> int:
    total = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while chunk := os.pread(fd, READ_CHUNK, position):
                position += len(chunk)
            total += position
        finally:
            os.close(fd)
    return total


def _read_log(directory: Path, expected: int) -> None:
    log_ = Log.open(directory, LogConfig(flush_policy=FlushPolicy.NEVER))
    try:
        offset, total = log_.start_offset, 0
        end = log_.end_offset
        while offset < end:
            data = log_.read(offset, READ_CHUNK)
            total += len(data)
            for _, header in iter_batches(data, verify=False):  # headers only: where the next read starts
                offset = header.next_offset
        if total != expected:
            raise AssertionError(f"read {total} bytes of {expected}")
    finally:
        asyncio.run(log_.close())


def _remove_tree(path: Path) -> None:
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and less data")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 5
    never_total = (256 if args.quick else 512) * MB
    always_total = (64 if args.quick else 128) * MB
    rows: list[Row] = []
    with scratch_dir("tidelog-bench-storage-") as scratch:
        log(f"scratch directory {scratch}, {reps} repetitions")
        for size, label in ((100, "100b"), (1024, "1k")):
            rows.append(_append_metric(scratch, f"append_{label}_never", size, FlushPolicy.NEVER, never_total, reps))
            rows.append(_append_metric(scratch, f"append_{label}_always", size, FlushPolicy.ALWAYS, always_total, reps))
        rows.append(_read_metric(scratch, never_total, reps))
    for row in rows:
        emit(row.document())
    by_metric = {row.metric: row for row in rows}
    checked = [
        {
            "metric": g.metric,
            "target": str(g),
            "value": round(by_metric[g.metric].value, 1),
            "met": g.met(by_metric[g.metric]),
        }
        for g in GOALS
    ]
    emit(
        {
            "bench": BENCH,
            "metric": "summary",
            "metrics": [{"metric": r.metric, "ratio": None if r.ratio is None else round(r.ratio, 3)} for r in rows],
            "targets": checked,
            "met": sum(1 for c in checked if c["met"]),
            "of": len(checked),
            "all_met": all(c["met"] for c in checked),
            "quick": args.quick,
        }
    )


if __name__ == "__main__":
    main()
