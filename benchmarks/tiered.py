"""Tiered storage benchmark: reads of offloaded history beside the object store's own speed, in the same run.

Run: ``.venv/bin/python -m benchmarks.tiered [--quick]``. One S3-compatible server (SeaweedFS's ``weed mini``,
:class:`~tidelog.launch.object_store.S3Server`) and one ``tidelog serve`` child process tiering to it
(``tiered_interval_ms`` :data:`TIER_INTERVAL_MS`) hold two streams of one partition each, written with the same
1 KiB random values (no compression), acks ALL: ``tiered`` (segments of :data:`SEGMENT_BYTES`, everything sealed
offloaded and deleted from the broker's disk: ``local_retention_bytes`` 1) and ``local`` (``tiered=false``).

Metrics:

- ``upload_lag_s``: while the ``tiered`` stream is produced to (acks ALL, 1 KiB records, as fast as the producer
  goes), the broker's list offsets are polled every :data:`POLL_S`; for each step of the offloaded end
  (``remote_end``) the lag is the time it appeared minus the time the high watermark first reached it (the
  segment committed whole). Median over the segments; no peer (the time of a raw create-only PUT of one
  segment-sized object to the same server is given in the summary as ``raw_put_s``, the floor of an upload).
- ``remote_read`` MB/s: a tidelog consumer reading the ``tiered`` stream's offloaded offsets only (from 0 to
  the offloaded end, all of them in the store, none on the broker's disk), bytes counted as the batches it
  receives. The peer is ``obstore`` GETting the same ``.log`` objects whole from the same server, one after
  another, from this process (what the store gives a client that knows the names). ``ratio`` = tidelog ÷ raw.
  Target ≥ 0.7.
- ``spark_remote_scan`` rows/s: a batch Spark query (``local[2]``, ``spark.read.format("tidelog")``, count by
  partition) over the offloaded offsets of ``tiered``, its tasks reading the segments from the bucket themselves
  (``tieredStore`` and ``etcd`` options: :mod:`tidelog.spark.remote`), ÷ the same query over the same offsets of
  ``local`` (read through the broker from its segments). Wall time of ``collect()``, planning included.
  ``maxOffsetsPerSplit`` is a quarter of the range on both sides, so both run as several tasks. Target ≥ 0.8.
  ``--no-spark`` leaves it out.

Runs alternate which side goes first, after one uncounted warm-up round; values are medians. The machine is
measured as it is: on a shared, loaded machine the numbers are noisy (the summary gives the load average).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
from obstore.store import S3Store

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from tidelog.client import Admin, Codec, Consumer, LoopThread, Producer
from tidelog.launch.object_store import S3Server
from tidelog.launch.ports import free_ports
from tidelog.local.serve_process import ServedBroker, start_served_broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BENCH = "tiered"
TIERED = "tiered"
LOCAL = "local"
VALUE_SIZE = 1024
TIER_INTERVAL_MS = 500
POLL_S = 0.05
TARGETS = (Target("remote_read", ">=", 0.7), Target("spark_remote_scan", ">=", 0.8))
APPROACHES = {
    "upload_lag_s": "time from the high watermark passing a segment's end to the broker reporting it offloaded, "
    "under a 1 KiB acks-ALL produce load; list offsets polled every POLL_S",
    "remote_read": "tidelog Consumer reading only offloaded offsets through the broker (ranged GETs with "
    "read-ahead, every batch CRC-checked) vs obstore GETs of the same objects whole, one after another",
    "spark_remote_scan": "spark.read.format('tidelog') count by partition over the offloaded offsets, tasks reading "
    "the bucket directly (tieredStore, etcd) vs the same query over the same offsets of a stream kept on the "
    "broker's disk, read through the broker",
}


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    mib: int
    """MiB of 1 KiB records written to each stream."""
    segment_bytes: int


QUICK = Plan(runs=3, mib=48, segment_bytes=4 * 1024 * 1024)
FULL = Plan(runs=5, mib=256, segment_bytes=16 * 1024 * 1024)


# -- writing, and the upload lag under the write -----------------------------------------------------------------


async def produce(bootstrap: str, stream: str, records: int) -> None:
    values = [os.urandom(VALUE_SIZE) for _ in range(1024)]
    async with Producer(bootstrap, compression=Codec.NONE, idempotent=False) as producer:
        for i in range(records):
            await producer.send(stream, values[i % len(values)], partition=0)
        await producer.flush()


async def bounds(admin: Admin, stream: str) -> tuple[int, int, int]:
    """(high watermark, local log start, offloaded end; -1: none) of the stream's partition 0."""
    p = (await admin.describe_stream(stream)).partitions[0]
    return p.high_watermark, p.local_log_start, p.remote_end


