"""The ``tidelog`` data source: :class:`TidelogDataSource`, its batch reader and its streaming reader.

Where each piece runs. PySpark creates the data source on the driver when a query is defined (options are
checked there: :func:`~tidelog.spark.options.parse_options`), and again in each Python process that needs it:

- :class:`TidelogBatchReader.partitions` and every method of :class:`TidelogStreamReader` but ``read`` run on
  the driver (a streaming query keeps one reader for its lifetime, in PySpark's stream reader runner, and with
  it one :class:`~tidelog.spark.topology.Topology`, closed by :meth:`TidelogStreamReader.stop`);
- ``read`` runs in the tasks, on a pickled copy of the reader, and reads one
  :class:`~tidelog.spark.planning.OffsetRange` (:func:`~tidelog.spark.reading.read_range`).

So readers open nothing when built (PySpark builds and pickles a stream reader only to ship its ``read``) and
leave their connections out of what they pickle.

Streaming (``spark.readStream.format("tidelog")``): the initial offsets come from ``startingTimestamp`` or
``startingOffsets`` (default ``latest``); each trigger's end is every partition's high watermark, or less under
``maxOffsetsPerTrigger`` (Spark 4.2's admission control: :meth:`TidelogStreamReader.latestOffset` is given the
read limit; ``Trigger.AvailableNow`` fixes the high watermarks at the start and reads up to them in as many
bounded micro-batches as it takes). The high watermarks of the last trigger are reported as the latest offsets,
so Spark's progress shows how far behind the query is. ``minOffsetsPerTrigger`` holds a trigger back (its end
is its start: no micro-batch) until that many offsets wait or ``maxTriggerDelay`` has passed since the last
micro-batch, as Kafka's source does. Spark's checkpoint holds the offsets, and a restarted query resumes from
it; with ``groupId`` (or ``groupIdPrefix``) the reader also stores each processed micro-batch's end offsets as that
consumer group's committed offsets (when Spark asks for the next micro-batch's end, and at ``commit``), so
``tidelog group describe`` shows the query's lag like any consumer's.
Progress metrics: PySpark's Python stream reader has no hook for custom metrics in ``StreamingQueryProgress``
(Kafka's ``avgOffsetsBehindLatest``); the latest offsets reported beside each micro-batch's end offsets carry
the same lag.

Batch (``spark.read.format("tidelog")``): ``startingOffsets`` (default ``earliest``) or ``startingTimestamp``
to ``endingOffsets`` (default ``latest``), resolved when the query is planned.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from tidelog.protocol.errors import TidelogError
from tidelog.protocol.messages import StreamInfo
from tidelog.spark.options import (
    EARLIEST,
    GROUP_SUFFIX,
    LATEST,
    Position,
    SourceOptionError,
    SourceOptions,
    parse_options,
)
from tidelog.spark.planning import (
    Bounds,
    OffsetRange,
    Offsets,
    TopicPartition,
    admit,
    check_ranges,
    from_json,
    split,
    to_json,
    waits,
)
from tidelog.spark.reading import DataLossError, read_range
from tidelog.spark.remote import plan_remote
from tidelog.spark.replicas import assign
from tidelog.spark.schema import SPARK_SCHEMA, partition_subject
from tidelog.spark.sink import batch_writer, stream_writer
from tidelog.spark.topology import Topology

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def register(spark: SparkSession) -> None:
    """Register the ``tidelog`` data source with ``spark``: needed only where PySpark does not find
    ``pyspark_tidelog`` on its workers' Python path by itself (see the package docstring)."""
    spark.dataSource.register(TidelogDataSource)


class TidelogDataSource(DataSource):
    """``format("tidelog")``: records of tidelog streams, in batch and streaming queries, and the sink that
    writes them. See the package docstring for the options and :mod:`tidelog.spark.schema` for the columns."""

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    @property
    def parsed(self) -> SourceOptions:
        """The options, checked (PySpark asks the data source not to override ``__init__``)."""
        return parse_options(self.options)

    def schema(self) -> StructType:
        self.parsed  # noqa: B018 - bad options fail here, when the query is defined, not when it starts
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        self.parsed.check_kind("batch")
        return TidelogBatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        self.parsed.check_kind("stream")
        return TidelogStreamReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("tidelog")``: the sink (:mod:`tidelog.spark.sink`), with its own options."""
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("tidelog")``, exactly once; ``overwrite`` is complete mode (see the sink)."""
        return stream_writer(self.options, schema)


