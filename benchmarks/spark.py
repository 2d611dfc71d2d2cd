"""Spark benchmark: the ``tidelog`` PySpark source beside an in-memory Python data source, in the same run.

Run: ``.venv/bin/python -m benchmarks.spark [--quick]``. A ``tidelog serve`` child process (embedded NATS and
etcd, flush policy ``never``) holds one stream of two partitions, written once by the tidelog producer (no key,
no headers, 100-byte random values, no compression: the producer's usual record shape). One local Spark
(``local[2]``, the machine's two cores) runs every query.

Metrics (``ratio`` = tidelog ÷ peer):

- ``source_rows`` rows/s: a streaming query reading the whole stream through ``format("tidelog")``
  (``Trigger.AvailableNow``, one micro-batch, one task per partition) into a trivial aggregation (count by
  partition, memory sink, complete mode). The peer runs the same query over a Python data source that yields the
  very Arrow record batches the tidelog source produced (collected once beforehand, kept as Arrow IPC files in
  the page cache and memory-mapped: no decoding, no copies, no network), which is what Spark alone costs: the
  ceiling for any Python source. The rate is rows over the micro-batch's ``triggerExecution`` time as Spark's
  progress reports it (planning and execution, not the query's start-up).
- ``sink_rows`` rows/s through the exactly-once sink: a streaming query reading the same stream through the
  source (``maxOffsetsPerTrigger`` :data:`SINK_BATCH`: micro-batches of that many rows, as a sink's queries are
  bounded) and writing its ``value`` column to a second stream of two partitions with
  ``writeStream.format("tidelog")`` — each task appends its rows for each partition in one fenced transactional
  append, on the executors (no row goes through the driver). The peer is the same query into Spark's ``noop``
  sink (reading and planning alone: the ceiling); the ratio is the share of that speed the sink keeps. After
  each run the second stream must have grown by exactly the rows read.
- ``sink_rows_standalone`` rows/s: ``sink_rows`` on a standalone Spark cluster (a master and two workers of one
  core each, started from pyspark's ``spark-class``, :mod:`tidelog.spark.standalone`): the tasks run in two
  executors, each a JVM of its own with its Python workers, the driver in this process. Same peer (``noop``).
- ``source_rows_replicas`` rows/s: the ``source_rows`` query on a three-broker cluster (``LocalCluster``: three
  ``tidelog serve`` processes, one NATS, one etcd) whose stream has two partitions of three replicas each, with
  ``readFrom=replica`` (every task fetches from an in-sync follower); the peer is the same query with
  ``readFrom=leader``. On one machine this shows what reading from followers costs, not the load it takes off
  the leaders (every broker shares the same two cores); no target.

Each run uses a fresh query and checkpoint; runs alternate which side goes first, after two uncounted warm-up
rounds (Spark gets faster for several queries as its JIT compiles); values are medians. The last line is the
summary with the targets.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from tidelog.client import Codec, LoopThread, TidelogClient
from tidelog.local.cluster import LocalCluster
from tidelog.local.serve_process import ServedBroker, start_served_broker
from tidelog.spark.options import parse_options
from tidelog.spark.planning import OffsetRange
from tidelog.spark.reading import read_range
from tidelog.spark.schema import ARROW_SCHEMA, SPARK_SCHEMA
from tidelog.spark.standalone import StandaloneSpark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BENCH = "spark"
STREAM = "bench"
SINK_STREAM = "bench-sink"
SINK_BATCH = 250_000
"""Rows per micro-batch of the sink's query: with 100-byte values, about 13 MB per partition and append."""
PARTITIONS = 2
VALUE_SIZE = 100
TARGETS = (Target("source_rows", ">=", 0.5), Target("sink_rows", ">=", 0.5))
APPROACHES = {
    "tidelog": "spark.readStream.format('tidelog'), Trigger.AvailableNow, groupBy(partition).count() to a memory "
    "sink; tidelog serve as a child process; rows / triggerExecution",
    "peer": "the same query over a Python streaming data source yielding the same Arrow record batches from "
    "memory-mapped Arrow IPC files",
    "sink": "the stream read by format('tidelog') in micro-batches of SINK_BATCH rows, its value column written by "
    "writeStream.format('tidelog') (exactly once: each task appends its rows per partition in one "
    "register-fenced append, on the executors, its rows encoded in bulk from their Arrow columns); "
    "peer: the same query into the noop sink; rows / triggerExecution",
    "standalone": "the sink_rows queries on a standalone cluster: a master and 2 workers × 1 core from pyspark's "
    "spark-class, 2 executors",
    "replicas": "the source_rows query on a 3-broker LocalCluster (2 partitions × 3 replicas) with readFrom=replica; "
    "peer: readFrom=leader; rows / triggerExecution",
}


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    records: int