async def produce_measuring_lag(bootstrap: str, records: int, per_segment: int) -> list[float]:
    """Produce to the tiered stream while polling its bounds; the upload lag of each offloaded step."""
    hw_seen: list[tuple[float, int]] = []  # (time, high watermark), increasing
    uploads: list[tuple[float, int]] = []  # (time, offloaded end) at each step
    done = asyncio.Event()

    async def poll(admin: Admin) -> None:
        last_end = -1
        deadline = None
        while True:
            hw, _, end = await bounds(admin, TIERED)
            now = time.monotonic()
            hw_seen.append((now, hw))
            if end > last_end:
                uploads.append((now, end))
                last_end = end
            if done.is_set():
                deadline = deadline or now + 30 * TIER_INTERVAL_MS / 1000
                if hw - end <= 2 * per_segment or now > deadline:
                    return  # the sealed segments are up (the active one stays local)
            await asyncio.sleep(POLL_S)

    async with Admin(bootstrap) as admin:
        poller = asyncio.create_task(poll(admin))
        await produce(bootstrap, TIERED, records)
        done.set()
        await poller
    lags = []
    for at, end in uploads:
        if end <= 0:
            continue
        reached = next((t for t, hw in hw_seen if hw >= end), None)
        if reached is not None:
            lags.append(max(0.0, at - reached))
    return lags


async def wait_offloaded(bootstrap: str, per_segment: int, within: float = 300.0) -> tuple[int, int]:
    """Wait until the tiered stream's sealed segments are offloaded (all but the last two segments' worth of
    records, ``per_segment`` each) and gone from the broker's disk; return the offloaded end and the high
    watermark."""
    deadline = time.monotonic() + within
    async with Admin(bootstrap) as admin:
        while True:
            hw, local_start, end = await bounds(admin, TIERED)
            if end > 0 and local_start >= end and hw - end <= 2 * per_segment:
                return end, hw
            if time.monotonic() > deadline:
                raise RuntimeError(f"not offloaded within {within:.0f} s: local start {local_start}, end {end}")
            await asyncio.sleep(0.2)


# -- remote_read -------------------------------------------------------------------------------------------------


async def consume(bootstrap: str, end: int) -> tuple[int, float]:
    """Read offsets [0, end) of the tiered stream: (batch bytes received, seconds)."""
    received = 0
    started = time.monotonic()
    async with Consumer(bootstrap, TIERED, start=0, max_bytes=4 * 1024 * 1024) as consumer:
        while consumer.position(0) < end:
            for batch in await consumer.poll() or ():
                if batch.base_offset < end:
                    received += len(batch.data)
    return received, time.monotonic() - started


def s3_client(server: S3Server) -> S3Store:
    return S3Store(
        server.bucket,
        endpoint=server.endpoint,
        region="us-east-1",
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": datetime.timedelta(seconds=60)},
    )


