"""Writing in a Spark task, first half: the task's rows, grouped by the partition each goes to.

A task of the ``tidelog`` sink turns the ``value``, ``key`` and ``headers`` columns into binary Arrow columns,
decides each row's stream and partition, and groups the rows by (stream, partition) as Arrow tables
(:class:`TaskRows`); :mod:`~tidelog.spark.sink_commit` then appends each group in one transactional append.
The tables are slices and casts of the batches Spark hands the task (no Python object per row unless a row
needs partitioning by key), and each column comes out for the appender with one ``to_pylist``.

Partitions. A row's ``partition`` column wins; a row without one is placed as tidelog's producer places it
(:class:`~tidelog.client.DefaultPartitioner`): by the CRC-32 of its key modulo the stream's partition count,
or round robin when it has no key. The round robin starts at the task's own partition index, not at 0, so small
tasks spread over the partitions, and it is deterministic: a micro-batch Spark replays puts every row where it
went the first time, which exactly once needs when a commit wrote some partitions and not others. Partition
counts come from the brokers' metadata, asked once per task and stream, and only when some row needs one.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.client import Cluster
from tidelog.protocol.messages import StreamInfo
from tidelog.spark.reading import _new_loop
from tidelog.spark.schema import HEADERS_TYPE
from tidelog.spark.sink_options import SinkColumns, SinkOptions
from tidelog.spark.varint_columns import ramp

ROWS_SCHEMA = pa.schema([("value", pa.binary()), ("key", pa.binary()), ("headers", HEADERS_TYPE)])
"""The rows of one partition in a commit message: values, keys (null: none), headers (null: none)."""

Target = tuple[str, int]  # (stream, partition)


class SinkRowError(ValueError):
    """A row the sink cannot write (no stream to write it to, a negative partition, a header without a name)."""


@dataclass(frozen=True)
class PartitionRows:
    """A task's rows for one partition, in the order Spark gave them, as a table of :data:`ROWS_SCHEMA`."""

    stream: str
    partition: int
    rows: pa.Table


@dataclass(frozen=True)
class TaskRows:
    """A task's rows by partition, and the id of the streaming query it ran for (Spark's, from the task's local
    properties; None in a batch write)."""

    query_id: str | None
    parts: tuple[PartitionRows, ...]

    @property
    def count(self) -> int:
        return sum(part.rows.num_rows for part in self.parts)


def write_task(
    options: SinkOptions,
    columns: SinkColumns,
    batches: Iterator[pa.RecordBatch],
    *,
    task_index: int,
    query_id: str | None,
) -> TaskRows:
    """Group the rows of ``batches`` by their target partition (see the module docstring). ``task_index``
    (Spark's partition id of the task) is where round robin starts."""
    router = _Router(options, columns, task_index)
    groups: dict[Target, list[pa.RecordBatch]] = {}
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rows = _rows(batch, columns)
            targets, codes = router.route(batch, rows)
            if codes is None:
                groups.setdefault(targets[0], []).append(rows)
                continue
            for code, target in enumerate(targets):
                groups.setdefault(target, []).append(rows.filter(pc.equal(codes, pa.scalar(code, codes.type))))
    finally:
        router.close()
    parts = tuple(
        PartitionRows(stream, partition, pa.Table.from_batches(chunks, ROWS_SCHEMA))
        for (stream, partition), chunks in sorted(groups.items())
    )
    return TaskRows(query_id, parts)


def _rows(batch: pa.RecordBatch, columns: SinkColumns) -> pa.RecordBatch:
    """The batch's value, key and headers as :data:`ROWS_SCHEMA` (strings as their UTF-8 bytes)."""
    n = batch.num_rows
    value = batch.column(columns.value).cast(pa.binary())
    key = batch.column(columns.key).cast(pa.binary()) if columns.key else pa.nulls(n, pa.binary())
    if columns.headers:
        headers = batch.column(columns.headers).cast(HEADERS_TYPE)  # a map, or string values: one cast
        if headers.null_count < n and pc.any(pc.is_null(headers.flatten().field("key"))).as_py():
            raise SinkRowError(f"a header in column {columns.headers!r} has no name (a null key)")
    else:
        headers = pa.nulls(n, HEADERS_TYPE)
    return pa.RecordBatch.from_arrays([value, key, headers], schema=ROWS_SCHEMA)


