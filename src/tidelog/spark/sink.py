"""The ``tidelog`` sink: ``df.writeStream.format("tidelog")`` exactly once, and ``df.write.format("tidelog")``.

::

    counts.writeStream.format("tidelog")
        .option("brokers", "127.0.0.1:9293")
        .option("stream", "word-counts")              # or a stream column per row
        .option("checkpointLocation", "/var/lib/spark/word-counts")
        .outputMode("complete")
        .start()

The DataFrame needs a ``value`` column and may have ``key``, ``headers``, ``partition`` and ``stream``
(:mod:`~tidelog.spark.sink_options` has the options and column types).

Where each piece runs. PySpark calls :meth:`TidelogDataSource.streamWriter
<tidelog.spark.source.TidelogDataSource.streamWriter>` (or ``writer``) on the driver when the query starts —
bad options and columns fail there, and so does a ``stream`` option naming no stream — and again in the
process that commits each micro-batch. ``write`` runs in the tasks, on the executors: it groups the task's rows
by partition (:mod:`~tidelog.spark.writing`) and appends each group in one transactional append, fenced by the
partition's registers so that a task Spark runs again, or a micro-batch it replays, writes nothing twice
(:mod:`~tidelog.spark.sink_commit`, :mod:`~tidelog.spark.sink_fence`; the design and its proof sketch are in
``docs/design/spark-sink.md``). ``commit`` on the driver checks the tasks' messages and writes nothing;
``abort`` has nothing to undo: what the tasks appended stays, and a replay of the micro-batch skips it.

Output modes. ``append``, and ``complete``, where each micro-batch appends the whole result table again, as
Kafka's sink does: a changelog of snapshots, which a compacted stream keyed by the grouping columns turns into
the current table. PySpark does not offer ``update`` to Python sinks. A batch write takes ``mode("append")``;
``overwrite`` is refused (a log is appended to).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from tidelog.client import Cluster
from tidelog.spark.reading import _new_loop
from tidelog.spark.sink_commit import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    SinkCommitError,
    TaskCommit,
    check_batch,
    commit_task,
)
from tidelog.spark.sink_fence import Fence
from tidelog.spark.sink_options import SinkColumns, SinkOptionError, SinkOptions, check_columns, parse_sink_options
from tidelog.spark.writing import write_task

FAIL_AFTER_APPEND_PROPERTY = "tidelog.sink.failAfterAppend"
"""Fault injection for tests: a local property naming a micro-batch id (or ``write`` for a batch write) whose
tasks' first attempts fail right after appending — the crash exactly once is about."""


def stream_writer(options: Mapping[str, str], schema: StructType) -> TidelogStreamWriter:
    """The writer of a streaming query, checked (see the module docstring)."""
    parsed = parse_sink_options(options)
    columns = check_columns(schema, parsed)
    _check_stream(parsed)
    return TidelogStreamWriter(parsed, columns)


def batch_writer(options: Mapping[str, str], schema: StructType, overwrite: bool) -> TidelogBatchWriter:
    """The writer of a batch write, checked; ``overwrite`` (``mode("overwrite")``) is refused."""
    parsed = parse_sink_options(options)
    if overwrite:
        raise SinkOptionError("mode", "a tidelog stream is only ever appended to: use mode('append')")
    if any(name.lower() == "registerslots" for name in options):
        raise SinkOptionError("registerSlots", "applies to streaming queries only (a batch write is not fenced)")
    columns = check_columns(schema, parsed)
    _check_stream(parsed)
    return TidelogBatchWriter(parsed, columns)


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("tidelog")``: each task appends its rows, fenced; the driver checks each micro-batch."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        context = TaskContext.get()
        if context is None:
            raise SinkCommitError("the tidelog sink's write runs in a Spark task only")
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_id is None or not batch_id.isdigit():
            raise SinkCommitError(
                f"the task has no streaming query id or micro-batch id (Spark's local properties "
                f"{QUERY_ID_PROPERTY}={query_id!r}, {BATCH_ID_PROPERTY}={batch_id!r})"
            )
        task = context.partitionId()
        rows = write_task(self.options, self.columns, iterator, task_index=task, query_id=query_id)
        fence = Fence(query_id, int(batch_id), task, self.options.slots)
        message = commit_task(self.options, rows, fence, task)
        _maybe_fail(context, batch_id)
        return message

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        check_batch(messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what the tasks appended stays, and a replay of the micro-batch skips it."""


class TidelogBatchWriter(DataSourceArrowWriter):
    """``write.format("tidelog")``: each task appends its rows, one transactional append per partition."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        rows = write_task(self.options, self.columns, iterator, task_index=task, query_id=None)
        message = commit_task(self.options, rows, None, task)
        if context is not None:
            _maybe_fail(context, "write")
        return message

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        check_batch(messages, None)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Nothing to undo, and nothing can be: what the tasks appended stays (see the design notes)."""


def _maybe_fail(context: TaskContext, run: str) -> None:
    """The test hook :data:`FAIL_AFTER_APPEND_PROPERTY`: fail the first attempt of a task of ``run``."""
    if context.getLocalProperty(FAIL_AFTER_APPEND_PROPERTY) == run and context.attemptNumber() == 0:
        raise SinkCommitError(f"{FAIL_AFTER_APPEND_PROPERTY}={run}: this attempt fails after appending (a test)")


def _check_stream(options: SinkOptions) -> None:
    """A ``stream`` option must name a stream that exists: a typo fails when the query starts, not at its first
    commit. (Streams named by a ``stream`` column are checked at each commit, before anything is written.)"""
    if options.stream is None:
        return
    stream = options.stream

    async def exists() -> bool:
        cluster = Cluster(list(options.brokers), ssl=options.ssl(), credentials=options.credentials)
        try:
            meta = await cluster.metadata([stream])
        finally:
            await cluster.close()
        return any(info.name == stream and info.error is None for info in meta.streams)

    loop = _new_loop()
    try:
        found = loop.run_until_complete(exists())
    finally:
        loop.close()
    if not found:
        raise SinkOptionError("stream", f"no stream named {stream!r} on {','.join(options.brokers)}")