QUICK = Plan(runs=4, records=1_000_000)
FULL = Plan(runs=6, records=3_000_000)
SINK_RUNS = 3  # per side: a run reads and writes the stream in micro-batches, several times a source run
WARM_UPS = 2  # rounds not counted: the JVM's JIT and Python workers' imports make the first ones slow
STANDALONE_CONFIG = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.executor.memory": "1g",
}
CLUSTER_SETTINGS = {"default_flush_policy": "never", "replica_lag_time_max_ms": "30000", "log_level": "warning"}


# -- the peer: the same Arrow batches, from memory ------------------------------------------------------------------


class _File(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class _MemoryReader(DataSourceStreamReader):
    """Offsets are just "read or not": one micro-batch yields every file's batches, one task per file."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def initialOffset(self) -> dict[str, int]:
        return {"done": 0}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, int]:
        return {"done": 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [_File(path) for path in self.files] if start["done"] < end["done"] else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _File)
        with pa.memory_map(partition.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


class MemorySource(DataSource):
    """``format("tidelog_bench_memory")`` with option ``files``: Arrow IPC files of the tidelog source's batches."""

    @classmethod
    def name(cls) -> str:
        return "tidelog_bench_memory"

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _MemoryReader(self.options["files"].split(","))


def capture_batches(brokers: str, root: Path, high_watermarks: dict[int, int]) -> list[str]:
    """Read every partition once with the tidelog source's own task code and keep its batches as IPC files."""
    options = parse_options({"brokers": brokers, "streams": STREAM})
    files = []
    for partition, end in sorted(high_watermarks.items()):
        path = root / f"peer-{partition}.arrow"
        task = OffsetRange(STREAM, partition, 0, end, STREAM if partition == 0 else f"{STREAM}.{partition}")
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, ARROW_SCHEMA) as writer:
            for batch in read_range(options, task):
                writer.write_batch(batch)
        files.append(str(path))
    return files


# -- measuring ---------------------------------------------------------------------------------------------------


