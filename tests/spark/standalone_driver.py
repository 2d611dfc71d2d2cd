"""The driver of :mod:`tests.spark.test_standalone`, run as its own process (one SparkContext per process: the
test session already holds a ``local[2]`` one): on a standalone cluster, the parts :class:`Job` names —

- ``example``: the example pipeline;
- ``crash``: every task's first attempt fails right after appending, and Spark retries it on an executor;
- ``killed``: a query whose driver dies (SIGKILL to its JVM and to this process) right after the sink's commit
  of micro-batch 0 and before Spark writes it to its commit log — the process ends there, killed;
- ``driver_crashes``: the killed query restarted from its checkpoint (Spark runs micro-batch 0 again: the sink
  writes nothing of it, then micro-batch 1), then a driver crash staged after task 0 of micro-batch 2 appended
  and before task 1 ran (that task's commit, run here), and the query restarted once more.

``python -m tests.spark.standalone_driver '<json>'`` with the keys of :class:`Job`; prints one JSON line of
what it saw and exits 0, or fails with the assertion's traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from tidelog.client import TidelogClient
from tidelog.spark.sink import FAIL_AFTER_APPEND_PROPERTY, TidelogStreamWriter, stream_writer
from tidelog.spark.sink_commit import commit_task
from tidelog.spark.sink_fence import Fence
from tidelog.spark.sink_options import SinkOptions
from tidelog.spark.source import TidelogDataSource
from tidelog.spark.writing import ROWS_SCHEMA, PartitionRows, TaskRows

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nats_to_spark_to_tidelog.py"
QUERY_TIMEOUT = 300.0  # a bound for a loaded machine; a quiet one takes seconds


@dataclass(frozen=True)
class Job:
    config: dict[str, str]  # StandaloneSpark.session_config()
    brokers: str
    nats_url: str
    prefix: str  # of the streams this run creates
    workdir: str
    parts: tuple[str, ...] = ("example", "crash")  # what to run (see the module docstring), in this order


def example() -> Any:
    spec = importlib.util.spec_from_file_location("nats_to_spark_to_tidelog", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def run_example(spark: SparkSession, job: Job) -> dict[str, int]:
    module = example()
    pipeline = module.Pipeline(
        readings=job.prefix + "-readings",
        stats=job.prefix + "-stats",
        messages=100,
        checkpoint=Path(job.workdir) / "example",
    )
    stats = module.run_pipeline(spark, module.Endpoints(job.brokers, job.nats_url), pipeline)
    return {s.sensor: s.readings for s in stats}


def run_crash(spark: SparkSession, job: Job) -> dict[str, Any]:
    """Micro-batch 0's tasks each append and then fail (first attempt): Spark runs them again on an executor,
    the retries find their slices in, and the query ends with every row once."""
    source, sink = job.prefix + "-in", job.prefix + "-out"
    with TidelogClient(job.brokers) as client:
        client.admin.create_stream(source, partitions=2)
        client.admin.create_stream(sink, partitions=3)
        with client.producer() as producer:
            sent = [producer.send(source, b"v-%d-%d" % (p, i), partition=p) for p in (0, 1) for i in range(30)]
            for future in sent:
                future.result(30)
    df = (
        spark.readStream.format("tidelog")
        .option("brokers", job.brokers)
        .option("streams", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "value")
    )
    context = spark.sparkContext
    context.setLocalProperty(FAIL_AFTER_APPEND_PROPERTY, "0")  # the query's thread inherits it
    try:
        writer = df.writeStream.format("tidelog").option("brokers", job.brokers).option("stream", sink)
        query = writer.option("checkpointLocation", str(Path(job.workdir) / "crash")).trigger(availableNow=True)
        running = query.start()
    finally:
        context.setLocalProperty(FAIL_AFTER_APPEND_PROPERTY, None)  # type: ignore[arg-type]
    assert running.awaitTermination(QUERY_TIMEOUT), "the crash query did not finish in time"
    assert running.exception() is None, running.exception()
    with TidelogClient(job.brokers) as client, client.consumer(sink, stop_at_end=True) as consumer:
        written = Counter(record.value for record in consumer)
    assert written == Counter(b"v-%d-%d" % (p, i) for p in (0, 1) for i in range(30)), written
    return {"rows": sum(written.values()), "batches": [int(p["batchId"]) for p in running.recentProgress]}


# -- driver crashes ------------------------------------------------------------------------------------------------


class KillOnCommit(TidelogDataSource):
    """``format("tidelog_kill_on_commit")``: the tidelog sink, whose driver is killed right after the sink's commit
    of micro-batch ``killAfterCommit``: SIGKILL to each of ``driverPids`` (the driver's JVM, then its Python
    process), sent from the process Spark runs the commit in, which then kills itself."""

    @classmethod
    def name(cls) -> str:
        return "tidelog_kill_on_commit"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = {key.lower(): str(value) for key, value in self.options.items()}
        batch, pids = int(options.pop("killaftercommit")), options.pop("driverpids")
        writer = stream_writer(options, schema)
        return _KillingWriter(writer.options, writer.columns, batch, [int(pid) for pid in pids.split(",")])


class _KillingWriter(TidelogStreamWriter):
    def __init__(self, options: SinkOptions, columns: Any, batch: int, pids: list[int]) -> None:
        super().__init__(options, columns)
        self.batch = batch
        self.pids = pids

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        super().commit(messages, batchId)
        if batchId == self.batch:
            for pid in self.pids:
                os.kill(pid, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(QUERY_TIMEOUT)  # not reached


def driver_crash_streams(job: Job) -> tuple[str, str, Path]:
    """The source and sink streams and the checkpoint of the query ``killed`` starts and ``driver_crashes`` ends."""
    return job.prefix + "-killed-in", job.prefix + "-killed-out", Path(job.workdir) / "killed"


def produce(brokers: str, stream: str, first: int, count: int) -> None:
    """Values ``v-<partition>-<i>`` for ``i`` in ``first .. first + count - 1`` to each of partitions 0 and 1."""
    with TidelogClient(brokers) as client, client.producer() as producer:
        sent = [
            producer.send(stream, b"v-%d-%d" % (p, i), partition=p) for p in (0, 1) for i in range(first, first + count)
        ]
        for future in sent:
            future.result(30)


def upper(spark: SparkSession, brokers: str, source: str) -> DataFrame:
    """Each row to the sink partition of its source partition's number: the micro-batches' slices are known."""
    reader = spark.readStream.format("tidelog").option("brokers", brokers).option("streams", source)
    return reader.option("startingOffsets", "earliest").load().selectExpr("upper(value) AS value", "partition")


def run_killed(spark: SparkSession, job: Job) -> None:
    """Micro-batch 0 (10 rows from each partition) appended and committed by the sink; then the driver dies."""
    source, sink, checkpoint = driver_crash_streams(job)
    with TidelogClient(job.brokers) as client:
        client.admin.create_stream(source, partitions=2)
        client.admin.create_stream(sink, partitions=2)
    produce(job.brokers, source, 0, 10)
    spark.dataSource.register(KillOnCommit)
    pids = f"{spark.sparkContext._gateway.proc.pid},{os.getpid()}"  # type: ignore[attr-defined]
    writer = upper(spark, job.brokers, source).writeStream.format(KillOnCommit.name()).option("brokers", job.brokers)
    writer = writer.option("stream", sink).option("killAfterCommit", "0").option("driverPids", pids)
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(QUERY_TIMEOUT)
    raise AssertionError(f"the driver outlived the sink's commit of micro-batch 0: {query.exception()}")


def run_driver_crashes(spark: SparkSession, job: Job) -> dict[str, Any]:
    """The killed query restarted, then a crash staged in the middle of micro-batch 2, then restarted again."""
    source, sink, checkpoint = driver_crash_streams(job)

    def run() -> dict[int, int]:
        writer = upper(spark, job.brokers, source).writeStream.format("tidelog").option("brokers", job.brokers)
        query = writer.option("stream", sink).option("checkpointLocation", str(checkpoint))
        running = query.trigger(availableNow=True).start()
        assert running.awaitTermination(QUERY_TIMEOUT), "a restarted query did not finish in time"
        assert running.exception() is None, running.exception()
        return {int(p["batchId"]): int(p["numInputRows"]) for p in running.recentProgress}

    produce(job.brokers, source, 10, 10)
    restarted = run()  # micro-batch 0 again (Spark's commit log lacks it), then 1
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    produce(job.brokers, source, 20, 5)
    staged = pa.Table.from_arrays(  # what task 0 of micro-batch 2 appends: source partition 0's new rows
        [
            pa.array([b"V-0-%d" % i for i in range(20, 25)], pa.binary()),
            pa.nulls(5, pa.binary()),
            pa.nulls(5, ROWS_SCHEMA.field("headers").type),
        ],
        schema=ROWS_SCHEMA,
    )
    rows = TaskRows(query_id, (PartitionRows(sink, 0, staged),))
    commit_task(SinkOptions((job.brokers,), sink), rows, Fence(query_id, 2, 0), 0)
    completed = run()  # micro-batch 2: task 0's slice is in, task 1 writes its own
    with TidelogClient(job.brokers) as client, client.consumer(sink, stop_at_end=True) as consumer:
        written = sorted((record.partition, record.offset, record.value) for record in consumer)
    assert [(p, v) for p, _, v in written] == [(p, b"V-%d-%d" % (p, i)) for p in (0, 1) for i in range(25)], written
    return {"restarted": restarted, "completed": completed, "rows": len(written)}


def main(argv: list[str]) -> int:
    given = json.loads(argv[0])
    job = Job(**{**given, "parts": tuple(given.get("parts", Job.parts))})
    builder = SparkSession.builder.appName("tidelog-standalone-test")
    for key, value in {
        **job.config,
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        sensors = run_example(spark, job) if "example" in job.parts else None
        crash = run_crash(spark, job) if "crash" in job.parts else None
        if "killed" in job.parts:
            run_killed(spark, job)
        driver_crashes = run_driver_crashes(spark, job) if "driver_crashes" in job.parts else None
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver is listed too
    finally:
        spark.stop()
    print(
        json.dumps(
            {
                "master": job.config["spark.master"],
                "executors": executors,
                "example": sensors,
                "crash": crash,
                "driver_crashes": driver_crashes,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
