"""The driver of :mod:`tests.spark.test_standalone`, run as its own process (one SparkContext per process: the
test session already holds a ``local[2]`` one): on a standalone cluster, the example pipeline, then the sink's
crash test where every task's first attempt fails right after appending and Spark retries it on an executor.

``python -m tests.spark.standalone_driver '<json>'`` with the keys of :class:`Job`; prints one JSON line of
what it saw and exits 0, or fails with the assertion's traceback.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from tidelog.client import TidelogClient
from tidelog.spark.sink import FAIL_AFTER_APPEND_PROPERTY

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nats_to_spark_to_tidelog.py"
QUERY_TIMEOUT = 120.0


@dataclass(frozen=True)
class Job:
    config: dict[str, str]  # StandaloneSpark.session_config()
    brokers: str
    nats_url: str
    prefix: str  # of the streams this run creates
    workdir: str
    parts: tuple[str, ...] = ("example", "crash")  # what to run: the example pipeline, the sink's crash test


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
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver is listed too
    finally:
        spark.stop()
    print(
        json.dumps({"master": job.config["spark.master"], "executors": executors, "example": sensors, "crash": crash})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
