"""NATS → tidelog → Spark Structured Streaming → tidelog, exactly once: tidelog's example pipeline.

Against the broker ``make run`` starts (wire protocol on 127.0.0.1:9293, NATS on 4222)::

    .venv/bin/python examples/nats_to_spark_to_tidelog.py

or on a broker of its own, started and stopped by the script (a ``tidelog serve`` child process)::

    .venv/bin/python examples/nats_to_spark_to_tidelog.py --start-broker

What it does:

1. creates the stream ``readings`` on the NATS subject ``readings`` (tidelog ingests what is published there)
   and the stream ``reading-stats``, compacted, unless they exist;
2. publishes ``--messages`` plain NATS messages to ``readings`` — JSON temperature readings from a few sensors —
   with nats-py, as any NATS publisher would, and waits until tidelog has stored them;
3. runs a Spark Structured Streaming query: the ``tidelog`` source reads ``readings``, the query counts the
   readings and averages the temperature per sensor, and the ``tidelog`` sink appends the result to
   ``reading-stats`` (complete mode: each micro-batch appends the whole table; keyed by sensor, so compaction
   keeps the latest row per sensor). The sink appends each micro-batch at most once per partition, whatever
   crashes and restarts happen in between. ``Trigger.AvailableNow``: the query reads what is there and stops;
4. prints what the query appended to ``reading-stats``.

Run it again with the same ``--checkpoint`` and new messages, and the query continues where it stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import nats

from tidelog.client import LoopThread, TidelogClient
from tidelog.local.serve_process import start_served_broker
from tidelog.protocol.errors import StreamExistsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SENSORS = ("boiler", "attic", "cellar", "garage", "porch")
INGEST_WITHIN = 60.0  # seconds for tidelog to store what was published
QUERY_WITHIN = 300  # seconds


@dataclass(frozen=True, slots=True)
class Endpoints:
    brokers: str  # tidelog wire protocol, host:port
    nats_url: str


@dataclass(frozen=True, slots=True)
class Pipeline:
    readings: str = "readings"  # the input stream, on the NATS subject of the same name
    stats: str = "reading-stats"  # the output stream
    messages: int = 1000
    checkpoint: Path | None = None  # None: a fresh one (the query starts from the first reading)


@dataclass(frozen=True, slots=True)
class Stat:
    sensor: str
    readings: int
    mean_celsius: float


def ensure_streams(client: TidelogClient, pipeline: Pipeline) -> None:
    """Create both streams unless they exist (the input on the NATS subject of its name)."""
    configs: dict[str, dict[str, str | int | bool]] = {pipeline.readings: {}, pipeline.stats: {"compact.enabled": True}}
    for name, config in configs.items():
        with suppress(StreamExistsError):
            client.admin.create_stream(name, name, config=config)


async def publish(nats_url: str, subject: str, count: int) -> None:
    """``count`` readings as plain NATS messages: no tidelog client involved."""
    rng = random.Random(6)
    connection = await nats.connect(nats_url)
    try:
        for i in range(count):
            sensor = SENSORS[i % len(SENSORS)]
            base = 20.0 + 5 * SENSORS.index(sensor)
            reading = {"sensor": sensor, "celsius": round(base + rng.uniform(-2, 2), 2)}
            await connection.publish(subject, json.dumps(reading).encode())
        await connection.flush()
    finally:
        await connection.close()


def log_end(client: TidelogClient, stream: str) -> int:
    return sum(p.log_end for p in client.admin.describe_stream(stream).partitions)


def wait_for(client: TidelogClient, stream: str, records: int) -> None:
    """Until the stream holds ``records`` records (NATS ingest is asynchronous), committed."""
    deadline = time.monotonic() + INGEST_WITHIN
    while sum(p.high_watermark for p in client.admin.describe_stream(stream).partitions) < records:
        if time.monotonic() > deadline:
            raise TimeoutError(f"tidelog did not store {records} records in {stream!r} within {INGEST_WITHIN} s")
        time.sleep(0.1)


def stats_query(spark: SparkSession, endpoints: Endpoints, pipeline: Pipeline, checkpoint: Path) -> int:
    """The Spark part: readings in, per-sensor statistics out, through the exactly-once sink. Returns how many
    micro-batches the run committed."""
    from pyspark.sql import functions as f

    readings = (
        spark.readStream.format("tidelog")
        .option("brokers", endpoints.brokers)
        .option("streams", pipeline.readings)
        .option("startingOffsets", "earliest")
        .load()
        .select(f.from_json(f.col("value").cast("string"), "sensor string, celsius double").alias("reading"))
        .select("reading.*")
    )
    stats = readings.groupBy("sensor").agg(
        f.count(f.lit(1)).alias("readings"), f.round(f.avg("celsius"), 2).alias("mean_celsius")
    )
    query = (
        stats.select(
            f.col("sensor").alias("key"),  # one key per sensor: compaction keeps its latest row
            f.to_json(f.struct("sensor", "readings", "mean_celsius")).alias("value"),
        )
        .writeStream.format("tidelog")
        .option("brokers", endpoints.brokers)
        .option("stream", pipeline.stats)
        .option("checkpointLocation", str(checkpoint))
        .outputMode("complete")
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(QUERY_WITHIN):
        query.stop()
        raise TimeoutError(f"the query did not finish within {QUERY_WITHIN} s")
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    return sum(1 for progress in query.recentProgress if progress["numInputRows"])


def run_pipeline(spark: SparkSession, endpoints: Endpoints, pipeline: Pipeline) -> list[Stat]:
    """Steps 1 to 3 of the module docstring; returns what the query appended to the output stream."""
    with TidelogClient(endpoints.brokers) as client:
        ensure_streams(client, pipeline)
        stored = log_end(client, pipeline.readings)
        asyncio.run(publish(endpoints.nats_url, pipeline.readings, pipeline.messages))
        wait_for(client, pipeline.readings, stored + pipeline.messages)
        print(f"published {pipeline.messages} NATS messages; {pipeline.readings!r} holds {stored + pipeline.messages}")
        before = log_end(client, pipeline.stats)
        with _checkpoint(pipeline.checkpoint) as checkpoint:
            batches = stats_query(spark, endpoints, pipeline, checkpoint)
        print(f"the query ran {batches} micro-batch(es)")
        with client.consumer(pipeline.stats, stop_at_end=True, start=before) as consumer:
            appended = [json.loads(record.value or b"null") for record in consumer]
    return [Stat(row["sensor"], row["readings"], row["mean_celsius"]) for row in appended]


@contextmanager
def _checkpoint(path: Path | None) -> Iterator[Path]:
    if path is not None:
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="tidelog-example-") as scratch:
        yield Path(scratch) / "checkpoint"


def spark_session() -> SparkSession:
    from pyspark.sql import SparkSession

    # Spark's Python workers must import tidelog: run them with this interpreter (its virtual environment).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nats-to-spark-to-tidelog")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def own_broker() -> Iterator[Endpoints]:
    """A ``tidelog serve`` child process (embedded NATS and etcd) on free ports, stopped at the end."""
    runner = LoopThread("example-broker")
    try:
        with tempfile.TemporaryDirectory(prefix="tidelog-example-broker-") as workdir:
            broker = runner.run(start_served_broker(Path(workdir)), timeout=120)
            try:
                print(f"started tidelog serve: wire {broker.wire_address}, NATS {broker.nats_url}")
                yield Endpoints(broker.wire_address, broker.nats_url)
            finally:
                runner.run(broker.stop(), timeout=60)
    finally:
        runner.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start-broker", action="store_true", help="run a broker of its own instead of make run's")
    parser.add_argument("--brokers", default="127.0.0.1:9293", help="tidelog wire address (default: make run's)")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS URL (default: make run's)")
    parser.add_argument("--messages", type=int, default=1000, help="NATS messages to publish")
    parser.add_argument("--checkpoint", type=Path, help="Spark checkpoint directory (default: a fresh one)")
    args = parser.parse_args(argv)
    pipeline = Pipeline(messages=args.messages, checkpoint=args.checkpoint)

    def run(endpoints: Endpoints) -> None:
        spark = spark_session()
        try:
            stats = run_pipeline(spark, endpoints, pipeline)
        finally:
            spark.stop()
        print(f"appended to {pipeline.stats!r}:")
        for stat in stats:
            print(f"  {stat.sensor:<8} {stat.readings:>7} readings, mean {stat.mean_celsius:6.2f} °C")

    if args.start_broker:
        with own_broker() as endpoints:
            run(endpoints)
    else:
        run(Endpoints(args.brokers, args.nats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