async def segment_objects(store: S3Store, end: int) -> list[str]:
    """The tiered stream's ``.log`` objects holding offsets below ``end``, in offset order."""
    listed = await obstore.list(store, chunk_size=1000).collect_async()  # under <namespace>/<stream>/<partition>/
    paths = (str(meta["path"]) for meta in listed)
    names = sorted(p for p in paths if p.endswith(".log") and p.rsplit("/", 3)[-3:-1] == [TIERED, "0"])
    return [name for name in names if int(name.rsplit("/", 1)[1][:20]) < end]


async def raw_get(store: S3Store, names: list[str]) -> tuple[int, float]:
    """GET every object whole, one after another: (bytes, seconds)."""
    received = 0
    started = time.monotonic()
    for name in names:
        result = await obstore.get_async(store, name)
        received += len(await result.bytes_async())
    return received, time.monotonic() - started


async def raw_put_seconds(store: S3Store, size: int, runs: int) -> float:
    data = os.urandom(size)
    samples = []
    for i in range(runs):
        started = time.monotonic()
        await obstore.put_async(store, f"bench-put/{i}-{time.time_ns()}", data, mode="create")
        samples.append(time.monotonic() - started)
    return median(samples)


async def measure_remote_read(bootstrap: str, store: S3Store, end: int, runs: int) -> Row:
    names = await segment_objects(store, end)
    samples: dict[str, list[float]] = {"tidelog": [], "raw": []}
    for label, i in [("warm-up", 0)] + [("run", i) for i in range(runs)]:
        for side in ("tidelog", "raw") if i % 2 == 0 else ("raw", "tidelog"):
            nbytes, seconds = await (consume(bootstrap, end) if side == "tidelog" else raw_get(store, names))
            rate = nbytes / seconds / 1e6
            log(f"remote_read {label} {i} {side}: {nbytes / 1e6:.1f} MB in {seconds:.2f} s = {rate:.1f} MB/s")
            if label == "run":
                samples[side].append(rate)
    return Row(BENCH, "remote_read", median(samples["tidelog"]), "MB/s", median(samples["raw"]))


# -- spark_remote_scan -------------------------------------------------------------------------------------------


