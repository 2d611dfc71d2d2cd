"""Reading in a Spark task: one partition's offset range, fetched by a consumer and handed on as Arrow batches.

A task runs in a PySpark worker process, a separate Python process on the executor, so it opens its own
connections: a :class:`~tidelog.client.Consumer` of the one partition, on an event loop of its own driven
from the task's thread (``run_until_complete`` per fetch; between fetches the generator is suspended in Spark's
hands while the consumer's next fetch is already in flight, so the broker prepares the next response while
Spark takes this one). The consumer reads committed records only (below the high watermark) and checks every
batch's CRC; :class:`~tidelog.spark.columns.ColumnBuilder` turns the batches into columns, and a batch of about
:data:`TARGET_BYTES` is yielded at a time: large enough that Spark's per-batch costs vanish, small enough to
stream.

A task of offloaded segments (planned with the ``tieredStore`` option) reads them from the tiered store instead,
through :class:`~tidelog.spark.remote.SegmentScan`: no broker is involved, and many such tasks read in parallel.
With ``readFrom`` the consumer fetches from the in-sync follower planned for the task, or with ``nearest`` one on
this host (:mod:`tidelog.spark.replicas`).

Lost data. Offsets the plan counted on may be gone when the task runs: retention deleted them (the fetch is out
of range), or an unclean leader election truncated the log (the high watermark stays below the range's end).
With ``failOnDataLoss`` (the default) the task fails with :class:`DataLossError`, naming the offsets; without,
it skips them: an out-of-range fetch resumes from the log start, and a range whose end does not appear within
:data:`STALL_LIMIT` ends where the log ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pyarrow as pa

from tidelog.client import Cluster, Consumer
from tidelog.protocol.errors import OffsetOutOfRangeError
from tidelog.spark.columns import ColumnBuilder
from tidelog.spark.options import SourceOptions, TieredSource
from tidelog.spark.planning import OffsetRange
from tidelog.spark.remote import SegmentLost, SegmentScan
from tidelog.spark.replicas import nearest

FETCH_MAX_BYTES = 4 * 1024 * 1024
TARGET_BYTES = 8 * 1024 * 1024
STALL_LIMIT = 30.0
"""Seconds a range's end may stay above the partition's high watermark (a failover settling) before the
offsets in between count as lost."""


class DataLossError(RuntimeError):
    """Offsets a query planned to read are no longer in the log (``failOnDataLoss=false`` skips them)."""


def read_range(options: SourceOptions, task: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The records of ``task`` (``[start, end)`` of one partition) as Arrow batches of the source's schema."""
    if task.end <= task.start:
        return
    if task.segments and options.tiered is not None:
        yield from _read_segments(options, options.tiered, task)
        return
    loop = _new_loop()
    cluster = Cluster(list(options.brokers), ssl=options.ssl(), credentials=options.credentials)
    try:
        replica = loop.run_until_complete(nearest(cluster, task)) if options.read_from == "nearest" else task.replica
    except BaseException:
        loop.run_until_complete(cluster.close())
        loop.close()
        raise
    consumer = Consumer(
        cluster=cluster,
        stream=task.stream,
        partitions=[task.partition],
        start=task.start,
        max_bytes=FETCH_MAX_BYTES,
        auto_offset_reset="error" if options.fail_on_data_loss else "earliest",
        replica=replica,
    )
    builder = ColumnBuilder(task.stream, task.partition, task.subject, include_headers=options.include_headers)
    try:
        loop.run_until_complete(consumer.start())
        stalled_since: float | None = None
        while (position := consumer.position(task.partition)) < task.end:
            try:
                batches = loop.run_until_complete(consumer.poll())
            except OffsetOutOfRangeError as exc:
                raise DataLossError(
                    f"{task.stream}/{task.partition}: offsets from {position} (to read up to {task.end}) are no "
                    f"longer in the log ({exc}); set failOnDataLoss=false to skip lost offsets"
                ) from exc
            for batch in batches or ():
                builder.add(batch, task.end)
            if batches:
                stalled_since = None
            elif consumer.high_watermark(task.partition) <= consumer.position(task.partition):
                now = time.monotonic()
                stalled_since = now if stalled_since is None else stalled_since
                if now - stalled_since > STALL_LIMIT:
                    if options.fail_on_data_loss:
                        raise DataLossError(
                            f"{task.stream}/{task.partition}: offsets {consumer.position(task.partition)} to "
                            f"{task.end} were planned but the log now ends before them (truncated by an unclean "
                            "leader election?); set failOnDataLoss=false to skip lost offsets"
                        )
                    break
            if builder.size >= TARGET_BYTES:
                yield builder.build()
        if builder.rows:
            yield builder.build()
    finally:
        try:
            loop.run_until_complete(consumer.close())
            loop.run_until_complete(cluster.close())
        finally:
            loop.close()


def _read_segments(options: SourceOptions, tiered: TieredSource, task: OffsetRange) -> Iterator[pa.RecordBatch]:
    """:func:`read_range` for a task of offloaded segments: read from the tiered store, no broker involved.
    Offsets the store no longer has (retention dropped their segment after the plan) are lost data."""
    loop = _new_loop()
    scan = SegmentScan(tiered, task, FETCH_MAX_BYTES)
    builder = ColumnBuilder(task.stream, task.partition, task.subject, include_headers=options.include_headers)
    try:
        while scan.position < task.end:
            try:
                batches = loop.run_until_complete(scan.next())
            except SegmentLost as exc:
                if options.fail_on_data_loss:
                    raise DataLossError(
                        f"{task.stream}/{task.partition}: {exc}; set failOnDataLoss=false to skip lost offsets"
                    ) from exc
                scan.skip(exc.last + 1)
                continue
            for batch in batches:
                builder.add(batch, task.end)
            if builder.size >= TARGET_BYTES:
                yield builder.build()
        if builder.rows:
            yield builder.build()
    finally:
        scan.close()
        loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