class _Router:
    """Decides each row's (stream, partition); holds the task's round-robin counters and partition counts."""

    def __init__(self, options: SinkOptions, columns: SinkColumns, task_index: int) -> None:
        self.options = options
        self.columns = columns
        self.task_index = task_index
        self._next: dict[str, int] = {}  # per stream: the round robin's next position
        self._counts: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cluster: Cluster | None = None

    def route(self, batch: pa.RecordBatch, rows: pa.RecordBatch) -> tuple[list[Target], pa.Array | None]:
        """The distinct targets of the batch's rows, and for each row the index of its target (None when
        there is only one target: every row goes there)."""
        n = batch.num_rows
        streams = self._streams(batch)
        explicit = self._explicit_partitions(batch)
        keyed = rows.column("key").null_count < n
        if isinstance(streams, str) and explicit is None and not keyed:
            return self._round_robin(streams, n)  # the common case: no per-row Python work
        keys = rows.column("key").to_pylist() if keyed else [None] * n
        stream_of = [streams] * n if isinstance(streams, str) else streams
        partition_of = explicit if explicit is not None else [None] * n
        index: dict[Target, int] = {}
        targets: list[Target] = []
        codes: list[int] = []
        for stream, key, partition in zip(stream_of, keys, partition_of, strict=True):
            if partition is None:
                count = self._count(stream)
                if key is None:
                    position = self._next.get(stream, self.task_index)
                    self._next[stream] = position + 1
                    partition = position % count
                else:
                    partition = zlib.crc32(key) % count
            target = (stream, partition)
            code = index.get(target)
            if code is None:
                code = index[target] = len(targets)
                targets.append(target)
            codes.append(code)
        return targets, pa.array(codes, pa.int32()) if len(targets) > 1 else None

    def _round_robin(self, stream: str, n: int) -> tuple[list[Target], pa.Array | None]:
        count = self._count(stream)
        first = self._next.get(stream, self.task_index)
        self._next[stream] = first + n
        if count == 1 or n == 1:
            return [(stream, first % count)], None
        targets = [(stream, (first + i) % count) for i in range(min(n, count))]
        position = ramp(n)  # row i goes to targets[i % count]: i - (i // count) * count, in kernels
        divisor = pa.scalar(count, position.type)
        return targets, pc.subtract(position, pc.multiply(pc.divide(position, divisor), divisor))

    def _streams(self, batch: pa.RecordBatch) -> str | list[str]:
        """The stream of every row (the option's), or of each row (the ``stream`` column)."""
        if self.options.stream is not None:
            return self.options.stream
        assert self.columns.stream is not None
        column = batch.column(self.columns.stream)
        if column.null_count:
            raise SinkRowError(f"a row has a null {self.columns.stream!r} and the sink has no 'stream' option")
        distinct = pc.unique(column)
        if len(distinct) == 1:
            return str(distinct[0].as_py())
        return [str(stream) for stream in column.to_pylist()]

    def _explicit_partitions(self, batch: pa.RecordBatch) -> list[int | None] | None:
        if self.columns.partition is None:
            return None
        column = batch.column(self.columns.partition)
        if column.null_count == len(column):
            return None
        if pc.any(pc.less(column, 0)).as_py():
            raise SinkRowError(f"a row's {self.columns.partition!r} is negative")
        return [None if partition is None else int(partition) for partition in column.to_pylist()]

    def _count(self, stream: str) -> int:
        """The stream's partition count, from the brokers once per task."""
        count = self._counts.get(stream)
        if count is None:
            if self._loop is None:
                self._loop = _new_loop()
            info = self._loop.run_until_complete(self._stream(stream))
            count = self._counts[stream] = len(info.partitions)
            if count == 0:
                raise SinkRowError(f"stream {stream!r} has no partitions")
        return count

    async def _stream(self, stream: str) -> StreamInfo:
        if self._cluster is None:
            self._cluster = Cluster(
                list(self.options.brokers), ssl=self.options.ssl(), credentials=self.options.credentials
            )
        return await self._cluster.stream(stream)

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            if self._cluster is not None:
                self._loop.run_until_complete(self._cluster.close())
        finally:
            self._loop.close()