def spark_session() -> SparkSession:
    from pyspark.sql import SparkSession

    from tidelog.spark import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidelog-bench-tiered")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def scan(spark: SparkSession, options: dict[str, str], stream: str, end: int) -> float:
    """Rows/s of a batch count over offsets [0, end) of ``stream``."""
    reader = spark.read.format("tidelog").options(**options).option("streams", stream)
    reader = reader.option("maxOffsetsPerSplit", max(1, end // 4))
    reader = reader.option("startingOffsets", "earliest").option("endingOffsets", json.dumps({stream: {"0": end}}))
    started = time.monotonic()
    rows = reader.load().groupBy("partition").count().collect()
    seconds = time.monotonic() - started
    counted = sum(int(row["count"]) for row in rows)
    if counted != end:
        raise RuntimeError(f"spark scan of {stream}: counted {counted} rows, expected {end}")
    return counted / seconds


def measure_spark(options: dict[str, str], end: int, runs: int) -> Row:
    spark = spark_session()
    try:
        samples: dict[str, list[float]] = {TIERED: [], LOCAL: []}
        for label, i in [("warm-up", 0)] + [("run", i) for i in range(runs)]:
            for stream in (TIERED, LOCAL) if i % 2 == 0 else (LOCAL, TIERED):
                rate = scan(spark, options, stream, end)
                log(f"spark {label} {i} {stream}: {rate:,.0f} rows/s")
                if label == "run":
                    samples[stream].append(rate)
    finally:
        spark.stop()
    return Row(BENCH, "spark_remote_scan", median(samples[TIERED]), "rows/s", median(samples[LOCAL]), digits=0)


# -- the run -----------------------------------------------------------------------------------------------------


async def start(plan: Plan, root: Path) -> tuple[S3Server, ServedBroker, int]:
    """The S3 server, the broker, and the port of the broker's embedded etcd (Spark plans from it)."""
    server = S3Server(root / "s3")
    await server.start()
    log(f"weed mini at {server.endpoint}")
    (root / "broker").mkdir()
    (etcd_port,) = free_ports(1)
    try:
        broker = await start_served_broker(
            root / "broker",
            log_level="warning",
            embedded_etcd_port=str(etcd_port),
            tiered_interval_ms=str(TIER_INTERVAL_MS),
            **server.settings(),
        )
    except BaseException:
        await server.stop()
        raise
    log(f"tidelog serve pid {broker.process.pid}, wire {broker.wire_address}")
    async with Admin(broker.wire_address) as admin:
        tiering = {"segment_max_bytes": plan.segment_bytes}
        await admin.create_stream(TIERED, config={**tiering, "local_retention_bytes": 1})
        await admin.create_stream(LOCAL, config={**tiering, "tiered": False})
    return server, broker, etcd_port


async def write_and_read(plan: Plan, server: S3Server, broker: ServedBroker) -> tuple[list[Row], dict[str, Any]]:
    records = plan.mib * 1024 * 1024 // VALUE_SIZE
    started = time.monotonic()
    lags = await produce_measuring_lag(broker.wire_address, records, plan.segment_bytes // VALUE_SIZE)
    log(f"produced {records} records to {TIERED} in {time.monotonic() - started:.1f} s; upload lags {lags}")
    await produce(broker.wire_address, LOCAL, records)
    end, hw = await wait_offloaded(broker.wire_address, plan.segment_bytes // VALUE_SIZE)
    log(f"offloaded offsets 0..{end - 1} of {hw}")
    store = s3_client(server)
    put_s = await raw_put_seconds(store, plan.segment_bytes, 3)
    rows = [Row(BENCH, "upload_lag_s", median(lags) if lags else float("nan"), "s", digits=3)]
    rows.append(await measure_remote_read(broker.wire_address, store, end, plan.runs))
    return rows, {"offloaded_end": end, "raw_put_s": round(put_s, 3)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tiered", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--runs", type=int, help="runs per side (medians are taken over them)")
    parser.add_argument("--mib", type=int, help="MiB of 1 KiB records written to each stream")
    parser.add_argument("--no-spark", action="store_true", help="leave out spark_remote_scan")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    plan = Plan(runs=args.runs or base.runs, mib=args.mib or base.mib, segment_bytes=base.segment_bytes)
    log(f"plan: {plan}")
    clock = RunClock.now()
    runner = LoopThread("bench-tiered")  # one loop owns the child processes from start to stop
    try:
        with scratch_dir("tidelog-bench-tiered-") as root:
            server, broker, etcd_port = runner.run(start(plan, root))
            try:
                rows, extra = runner.run(write_and_read(plan, server, broker))
                if not args.no_spark:
                    end = int(extra["offloaded_end"])
                    rows.append(measure_spark(spark_options(server, broker, etcd_port), end, plan.runs))
            finally:
                runner.run(stop(server, broker))
    finally:
        runner.close()
    report(BENCH, rows, TARGETS, clock, runs=plan.runs, mib=plan.mib, **extra, approaches=APPROACHES)
    return 0


def spark_options(server: S3Server, broker: ServedBroker, etcd_port: int) -> dict[str, str]:
    """The source's options: the broker, and the store and etcd, so that the tasks read offloaded segments from
    the bucket themselves (the ``local`` stream does not tier: its ranges go to the broker either way)."""
    return {
        "brokers": broker.wire_address,
        "tieredStore": server.url,
        "tieredStore.endpoint": server.endpoint,
        "tieredStore.accessKeyId": server.access_key_id,
        "tieredStore.secretAccessKey": server.secret_access_key,
        "etcd": f"127.0.0.1:{etcd_port}",
    }


async def stop(server: S3Server, broker: ServedBroker) -> None:
    try:
        await broker.stop()
    finally:
        await server.stop()


if __name__ == "__main__":
    sys.exit(main())
