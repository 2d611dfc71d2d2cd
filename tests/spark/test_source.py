"""The ``tidelog`` source in a real local Spark against a real broker: streaming and batch reads, end to end.

Each test writes its own stream with the tidelog producer, then reads it back through Spark and checks every
row (stream, partition, offset, key, value, subject, headers, timestamp) against what the producer was told it
wrote. Streaming queries run with ``Trigger.AvailableNow`` unless the test is about something else, so each ends
by itself; every wait is bounded.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.utils import CapturedException

import tidelog.spark
from tidelog.client import RecordMetadata, TidelogClient
from tidelog.spark.options import parse_options
from tidelog.spark.planning import OffsetRange
from tidelog.spark.source import TidelogStreamReader

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.slow

QUERY_TIMEOUT = 60.0
Expected = tuple[str, int, int, bytes | None, bytes, int]  # stream, partition, offset, key, value, timestamp µs


def produce(
    client: TidelogClient,
    stream: str,
    partition: int,
    count: int,
    *,
    first: int = 0,
    timestamp: Callable[[int], int | None] = lambda i: None,
    headers: Sequence[tuple[str, bytes]] = (),
) -> list[Expected]:
    """Write ``count`` records to one partition and wait for every ack; the rows Spark should read for them."""
    with client.producer() as producer:
        futures = [
            producer.send(
                stream,
                b"value-%d-%d" % (partition, first + i),
                key=None if i % 3 == 0 else b"key-%d" % (i % 5),
                headers=headers or None,
                partition=partition,
                timestamp=timestamp(i),
            )
            for i in range(count)
        ]
        acks: list[RecordMetadata] = [future.result(30) for future in futures]
    return [
        (
            stream,
            partition,
            ack.offset,
            None if i % 3 == 0 else b"key-%d" % (i % 5),
            b"value-%d-%d" % (partition, first + i),
            ack.timestamp // 1000,
        )
        for i, ack in enumerate(acks)
    ]


def rows_of(df: DataFrame) -> list[Expected]:
    got = df.selectExpr("stream", "partition", "offset", "key", "value", "unix_micros(timestamp) AS ts").collect()
    return sorted((r.stream, r.partition, r.offset, r.key, r.value, r.ts) for r in got)


def reader(spark: SparkSession, brokers: str, **options: object) -> Any:
    stream = spark.readStream.format("tidelog").option("brokers", brokers)
    for name, value in options.items():
        stream = stream.option(name, str(value))
    return stream


def table_name(stream: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", stream)


def run_available_now(spark: SparkSession, source: Any, name: str, checkpoint: Path | None = None) -> StreamingQuery:
    """Run ``source`` into a memory table ``name`` with Trigger.AvailableNow until it stops by itself."""
    writer = source.load().writeStream.format("memory").queryName(name).trigger(availableNow=True)
    if checkpoint is not None:
        writer = writer.option("checkpointLocation", str(checkpoint))
    query = writer.start()
    assert query.awaitTermination(QUERY_TIMEOUT), "the AvailableNow query did not finish in time"
    assert query.exception() is None
    return query


def input_rows(query: StreamingQuery) -> list[int]:
    return [int(progress["numInputRows"]) for progress in query.recentProgress]


@pytest.fixture
def two_partitions(client: TidelogClient, stream_name: str) -> str:
    client.admin.create_stream(stream_name, stream_name, partitions=2)
    return stream_name


# -- streaming ---------------------------------------------------------------------------------------------------


def test_streaming_from_earliest_reads_every_record_once(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str
) -> None:
    stream = two_partitions
    want = produce(client, stream, 0, 40) + produce(client, stream, 1, 25, headers=[("trace", b"t1"), ("trace", b"t2")])
    name = table_name(stream)
    query = run_available_now(
        spark, reader(spark, brokers, streams=stream, startingOffsets="earliest", includeHeaders="true"), name
    )
    table = spark.table(name)
    assert rows_of(table) == sorted(want)
    subjects = {(r.partition, r.subject) for r in table.select("partition", "subject").collect()}
    assert subjects == {(0, stream), (1, f"{stream}.1")}
    headers = {(r.partition, tuple((h.key, h.value) for h in r.headers)) for r in table.collect()}
    assert headers == {(0, ()), (1, (("trace", b"t1"), ("trace", b"t2")))}
    latest = query.lastProgress["sources"][0]["latestOffset"]  # lag is visible: how far the log goes
    assert (json.loads(latest) if isinstance(latest, str) else latest) == {stream: {"0": 40, "1": 25}}


def test_streaming_from_latest_reads_only_what_comes_after_the_start(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str
) -> None:
    stream = two_partitions
    produce(client, stream, 0, 10)
    name = table_name(stream)
    query = reader(spark, brokers, streams=stream).load().writeStream.format("memory").queryName(name).start()
    try:
        query.processAllAvailable()  # the initial offsets (the high watermarks) are resolved by now
        want = produce(client, stream, 0, 5, first=10) + produce(client, stream, 1, 3)
        query.processAllAvailable()
        assert rows_of(spark.table(name)) == sorted(want)
    finally:
        query.stop()


def test_streaming_from_json_offsets_per_partition(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str
) -> None:
    stream = two_partitions
    first = produce(client, stream, 0, 20)
    second = produce(client, stream, 1, 12)
    starting = json.dumps({stream: {"0": 7, "1": -2}})
    name = table_name(stream)
    run_available_now(spark, reader(spark, brokers, streams=stream, startingOffsets=starting), name)
    assert rows_of(spark.table(name)) == sorted(first[7:] + second)


def test_streaming_from_a_timestamp(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str
) -> None:
    stream = two_partitions
    base_ms = int(time.time() * 1000) - 60_000
    early = [produce(client, stream, p, 6, timestamp=lambda i: (base_ms + i) * 1_000_000) for p in (0, 1)]
    cut_ms = base_ms + 10_000
    late = [produce(client, stream, p, 4, first=6, timestamp=lambda i: (cut_ms + i) * 1_000_000) for p in (0, 1)]
    assert all(len(rows) == 6 for rows in early)
    name = table_name(stream)
    run_available_now(
        spark, reader(spark, brokers, streams=stream, startingOffsets="earliest", startingTimestamp=cut_ms), name
    )
    assert rows_of(spark.table(name)) == sorted(late[0] + late[1])


def test_admission_control_bounds_every_micro_batch(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str
) -> None:
    stream = two_partitions
    want = produce(client, stream, 0, 30) + produce(client, stream, 1, 10)
    name = table_name(stream)
    source = reader(spark, brokers, streams=stream, startingOffsets="earliest", maxOffsetsPerTrigger=7)
    query = run_available_now(spark, source, name)
    batches = [n for n in input_rows(query) if n]
    assert batches == [7] * 5 + [5]  # AvailableNow, yet each micro-batch within the limit
    assert rows_of(spark.table(name)) == sorted(want)


def test_a_restarted_query_resumes_exactly_where_it_stopped(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str, tmp_path: Path
) -> None:
    stream = two_partitions
    want = produce(client, stream, 0, 30) + produce(client, stream, 1, 30)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> StreamingQuery:
        source = reader(spark, brokers, streams=stream, startingOffsets="earliest", maxOffsetsPerTrigger=10).load()
        writer = source.writeStream.format("parquet").option("path", str(output))
        return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()

    query = start({"processingTime": "100 milliseconds"})
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT
        while sum(input_rows(query)) < 20:  # stop after two micro-batches of the six
            assert time.monotonic() < deadline, "the first run made no progress"
            query.awaitTermination(0.2)
    finally:
        query.stop()
    first_run = sum(input_rows(query))
    assert 20 <= first_run < 60
    want += produce(client, stream, 1, 5, first=30)
    second = start({"availableNow": True})
    assert second.awaitTermination(QUERY_TIMEOUT)
    assert sum(input_rows(second)) == 65 - first_run  # nothing read twice, nothing skipped
    assert rows_of(spark.read.parquet(str(output))) == sorted(want)


# -- batch -------------------------------------------------------------------------------------------------------


def test_batch_reads_a_range_split_across_tasks(
    spark: SparkSession, brokers: str, client: TidelogClient, two_partitions: str
) -> None:
    stream = two_partitions
    first = produce(client, stream, 0, 45)
    second = produce(client, stream, 1, 50)
    df = (
        spark.read.format("tidelog")
        .option("brokers", brokers)
        .option("streams", stream)
        .option("startingOffsets", json.dumps({stream: {"0": 3, "1": -2}}))
        .option("endingOffsets", json.dumps({stream: {"0": 40, "1": -1}}))
        .option("maxOffsetsPerSplit", 10)
        .load()
    )
    assert df.rdd.getNumPartitions() == 4 + 5  # 37 offsets in four tasks, 50 in five
    assert rows_of(df) == sorted(first[3:40] + second)
    counts = df.groupBy("partition").count().collect()
    assert {(r["partition"], r["count"]) for r in counts} == {(0, 37), (1, 50)}


def test_batch_reads_everything_by_default_in_at_least_min_partitions_tasks(
    spark: SparkSession, brokers: str, client: TidelogClient, stream_name: str
) -> None:
    client.admin.create_stream(stream_name, stream_name)
    want = produce(client, stream_name, 0, 30)
    tidelog.spark.register(spark)  # as without pyspark_tidelog on the path: the same source
    df = spark.read.format("tidelog").option("brokers", brokers).option("streamPattern", re.escape(stream_name))
    df = df.option("minPartitions", 4).load()
    assert df.rdd.getNumPartitions() == 4
    assert rows_of(df) == sorted(want)


def test_tasks_hand_spark_arrow_record_batches(brokers: str, client: TidelogClient, stream_name: str) -> None:
    """What ``read`` yields (in the executors) is Arrow, never per-row tuples."""
    client.admin.create_stream(stream_name, stream_name)
    produce(client, stream_name, 0, 100)
    task = OffsetRange(stream_name, 0, 10, 90, stream_name)
    batches = list(TidelogStreamReader(parse_options({"brokers": brokers, "streams": stream_name})).read(task))
    assert batches and all(isinstance(batch, pa.RecordBatch) for batch in batches)
    offsets = [offset for batch in batches for offset in batch.column("offset").to_pylist()]
    assert offsets == list(range(10, 90))


def test_min_offsets_per_trigger_holds_a_trigger_back_until_enough_wait(
    brokers: str, client: TidelogClient, stream_name: str
) -> None:
    """The driver's ``latestOffset`` as Spark calls it each trigger: its start back means no micro-batch."""
    client.admin.create_stream(stream_name, stream_name)
    produce(client, stream_name, 0, 3)
    options = {"brokers": brokers, "streams": stream_name, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "1h"}
    reader = TidelogStreamReader(parse_options(options))
    start = {stream_name: {"0": 0}}
    try:
        assert reader.latestOffset(start, ReadAllAvailable()) == start  # 3 of 5: wait
        produce(client, stream_name, 0, 2, first=3)
        assert reader.latestOffset(start, ReadAllAvailable()) == {stream_name: {"0": 5}}
        reader.prepareForTriggerAvailableNow()  # AvailableNow reads what is there, however little
        assert reader.latestOffset({stream_name: {"0": 4}}, ReadAllAvailable()) == {stream_name: {"0": 5}}
    finally:
        reader.stop()
    eager = TidelogStreamReader(parse_options({**options, "maxTriggerDelay": "0ms"}))  # the delay is always over
    try:
        assert eager.latestOffset({stream_name: {"0": 4}}, ReadAllAvailable()) == {stream_name: {"0": 5}}
    finally:
        eager.stop()