def rows_per_second(spark: SparkSession, source: Any, root: Path, name: str, expected: int) -> float:
    """Run ``source`` (a configured DataStreamReader) through count-by-partition until it has read everything."""
    counts = source.load().groupBy("partition").count()
    query = (
        counts.writeStream.format("memory")
        .queryName(name)
        .outputMode("complete")
        .option("checkpointLocation", str(root / f"checkpoint-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(600):
        query.stop()
        raise RuntimeError(f"{name}: the query did not finish within 600 s")
    if query.exception() is not None:
        raise RuntimeError(f"{name}: {query.exception()}")
    total = sum(int(row["count"]) for row in spark.table(name).collect())
    if total != expected:
        raise RuntimeError(f"{name}: counted {total} rows, expected {expected}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(int(p["numInputRows"]) for p in progress)
    seconds = sum(float(p["durationMs"]["triggerExecution"]) for p in progress) / 1000
    return rows / seconds


def sink_rows_per_second(
    spark: SparkSession, brokers: str, root: Path, name: str, side: str, expected: int, sink_stream: str = SINK_STREAM
) -> float:
    """Run the stream through the sink (``side`` "tidelog") or into ``noop`` (the peer) until it has read it all."""
    rows = (
        spark.readStream.format("tidelog")
        .option("brokers", brokers)
        .option("streams", STREAM)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", SINK_BATCH)
        .load()
        .select("value")
    )
    writer = rows.writeStream.option("checkpointLocation", str(root / f"checkpoint-{name}")).trigger(availableNow=True)
    if side == "tidelog":
        writer = writer.format("tidelog").option("brokers", brokers).option("stream", sink_stream)
        before = sink_size(brokers, sink_stream)
    else:
        writer = writer.format("noop")
    query = writer.start()
    if not query.awaitTermination(900):
        query.stop()
        raise RuntimeError(f"{name}: the query did not finish within 900 s")
    if query.exception() is not None:
        raise RuntimeError(f"{name}: {query.exception()}")
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    read = sum(int(p["numInputRows"]) for p in progress)
    if read != expected:
        raise RuntimeError(f"{name}: read {read} rows, expected {expected}")
    if side == "tidelog" and (written := sink_size(brokers, sink_stream) - before) != expected:
        raise RuntimeError(f"{name}: the sink wrote {written} records for {expected} rows")
    seconds = sum(float(p["durationMs"]["triggerExecution"]) for p in progress) / 1000
    return read / seconds


def sink_size(brokers: str, stream: str) -> int:
    with TidelogClient(brokers) as client:
        return sum(p.high_watermark for p in client.admin.describe_stream(stream).partitions)


def measure_sink_rows(
    spark: SparkSession,
    brokers: str,
    root: Path,
    records: int,
    metric: str = "sink_rows",
    sink_stream: str = SINK_STREAM,
) -> Row:
    """``sink_rows``: the sink beside the noop sink, one warm-up round, then :data:`SINK_RUNS` alternating."""
    with TidelogClient(brokers) as client:
        client.admin.create_stream(sink_stream, sink_stream, partitions=PARTITIONS)
    samples: dict[str, list[float]] = {"tidelog": [], "peer": []}
    for label, i in [("warm-up", 0)] + [("run", i) for i in range(SINK_RUNS)]:
        for side in ["tidelog", "peer"] if i % 2 == 0 else ["peer", "tidelog"]:
            name = f"{metric}_{side}_{label.replace('-', '')}_{i}"
            rate = sink_rows_per_second(spark, brokers, root, name, side, records, sink_stream)
            log(f"{metric} {label} {i} {side}: {rate:,.0f} rows/s")
            if label == "run":
                samples[side].append(rate)
    return Row(BENCH, metric, median(samples["tidelog"]), "rows/s", median(samples["peer"]), digits=0)


def measure_standalone_sink(root: Path, brokers: str, records: int) -> Row:
    """``sink_rows_standalone``: ``sink_rows`` with the tasks in two executors of a standalone cluster."""
    from pyspark.sql import SparkSession

    runner = LoopThread("bench-standalone")
    cluster = StandaloneSpark(root / "standalone", workers=2)
    try:
        runner.run(cluster.start(), timeout=600)
        builder = SparkSession.builder.appName("tidelog-bench-standalone")
        for key, value in {**cluster.session_config(), **STANDALONE_CONFIG}.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            return measure_sink_rows(spark, brokers, root, records, "sink_rows_standalone", SINK_STREAM + "-standalone")
        finally:
            spark.stop()
    finally:
        runner.run(cluster.stop(), timeout=120)
        runner.close()


def measure_replicas(spark: SparkSession, root: Path, plan: Plan) -> Row:
    """``source_rows_replicas``: ``readFrom=replica`` beside ``readFrom=leader`` on a three-broker cluster."""
    runner = LoopThread("bench-cluster")
    cluster = LocalCluster(root / "cluster", 3, settings=CLUSTER_SETTINGS)
    try:
        runner.run(cluster.start(), timeout=300)
        brokers = ",".join(cluster.bootstrap())
        produce(cluster.bootstrap(), plan.records, replication_factor=3)
        log(f"three-broker cluster: {plan.records} records in {STREAM} (3 replicas)")
        samples: dict[str, list[float]] = {"replica": [], "leader": []}
        rounds = [("warm-up", 0)] + [("run", i) for i in range(plan.runs)]
        for label, i in rounds:
            for side in ["replica", "leader"] if i % 2 == 0 else ["leader", "replica"]:
                source = (
                    spark.readStream.format("tidelog")
                    .option("brokers", brokers)
                    .option("streams", STREAM)
                    .option("startingOffsets", "earliest")
                    .option("readFrom", side)
                )
                name = f"replicas_{side}_{label.replace('-', '')}_{i}"
                rate = rows_per_second(spark, source, root, name, plan.records)
                log(f"replicas {label} {i} readFrom={side}: {rate:,.0f} rows/s")
                if label == "run":
                    samples[side].append(rate)
    finally:
        runner.run(cluster.stop(), timeout=120)
        runner.close()
    return Row(BENCH, "source_rows_replicas", median(samples["replica"]), "rows/s", median(samples["leader"]), digits=0)


def produce(brokers: str | list[str], records: int, *, replication_factor: int = 1) -> dict[int, int]:
    """Create the stream and fill it; return each partition's high watermark."""
    values = [os.urandom(VALUE_SIZE) for _ in range(min(records, 50_000))]
    with TidelogClient(brokers) as client:
        client.admin.create_stream(STREAM, STREAM, partitions=PARTITIONS, replication_factor=replication_factor)
        with client.producer(compression=Codec.NONE, idempotent=False) as producer:
            sent = 0
            while sent < records:
                chunk = min(len(values), records - sent)
                producer.send_many(STREAM, values[:chunk], timeout=300)
                sent += chunk
        info = client.admin.describe_stream(STREAM)
    return {p.id: p.high_watermark for p in info.partitions}


def session() -> SparkSession:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers that look data sources up by name run it
    repository = str(Path(__file__).resolve().parent.parent)  # the workers import this module's peer source
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repository, os.environ.get("PYTHONPATH")) if p)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-bench")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MemorySource)
    return spark


def run(plan: Plan, root: Path) -> list[Row]:
    runner = LoopThread("bench-broker")
    broker: ServedBroker | None = None
    try:
        (root / "broker").mkdir()
        broker = runner.run(start_served_broker(root / "broker", default_flush_policy="never", log_level="warning"))
        log(f"tidelog serve pid {broker.process.pid}, wire {broker.wire_address}")
        started = time.monotonic()
        watermarks = produce(broker.wire_address, plan.records)
        log(f"produced {plan.records} records of {VALUE_SIZE} B in {time.monotonic() - started:.1f} s: {watermarks}")
        files = capture_batches(broker.wire_address, root, watermarks)
        spark = session()
        try:
            samples: dict[str, list[float]] = {"tidelog": [], "peer": []}
            sources = {
                "tidelog": spark.readStream.format("tidelog")
                .option("brokers", broker.wire_address)
                .option("streams", STREAM)
                .option("startingOffsets", "earliest"),
                "peer": spark.readStream.format("tidelog_bench_memory").option("files", ",".join(files)),
            }
            rounds = [("warm-up", i) for i in range(WARM_UPS)] + [("run", i) for i in range(plan.runs)]
            for label, i in rounds:
                order = ["tidelog", "peer"] if i % 2 == 0 else ["peer", "tidelog"]
                for side in order:
                    rate = rows_per_second(
                        spark, sources[side], root, f"{side}_{label.replace('-', '')}_{i}", plan.records
                    )
                    log(f"{label} {i} {side}: {rate:,.0f} rows/s")
                    if label == "run":
                        samples[side].append(rate)
            source = Row(BENCH, "source_rows", median(samples["tidelog"]), "rows/s", median(samples["peer"]), digits=0)
            sink = measure_sink_rows(spark, broker.wire_address, root, plan.records)
        finally:
            spark.stop()
        standalone = measure_standalone_sink(root, broker.wire_address, plan.records)
        runner.run(broker.stop())
        broker = None
        spark = session()
        try:
            replicas = measure_replicas(spark, root, plan)
        finally:
            spark.stop()
    finally:
        if broker is not None:
            runner.run(broker.stop())
        runner.close()
    return [source, sink, standalone, replicas]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (about two minutes)")
    parser.add_argument("--runs", type=int, help="runs per side (medians are taken over them)")
    parser.add_argument("--records", type=int, help="records in the stream")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    plan = Plan(runs=args.runs or base.runs, records=args.records or base.records)
    log(f"plan: {plan}")
    clock = RunClock.now()
    with scratch_dir("tidelog-bench-spark-") as root:
        rows = run(plan, root)
    report(
        BENCH,
        rows,
        TARGETS,
        clock,
        runs=plan.runs,
        records=plan.records,
        value_bytes=VALUE_SIZE,
        approaches=APPROACHES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