class TidelogBatchReader(DataSourceReader):
    """A batch read: offset ranges resolved at planning, split into tasks."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        topology = Topology(self.options)
        try:
            streams = topology.streams()
            bounds = topology.bounds(streams.values())
            start = _resolve_start(self.options, topology, streams, bounds, default="earliest")
            end = _resolve(self.options.ending, "endingOffsets", bounds)
        finally:
            topology.close()
        check_ranges(start, end)
        ranges = [OffsetRange(s, p, start[(s, p)], end[(s, p)], _subject(streams, s, p)) for s, p in sorted(end)]
        return list(_split(self.options, ranges, streams))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):  # PySpark plans one empty partition when there are none
            return iter(())
        return read_range(self.options, partition)


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read: offsets per trigger, bounded by admission control. Runs on the driver but for ``read``."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._topology: Topology | None = None
        self._streams: dict[str, StreamInfo] = {}
        self._latest: Offsets | None = None  # high watermarks of the last trigger: what Spark reports as latest
        self._available_now: Offsets | None = None  # Trigger.AvailableNow: the high watermarks to stop at
        self._last_batch: float | None = None  # monotonic time of the last micro-batch (or the first trigger)
        self.group = group_of(options)  # where the query's progress is stored as a consumer group's; None: nowhere
        self._stored: Offsets | None = None  # the offsets last stored as the group's

    def __getstate__(self) -> dict[str, Any]:
        return {
            "options": self.options,
            "_topology": None,
            "_streams": {},
            "_latest": None,
            "_available_now": None,
            "_last_batch": None,
            "group": self.group,
            "_stored": None,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = Topology(self.options)
        return self._topology

    def _refresh(self) -> dict[TopicPartition, Bounds]:
        self._streams = self.topology.streams()
        return self.topology.bounds(self._streams.values())

    def initialOffset(self) -> dict[str, dict[str, int]]:
        bounds = self._refresh()
        return to_json(_resolve_start(self.options, self.topology, self._streams, bounds, default="latest"))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = from_json(start)
        self._store_progress(begin)  # everything below start is processed: the last micro-batch is committed
        bounds = self._refresh()
        latest = {tp: b.high_watermark for tp, b in bounds.items()}
        self._latest = dict(latest)
        if self._available_now is not None:
            latest = {tp: min(hw, self._available_now.get(tp, bounds[tp].log_start)) for tp, hw in latest.items()}
        for tp, offset in begin.items():
            if tp not in latest:
                continue  # a stream no longer matched (or deleted): nothing more to read from it
            if latest[tp] < offset:
                if self.options.fail_on_data_loss:
                    stream, partition = tp
                    raise DataLossError(
                        f"{stream}/{partition}: the query has read up to offset {offset} but the log now ends at "
                        f"{latest[tp]} (truncated by an unclean leader election?); set failOnDataLoss=false to "
                        "continue from the new end"
                    )
                latest[tp] = offset
        # New partitions (a stream that appeared under streamPattern) start from their log start.
        begin_all = {tp: begin.get(tp, bounds[tp].log_start) for tp in latest}
        now = time.monotonic()
        if self._last_batch is None:
            self._last_batch = now
        waited_ms = (now - self._last_batch) * 1000
        min_offsets = None if self._available_now is not None else self.options.min_offsets_per_trigger
        if waits(begin_all, latest, min_offsets, waited_ms, self.options.max_trigger_delay_ms):
            return to_json(begin)  # not enough yet: no micro-batch this trigger
        end = admit(begin_all, latest, limit.max_rows) if isinstance(limit, ReadMaxRows) else latest
        if any(end[tp] > begin_all[tp] for tp in end):
            self._last_batch = now
        return to_json(end)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_json(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = self._refresh()
        self._available_now = {tp: b.high_watermark for tp, b in bounds.items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = from_json(start), from_json(end)
        new = [tp for tp in stop if tp not in begin]
        if new or any(s not in self._streams for s, _ in stop):
            bounds = self._refresh()  # a restarted query plans its first batch before asking for offsets
            begin = {**{tp: bounds[tp].log_start for tp in new if tp in bounds}, **begin}
        ranges = [
            OffsetRange(s, p, begin.get((s, p), 0), offset, _subject(self._streams, s, p))
            for (s, p), offset in sorted(stop.items())
            if offset > begin.get((s, p), 0)
        ]
        return list(_split(self.options, ranges, self._streams))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark processed everything below ``end``: with ``groupId``/``groupIdPrefix``, store it as the group's
        committed offsets (:meth:`_store_progress`)."""
        self._store_progress(from_json(end))

    def _store_progress(self, processed: Offsets) -> None:
        """Store ``processed`` as the group's committed offsets when they changed since the last time.

        Called from :meth:`latestOffset`, whose ``start`` is the end of the last micro-batch — Spark asks for the
        next one only once that one is committed — and from :meth:`commit`, which Spark calls for a micro-batch
        only when it plans the next one *with data*: alone it would leave an idle query's group a micro-batch
        behind, and the last one of ``Trigger.AvailableNow`` never stored. Spark's checkpoint, not the group,
        decides where a restarted query resumes. A write the brokers could not take now (a failover) is logged
        and tried again at the next trigger; one they refuse (no permission on the group's cursors) fails the
        query, naming the option."""
        if self.group is None or processed == self._stored:
            return
        try:
            self.topology.commit_group(self.group, processed)
        except TidelogError as exc:
            if exc.retriable:
                log.warning("could not store the query's progress as group %s now: %s", self.group, exc)
                return
            option = "groupId" if self.options.group_id is not None else "groupIdPrefix"
            raise SourceOptionError(
                option, f"storing the query's progress as group {self.group!r} failed: {exc}"
            ) from exc
        self._stored = dict(processed)

    def stop(self) -> None:
        if self._topology is not None:
            self._topology.close()
            self._topology = None