# -- bad options ---------------------------------------------------------------------------------------------------


def failure(action: Callable[[], object]) -> str:
    with pytest.raises((PySparkException, CapturedException)) as caught:
        action()
    return str(caught.value)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"streams": "x", "topic": "x"}, "'topic'"),
        ({"streams": "x", "startingOffsets": '{"x": {"0": '}, "'startingOffsets'"),
        ({"streams": "x", "maxOffsetsPerTrigger": "lots"}, "'maxOffsetsPerTrigger'"),
    ],
)
def test_malformed_options_fail_when_the_query_is_defined(
    spark: SparkSession, brokers: str, options: dict[str, str], option: str
) -> None:
    assert option in failure(lambda: reader(spark, brokers, **options).load())
    batch = spark.read.format("tidelog").option("brokers", brokers)
    assert option in failure(lambda: batch.options(**options).load().collect())


def test_unknown_streams_and_partitions_fail_at_query_start_naming_the_option(
    spark: SparkSession, brokers: str, client: TidelogClient, stream_name: str
) -> None:
    missing = stream_name + "-missing"
    batch = spark.read.format("tidelog").option("brokers", brokers)
    assert "'streams'" in failure(lambda: batch.option("streams", missing).load().collect())
    client.admin.create_stream(stream_name, stream_name)
    starting = json.dumps({stream_name: {"0": 0, "5": 0}})
    assert "'startingOffsets'" in failure(
        lambda: batch.option("streams", stream_name).option("startingOffsets", starting).load().collect()
    )
    query = reader(spark, brokers, streams=missing).load().writeStream.format("memory").queryName("never").start()
    try:
        assert "'streams'" in failure(lambda: query.awaitTermination(QUERY_TIMEOUT))
    finally:
        query.stop()


def test_options_for_the_other_kind_of_query_are_refused(spark: SparkSession, brokers: str) -> None:
    source = reader(spark, brokers, streams="x", endingOffsets="latest").load()
    query = source.writeStream.format("memory").queryName("refused").start()
    try:
        assert "'endingOffsets'" in failure(lambda: query.awaitTermination(QUERY_TIMEOUT))
    finally:
        query.stop()
    batch = spark.read.format("tidelog").option("streams", "x").option("maxOffsetsPerTrigger", 5)
    assert "'maxOffsetsPerTrigger'" in failure(lambda: batch.load().collect())


def test_the_stream_reader_pickles_without_its_connections(
    brokers: str, client: TidelogClient, stream_name: str
) -> None:
    """PySpark pickles the stream reader to ship ``read`` to the tasks; its planner connections stay behind."""
    import pickle

    client.admin.create_stream(stream_name, stream_name)
    source = TidelogStreamReader(parse_options({"brokers": brokers, "streams": stream_name}))
    try:
        assert source.initialOffset() == {stream_name: {"0": 0}}
        copy = pickle.loads(pickle.dumps(source))
        assert copy._topology is None and copy.options == source.options
    finally:
        source.stop()
