"""The ``tidelog`` sink in a real local Spark against a real broker: streaming exactly once, batch writes, errors.

Streaming queries read a tidelog stream through the ``tidelog`` source (a replayable source, as exactly once
requires) and write another through the sink, with ``Trigger.AvailableNow`` so that each run ends by itself.
What landed is read back with the tidelog consumer and compared, record by record, with what the input holds.

Crashes are real or staged where they leave their trace: tasks that fail right after appending (the sink's test
hook, a local property), so that Spark fails the micro-batch and the restarted query runs it again; a driver
that died after one task appended (that task's commit, run by the test); and a driver that died after the
sink's commit and before Spark's (the micro-batch's entry in the checkpoint's commit log deleted, so the
restarted query runs that micro-batch again, the offsets log still having it).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql.utils import CapturedException

from tidelog.client import Appender, LoopThread, TidelogClient
from tidelog.protocol.labels import LabelSet
from tidelog.spark.sink import FAIL_AFTER_APPEND_PROPERTY
from tidelog.spark.sink_commit import commit_task
from tidelog.spark.sink_fence import DEFAULT_SLOTS, Fence, slot_label
from tidelog.spark.sink_options import SinkOptions
from tidelog.spark.writing import ROWS_SCHEMA, PartitionRows, TaskRows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.slow

QUERY_TIMEOUT = 180.0
Record = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]  # partition, key, value, headers


def produce(client: TidelogClient, stream: str, partition: int, count: int, *, first: int = 0) -> None:
    with client.producer() as producer:
        futures = [
            producer.send(stream, b"v-%d-%d" % (partition, i), key=b"k%d" % (i % 5), partition=partition)
            for i in range(first, first + count)
        ]
        for future in futures:
            future.result(30)


def records(client: TidelogClient, stream: str) -> list[Record]:
    """Every record of ``stream``, in partition then offset order."""
    with client.consumer(stream, stop_at_end=True) as consumer:
        found = [(r.partition, r.offset, r.key, r.value, r.headers) for r in consumer]
    return [(partition, key, value, headers) for partition, _, key, value, headers in sorted(found)]


def registers(broker_thread: LoopThread, brokers: str, stream: str, partitions: int) -> list[LabelSet]:
    async def read() -> list[LabelSet]:
        async with Appender(brokers) as appender:
            return [(await appender.registers(stream, p)).registers for p in range(partitions)]

    return broker_thread.run(read(), timeout=30)


def source(spark: SparkSession, brokers: str, stream: str, **options: object) -> DataFrame:
    reader = spark.readStream.format("tidelog").option("brokers", brokers).option("streams", stream)
    reader = reader.option("startingOffsets", "earliest")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def start(df: DataFrame, brokers: str, stream: str, checkpoint: Path) -> StreamingQuery:
    writer = df.writeStream.format("tidelog").option("brokers", brokers).option("stream", stream)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()


def run_to_end(df: DataFrame, brokers: str, stream: str, checkpoint: Path) -> StreamingQuery:
    """Write ``df`` to ``stream`` with Trigger.AvailableNow until the query stops by itself."""
    query = start(df, brokers, stream, checkpoint)
    assert query.awaitTermination(QUERY_TIMEOUT), "the AvailableNow query did not finish in time"
    assert query.exception() is None, query.exception()
    return query


def batches_run(query: StreamingQuery) -> dict[int, int]:
    """The micro-batches this run of the query executed, with their input rows."""
    return {int(p["batchId"]): int(p["numInputRows"]) for p in query.recentProgress}


def failure(action: Callable[[], object]) -> str:
    with pytest.raises((PySparkException, CapturedException)) as caught:
        action()
    return str(caught.value)


# -- streaming -----------------------------------------------------------------------------------------------------


def test_streaming_sink_writes_every_row_exactly_once(
    spark: SparkSession,
    brokers: str,
    client: TidelogClient,
    broker_thread: LoopThread,
    stream_name: str,
    tmp_path: Path,
) -> None:
    source_stream, sink_stream = stream_name + "-in", stream_name + "-out"
    client.admin.create_stream(source_stream, partitions=2)
    client.admin.create_stream(sink_stream, partitions=3)
    produce(client, source_stream, 0, 40)
    produce(client, source_stream, 1, 30)
    df = source(spark, brokers, source_stream, maxOffsetsPerTrigger=25).selectExpr(
        "IF(offset % 4 = 0, NULL, key) AS key",  # a quarter without a key: round robin
        "concat(value, '!') AS value",
        "array(named_struct('key', 'from', 'value', CAST(CAST(offset AS STRING) AS BINARY))) AS headers",
    )
    query = run_to_end(df, brokers, sink_stream, tmp_path / "checkpoint")
    assert [n for n in batches_run(query).values() if n] == [25, 25, 20]  # three micro-batches, three commits

    written = records(client, sink_stream)
    with client.consumer(source_stream, stop_at_end=True) as consumer:
        read = [(r.offset, r.key, r.value) for r in consumer]
    want = Counter(
        (None if offset % 4 == 0 else key, value + b"!", (("from", str(offset).encode()),))
        for offset, key, value in read
    )
    assert Counter((key, value, headers) for _, key, value, headers in written) == want  # each once, nothing else
    assert len(written) == 70
    for partition, key, _, _ in written:
        if key is not None:
            assert partition == zlib.crc32(key) % 3  # where tidelog's producer puts the key
    assert {partition for partition, key, _, _ in written if key is None} == {0, 1, 2}

    last = max(batches_run(query))
    labels = registers(broker_thread, brokers, sink_stream, 3)
    slots = {slot_label(str(query.id), s) for s in range(DEFAULT_SLOTS)}
    assert all(label and set(label.names()) <= slots for label in labels)  # the query's slots, nothing else
    assert max(int(label.value.split(".")[0]) for labels_of in labels for label in labels_of) == last


def test_a_micro_batch_replayed_after_a_crash_is_written_once(
    spark: SparkSession,
    brokers: str,
    client: TidelogClient,
    broker_thread: LoopThread,
    stream_name: str,
    tmp_path: Path,
) -> None:
    """Two crashes of the driver, each in the window exactly once is about, and a restart after each:

    1. after task 0 of micro-batch 1 appended and before task 1 did (staged with the task's own commit);
    2. after the sink's commit of micro-batch 1 and before Spark's (its commit log entry deleted).
    """
    source_stream, sink_stream = stream_name + "-in", stream_name + "-out"
    client.admin.create_stream(source_stream, partitions=2)
    client.admin.create_stream(sink_stream, partitions=2)
    checkpoint = tmp_path / "checkpoint"

    def upper() -> DataFrame:  # each row to the partition of the same number: micro-batches are known exactly
        return source(spark, brokers, source_stream).selectExpr("key", "upper(value) AS value", "partition")

    for p in (0, 1):
        produce(client, source_stream, p, 10)
    first = run_to_end(upper(), brokers, sink_stream, checkpoint)
    assert batches_run(first) == {0: 20}

    # Crash 1: task 0 of micro-batch 1 (it reads source partition 0) appended its rows, task 1 never ran.
    for p in (0, 1):
        produce(client, source_stream, p, 10, first=10)
    rows_for_0 = [(b"k%d" % (i % 5), b"V-0-%d" % i) for i in range(10, 20)]
    keys, values = zip(*rows_for_0, strict=True)
    table = pa.Table.from_arrays(
        [pa.array(values, pa.binary()), pa.array(keys, pa.binary()), pa.nulls(10, ROWS_SCHEMA.field("headers").type)],
        schema=ROWS_SCHEMA,
    )
    staged = TaskRows(str(first.id), (PartitionRows(sink_stream, 0, table),))
    commit_task(SinkOptions((brokers,), sink_stream), staged, Fence(str(first.id), 1, 0), 0)
    second = run_to_end(upper(), brokers, sink_stream, checkpoint)
    assert batches_run(second) == {1: 20}

    # Crash 2: micro-batch 1 committed to both partitions, Spark's commit log never heard of it.
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink()
    for p in (0, 1):
        produce(client, source_stream, p, 5, first=20)
    third = run_to_end(upper(), brokers, sink_stream, checkpoint)
    assert batches_run(third) == {1: 20, 2: 10}  # Spark ran micro-batch 1 again; the sink wrote nothing of it

    assert records(client, sink_stream) == [
        (p, b"k%d" % (i % 5), b"V-%d-%d" % (p, i), ()) for p in (0, 1) for i in range(25)
    ]
    assert str(third.id) == str(first.id)  # one query, the same registers, across restarts
    labels = registers(broker_thread, brokers, sink_stream, 2)
    assert {label.value.split(".")[0] for labels_of in labels for label in labels_of} == {"2"}


def test_tasks_that_fail_after_appending_are_run_again_and_write_once(
    spark: SparkSession, brokers: str, client: TidelogClient, stream_name: str, tmp_path: Path
) -> None:
    """Every task of micro-batch 0 appends and then fails: Spark fails the micro-batch and stops the query (no
    task retries on local[2]); the restarted query runs micro-batch 0 again, and its tasks find their slices in."""
    source_stream, sink_stream = stream_name + "-in", stream_name + "-out"
    client.admin.create_stream(source_stream, partitions=2)
    client.admin.create_stream(sink_stream, partitions=3)
    for p in (0, 1):
        produce(client, source_stream, p, 30)
    checkpoint = tmp_path / "checkpoint"
    df = source(spark, brokers, source_stream).selectExpr("key", "value")
    context = spark.sparkContext
    context.setLocalProperty(FAIL_AFTER_APPEND_PROPERTY, "0")  # the query's thread inherits it
    try:
        crashed = start(df, brokers, sink_stream, checkpoint)
    finally:
        context.setLocalProperty(FAIL_AFTER_APPEND_PROPERTY, None)  # type: ignore[arg-type]
    assert FAIL_AFTER_APPEND_PROPERTY in failure(lambda: crashed.awaitTermination(QUERY_TIMEOUT))
    assert len(records(client, sink_stream)) == 60  # the tasks' appends stay
    rerun = run_to_end(df, brokers, sink_stream, checkpoint)
    assert batches_run(rerun) == {0: 60}
    written = Counter(value for _, _, value, _ in records(client, sink_stream))
    assert written == Counter(b"v-%d-%d" % (p, i) for p in (0, 1) for i in range(30))


# -- batch ---------------------------------------------------------------------------------------------------------


def test_batch_write_routes_rows_by_column_and_appends_them(
    spark: SparkSession, brokers: str, client: TidelogClient, broker_thread: LoopThread, stream_name: str
) -> None:
    a, b = stream_name + "-a", stream_name + "-b"
    client.admin.create_stream(a, partitions=2)
    client.admin.create_stream(b, partitions=1)
    rows: list[tuple[Any, ...]] = [
        ("one", "k1", {"h": b"1"}, 1, a),
        ("two", None, None, None, b),
        ("three", "k3", {}, 0, a),
        (None, "gone", None, 1, a),  # a tombstone
    ]
    df = spark.createDataFrame(
        rows, "value string, key string, headers map<string, binary>, partition int, stream string"
    )
    df.write.format("tidelog").option("brokers", brokers).mode("append").save()
    # Each task appends its own rows: within a partition, tasks' slices come in the order they committed.
    assert sorted(records(client, a), key=repr) == sorted(
        [(0, b"k3", b"three", ()), (1, b"k1", b"one", (("h", b"1"),)), (1, b"gone", None, ())], key=repr
    )
    assert records(client, b) == [(0, None, b"two", ())]
    assert registers(broker_thread, brokers, a, 2) == [LabelSet(), LabelSet()]  # no replay, no register
    overwrite = df.write.format("tidelog").option("brokers", brokers).mode("overwrite")
    assert "'mode'" in failure(overwrite.save)


# -- bad options and columns ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("select", "options", "named"),
    [
        ("value", {"topic": "x"}, "option 'topic'"),
        ("value", {"stream": "no-such-stream"}, "option 'stream'"),
        ("value", {"registerSlots": "4"}, "option 'registerSlots'"),
        ("CAST(value AS BINARY) AS key", {}, "column 'value'"),
        ("value, 1.5 AS key", {}, "column 'key'"),
        ("value, 'zero' AS partition", {}, "column 'partition'"),
    ],
)
def test_a_bad_write_fails_before_writing_naming_the_option_or_column(
    spark: SparkSession,
    brokers: str,
    client: TidelogClient,
    stream_name: str,
    select: str,
    options: dict[str, str],
    named: str,
) -> None:
    client.admin.create_stream(stream_name)
    df = spark.createDataFrame([("v",)], "value string").selectExpr(*select.split(", "))
    writer = df.write.format("tidelog").option("brokers", brokers).option("stream", stream_name).options(**options)
    assert named in failure(writer.mode("append").save)
    assert records(client, stream_name) == []


def test_a_bad_streaming_query_fails_at_its_start_naming_the_column(
    spark: SparkSession, brokers: str, client: TidelogClient, stream_name: str, tmp_path: Path
) -> None:
    client.admin.create_stream(stream_name)
    df = source(spark, brokers, stream_name).selectExpr("offset AS value")
    writer = df.writeStream.format("tidelog").option("brokers", brokers).option("stream", stream_name)
    query = writer.option("checkpointLocation", str(tmp_path / "checkpoint")).start()
    try:
        message = failure(lambda: query.awaitTermination(QUERY_TIMEOUT))
    finally:
        query.stop()
    assert "column 'value'" in message and "bigint" in message
