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
process that commits each micro-batch. ``write`` runs in the tasks and groups their rows by partition
(:mod:`~tidelog.spark.writing`); ``commit`` runs on the driver and appends each partition's rows in one
transactional append, at most once per micro-batch (:mod:`~tidelog.spark.sink_commit`, which also says what
that costs: every row passes through the driver). ``abort`` has nothing to undo: the tasks wrote nothing.

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
from tidelog.spark.sink_commit import QUERY_ID_PROPERTY, commit_stream_batch, commit_write
from tidelog.spark.sink_options import SinkColumns, SinkOptionError, SinkOptions, check_columns, parse_sink_options
from tidelog.spark.writing import TaskRows, write_task


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
    columns = check_columns(schema, parsed)
    _check_stream(parsed)
    return TidelogBatchWriter(parsed, columns)


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("tidelog")``: tasks group rows, the driver appends each micro-batch exactly once."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskRows:
        context = TaskContext.get()
        return write_task(
            self.options,
            self.columns,
            iterator,
            task_index=context.partitionId() if context is not None else 0,
            query_id=context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None,
        )

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        commit_stream_batch(self.options, messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: tasks append nothing, and the driver appends only in ``commit``."""


class TidelogBatchWriter(DataSourceArrowWriter):
    """``write.format("tidelog")``: tasks group rows, the driver appends them, one append per partition."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskRows:
        context = TaskContext.get()
        index = context.partitionId() if context is not None else 0
        return write_task(self.options, self.columns, iterator, task_index=index, query_id=None)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        commit_write(self.options, messages)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Nothing to undo: tasks append nothing."""


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