# -- shared by both readers ---------------------------------------------------------------------------------------


def group_of(options: SourceOptions) -> str | None:
    """The consumer group a streaming query's progress is stored as: ``groupId``, or ``<groupIdPrefix>-<random>``,
    new for each run (each stream reader), as Kafka's source names its groups."""
    if options.group_id_prefix is not None:
        return f"{options.group_id_prefix}-{secrets.token_hex(GROUP_SUFFIX // 2)}"
    return options.group_id


def _check_schema(schema: StructType) -> None:
    if schema != SPARK_SCHEMA:
        raise SourceOptionError(
            "schema", f"the tidelog source has a fixed schema ({SPARK_SCHEMA.simpleString()}); do not set another"
        )


def _resolve_start(
    options: SourceOptions,
    topology: Topology,
    streams: Mapping[str, StreamInfo],
    bounds: Mapping[TopicPartition, Bounds],
    *,
    default: Position,
) -> Offsets:
    """Concrete starting offsets: ``startingTimestamp`` (ms) first, as in Kafka's source, else
    ``startingOffsets``, else ``default``."""
    if options.starting_timestamp_ms is not None:
        return topology.offsets_at(streams.values(), options.starting_timestamp_ms * 1_000_000)
    return _resolve(options.starting if options.starting is not None else default, "startingOffsets", bounds)


def _resolve(position: Position, option: str, bounds: Mapping[TopicPartition, Bounds]) -> Offsets:
    """``earliest``/``latest``/JSON → an offset per partition of ``bounds``, which JSON must name exactly."""
    if position == "earliest":
        return {tp: b.log_start for tp, b in bounds.items()}
    if position == "latest":
        return {tp: b.high_watermark for tp, b in bounds.items()}
    assert isinstance(position, dict)
    extra = sorted(tp for tp in position if tp not in bounds)
    if extra:
        named = ", ".join(f"{s}/{p}" for s, p in extra)
        raise SourceOptionError(option, f"names {named}, which the query does not read (no such stream or partition)")
    missing = sorted(tp for tp in bounds if tp not in position)
    if missing:
        named = ", ".join(f"{s}/{p}" for s, p in missing)
        raise SourceOptionError(option, f"gives no offset for {named}: name every partition (-2 earliest, -1 latest)")
    out: Offsets = {}
    for tp, offset in position.items():
        b = bounds[tp]
        if offset > b.high_watermark:
            stream, partition = tp
            raise SourceOptionError(
                option, f"offset {offset} of {stream}/{partition} lies past its end ({b.high_watermark})"
            )
        out[tp] = b.log_start if offset == EARLIEST else b.high_watermark if offset == LATEST else offset
    return out


def _subject(streams: Mapping[str, StreamInfo], stream: str, partition: int) -> str:
    info = streams.get(stream)
    return partition_subject(info.subject if info is not None else stream, partition)


def _split(options: SourceOptions, ranges: list[OffsetRange], streams: Mapping[str, StreamInfo]) -> list[OffsetRange]:
    tasks = split(
        [r for r in ranges if r.size > 0],
        max_offsets=options.max_offsets_per_split,
        min_partitions=options.min_partitions,
    )
    tasks = plan_remote(options, tasks)  # with tieredStore: offloaded offsets read from the store by the tasks
    return assign(tasks, streams, options.read_from)  # readFrom: which replica each task fetches from
