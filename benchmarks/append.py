"""Transactional append benchmark: appends against plain produce of the same bytes, on one broker, in one run.

Run: ``.venv/bin/python -m benchmarks.append [--quick]``. One ``tidelog serve`` child process (embedded NATS and
etcd, flush ``always``: fsync before every acknowledgement), stopped by PID afterwards. Both sides write 1 KiB
records (distinct random values, the same for both), acks ``ALL``, into fresh single-partition streams.

Metrics (``ratio`` = append ÷ produce):

- ``append_1m``, ``append_64m`` MB/s of record values: one transactional append of 1 MiB (1024 records) or
  64 MiB (65 536 records) at a time, each awaited before the next (:class:`tidelog.client.Appender`, streamed
  in 1 MiB chunks). Peer: the same records sent by the batching producer (non-idempotent, as an append carries
  no producer id), then ``flush()`` awaited — the same bytes, acknowledged the same way, per unit.
- ``cas_p50`` µs: an append of one 100-byte record with ``expected_offset`` set to the log end, one at a time.
  Peer (informational, no target): one 100-byte produce with ``send_and_wait`` (``linger_ms=0``), the cheapest
  acknowledged write there is.

Each value is the median over the runs (sides alternate which goes first). The last line is the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from benchmarks._publish_sides import TidelogServer, percentile
from tidelog.client import Acks, Admin, Appender, Cluster, Producer

BENCH = "append"
RECORD = 1024
MiB = 1024 * 1024
Measure = Callable[[], Awaitable[float]]
TARGETS = (Target("append_1m", ">=", 0.8), Target("append_64m", ">=", 0.8))


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    units_1m: int  # 1 MiB appends per measurement
    units_64m: int  # 64 MiB appends per measurement
    cas_samples: int
    cas_warmup: int


FULL = Plan(runs=5, units_1m=64, units_64m=3, cas_samples=2000, cas_warmup=100)
QUICK = Plan(runs=3, units_1m=16, units_64m=1, cas_samples=300, cas_warmup=30)


class Bench:
    """The clients of one broker; every measurement gets a fresh stream."""

    def __init__(self, bootstrap: str) -> None:
        self.cluster = Cluster(bootstrap)
        self.admin = Admin(cluster=self.cluster)
        self.appender = Appender(cluster=self.cluster, acks=Acks.ALL, timeout_ms=60_000)
        self._streams = 0

    async def stream(self) -> str:
        self._streams += 1
        name = f"bench-{self._streams}"
        await self.admin.create_stream(name, name)
        return name

    async def appends(self, units: Sequence[list[bytes]]) -> float:
        stream = await self.stream()
        start = time.perf_counter()
        for unit in units:
            await self.appender.append(stream, 0, unit)
        return _megabytes(units) / (time.perf_counter() - start)

    async def produces(self, units: Sequence[list[bytes]]) -> float:
        stream = await self.stream()
        producer = Producer(cluster=self.cluster, acks=Acks.ALL, idempotent=False, linger_ms=0)
        await producer.start()
        try:
            start = time.perf_counter()
            for unit in units:
                futures = [await producer.send(stream, value, partition=0) for value in unit]
                await producer.flush()
                for future in futures:
                    future.result()  # raises if a record was refused
            elapsed = time.perf_counter() - start
        finally:
            await producer.close()
        return _megabytes(units) / elapsed

    async def cas(self, samples: int, warmup: int) -> list[float]:
        stream = await self.stream()
        value = os.urandom(100)
        out: list[float] = []
        end = 0
        for i in range(samples + warmup):
            start = time.perf_counter_ns()
            outcome = await self.appender.append(stream, 0, [value], expected_offset=end)
            if i >= warmup:
                out.append((time.perf_counter_ns() - start) / 1000)
            end = outcome.log_end
        return out

    async def produce_latency(self, samples: int, warmup: int) -> list[float]:
        stream = await self.stream()
        value = os.urandom(100)
        producer = Producer(cluster=self.cluster, acks=Acks.ALL, idempotent=False, linger_ms=0)
        await producer.start()
        out: list[float] = []
        try:
            for i in range(samples + warmup):
                start = time.perf_counter_ns()
                await producer.send_and_wait(stream, value, partition=0)
                if i >= warmup:
                    out.append((time.perf_counter_ns() - start) / 1000)
        finally:
            await producer.close()
        return out

    async def close(self) -> None:
        await self.cluster.close()


def _megabytes(units: Sequence[list[bytes]]) -> float:
    return sum(len(value) for unit in units for value in unit) / 1e6


def _units(count: int, unit_bytes: int) -> list[list[bytes]]:
    per_unit = unit_bytes // RECORD
    return [[os.urandom(RECORD) for _ in range(per_unit)] for _ in range(count)]


async def run(plan: Plan, root: Path) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    units_1m = _units(plan.units_1m, MiB)
    units_64m = _units(plan.units_64m, 64 * MiB)
    async with TidelogServer(root / "broker", flush_policy="always") as server:
        log(f"tidelog pid {server.pid}, wire port {server.wire_port}")
        bench = Bench(server.bootstrap)
        try:
            for run_index in range(plan.runs):
                pairs: list[tuple[str, Measure, Measure]] = [
                    ("append_1m", lambda: bench.appends(units_1m), lambda: bench.produces(units_1m)),
                    ("append_64m", lambda: bench.appends(units_64m), lambda: bench.produces(units_64m)),
                ]
                for metric, ours, peer in pairs:
                    order = [("tidelog", ours), ("peer", peer)]
                    if run_index % 2:
                        order.reverse()
                    for side, measure in order:
                        value = await measure()
                        samples.setdefault(f"{metric}/{side}", []).append(value)
                        log(f"run {run_index + 1}: {metric} {side} {value:.1f} MB/s")
                cas = await bench.cas(plan.cas_samples, plan.cas_warmup)
                base = await bench.produce_latency(plan.cas_samples, plan.cas_warmup)
                samples.setdefault("cas_p50/tidelog", []).append(percentile(cas, 50))
                samples.setdefault("cas_p50/peer", []).append(percentile(base, 50))
                log(
                    f"run {run_index + 1}: cas p50 {percentile(cas, 50):.0f} µs, produce p50 {percentile(base, 50):.0f}"
                )
        finally:
            await bench.close()
    return samples


def rows_from(samples: dict[str, list[float]]) -> list[Row]:
    rows = []
    for metric, unit in (("append_1m", "MB/s"), ("append_64m", "MB/s"), ("cas_p50", "us")):
        rows.append(Row(BENCH, metric, median(samples[f"{metric}/tidelog"]), unit, median(samples[f"{metric}/peer"])))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.append", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (about a minute)")
    parser.add_argument("--runs", type=int, help="runs per metric (medians are taken over them)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    plan = Plan(args.runs or base.runs, base.units_1m, base.units_64m, base.cas_samples, base.cas_warmup)
    log(f"plan: {plan}")
    clock = RunClock.now()
    with scratch_dir("tidelog-bench-append-") as root:
        samples = asyncio.run(run(plan, root))
    rows = rows_from(samples)
    report(
        BENCH,
        rows,
        TARGETS,
        clock,
        runs=plan.runs,
        record_bytes=RECORD,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
