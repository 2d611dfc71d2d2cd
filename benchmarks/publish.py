"""Publish benchmark: a tidelog single broker against a NATS JetStream single server, in the same run.

Run: ``.venv/bin/python -m benchmarks.publish [--quick]``. Both servers are started here, one after the other
(never at the same time), each with its data in its own directory under one scratch directory on the same disk,
and stopped by PID afterwards. tidelog runs as ``tidelog serve`` in its own process (with its embedded NATS and
etcd), as JetStream does, so the broker never shares this process's event loop or GIL with the clients. The
clients (nats-py and tidelog's) share one uvloop loop here (``--loop asyncio`` for the default one). Each run
alternates which side goes first. Messages are distinct random values, the same list for both sides. The fsync
produce measurements use fewer messages (``fsync_messages``) than the others, as JetStream then fsyncs each one.

Durability modes (each side gets a fresh server per mode and run):

- ``fsync``: tidelog ``default_flush_policy = "always"`` (fsync before the ack, one fsync per group of batches);
  JetStream ``sync_interval: always`` (fsync on every write).
- ``nofsync``: tidelog ``"never"``; JetStream's default (sync every two minutes).

Metrics (``size`` is ``100b`` or ``1k``, ``mode`` is ``fsync`` or ``nofsync``; ``ratio`` = tidelog ÷ JetStream):

- ``produce_{size}_{mode}`` msg/s, every message acknowledged. tidelog: its client's batching producer.
  JetStream: ``js.publish_async`` with up to 4000 acks outstanding (faster than windows of ``js.publish`` under
  ``asyncio.gather``: a single future per message and no request-inbox bookkeeping), then every ack checked.
- ``consume_{size}`` msg/s, reading back every message produced in the ``nofsync`` run, each message's value in
  hand. tidelog: its consumer's ``fetch_batches()``, decoding every batch's records (``FetchedBatch.records()``,
  faster than ``async for record in consumer``). JetStream: a pull consumer (``AckNone``) fed by pipelined pull
  requests of 10 000 messages delivered to a callback subscription. nats-py's ``PullSubscription.fetch`` pops
  every message through ``next_msg`` and manages only ~30k msg/s here; pulling into a callback is ~5x faster and
  is the same pull consumer on the server. Both sides check the count and the bytes read.
- ``consume_{size}_batches`` (informational, no target) msg/s: tidelog reading the same messages as whole
  CRC-checked batches, counted from their headers without decoding a record; the peer is JetStream's
  ``consume_{size}``, which has no such mode. It shows what record decoding costs the consumer.
- ``latency_p50_{mode}``, ``latency_p99_{mode}`` µs, 1 KiB, one publish at a time: tidelog acks ``ALL`` with
  ``linger_ms=0``; JetStream ``js.publish`` awaiting its ack. Ratio ≤ 1 is better.
- ``nats_ingest_{size}`` msg/s from plain NATS publishes (one nats-py core publisher, the same code for both, with
  a ``flush()`` every few hundred messages) to all of them committed: tidelog's partition high watermark
  (``Admin.describe_stream``, LIST_OFFSETS at the leader), JetStream's ``stream_info`` message count, polled
  every 5 ms once the publisher is done. A warm-up message first proves each side is subscribed.
  Measured in the ``nofsync`` mode (JetStream's default durability; tidelog's ``never``).

- ``produce_1k_encrypted`` msg/s (tidelog only, ``nofsync``): ``produce_1k_nofsync`` into a stream created with
  ``encryption`` (every batch sealed with AES-256-GCM on the broker, :mod:`tidelog.storage.encryption`); the
  peer is tidelog's own ``produce_1k_nofsync`` of the same run, so ``ratio`` is what encryption at rest keeps.
- ``produce_1k_tls``, ``consume_1k_tls`` msg/s: the ``nofsync`` 1 KiB produce and consume with TLS on both sides'
  client ports; ``*_tls_vs_plaintext``: tidelog with TLS ÷ tidelog in clear, same run (:mod:`benchmarks._tls`).

What the broker's metrics cost: ``metrics_overhead``, ``metrics_overhead_nofsync``, the broker's CPU per message
``metrics_overhead_cpu_{mode}`` and ``metrics_scrape_1000`` (see ``benchmarks._metrics``), measured after the runs
on brokers of their own; ``--metrics-only`` runs just those (``--overhead-rounds``, ``--overhead-messages`` size
the overhead measurement).

Both sides publish without deduplication, as ``js.publish`` does without a ``Nats-Msg-Id``: tidelog's producer
runs with ``idempotent=False`` (its default is idempotent since issue 5). What idempotence costs is reported
beside it: ``latency_p50_{mode}_idempotent`` / ``latency_p99_{mode}_idempotent`` (informational, no target;
the peer is JetStream's plain latency) measure tidelog's default producer the same way.

tidelog's producer uses ``--codec`` (default ``none``): on loopback with incompressible values, none, lz4 and
zstd measured within noise of each other here, and none does the least work on both ends.

Each value is the median over the runs. The last line is the summary with the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections import defaultdict
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from benchmarks._metrics import (
    METRICS_ROWS,
    OverheadPlan,
    measure_overhead,
    measure_scrape,
    metrics_rows,
    overhead_spread,
)
from benchmarks._publish_sides import SIDES, Samples, Side, TidelogServer, TidelogSide, make_payloads, percentile
from benchmarks._tls import TLS_APPROACH, TLS_LABEL, TLS_METRICS, measure_tls, tls_rows
from tidelog.client import Codec
from tidelog.local.certificates import make_dev_certificates
from tidelog.protocol.errors import TidelogError

BENCH = "publish"
SIZES: dict[str, int] = {"100b": 100, "1k": 1024}
MODES = ("fsync", "nofsync")
LATENCY_LABEL = "1k"
TARGETS = (
    Target("produce_1k_fsync", ">=", 4),
    Target("produce_1k_nofsync", ">=", 4),
    Target("consume_1k", ">=", 3),
    Target("latency_p50_fsync", "<=", 1),
    Target("nats_ingest_1k", ">=", 0.8),
    Target("metrics_overhead", ">=", 0.97),
    Target("metrics_scrape_1000", "<=", 1),
    Target("produce_1k_encrypted", ">=", 0.7),
    Target("produce_1k_tls", ">=", 3),
    Target("produce_1k_tls_vs_plaintext", ">=", 0.6),
)
ENCRYPTED = "produce_1k_encrypted"
"""Measured on tidelog alone; its peer is tidelog's own plaintext produce of the same size and mode."""

APPROACHES = {
    "tidelog": "tidelog serve as a child process; Producer (acks ALL, idempotent=False, batching, max_in_flight 8) "
    "awaiting every "
    "record's future; Consumer.fetch_batches() decoding records; latency: one send_and_wait at a time "
    "(linger 0, acks ALL); ingest: high watermark via Admin.describe_stream",
    "tls": TLS_APPROACH,
    "jetstream": "nats-server -js, file storage; js.publish_async (4000 outstanding), every ack checked; pull "
    "consumer (AckNone) with pipelined 10k-message pull requests into a callback subscription; latency: one "
    "js.publish at a time; ingest: stream_info message count",
}


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    messages: int  # per nofsync produce, consume and ingest measurement
    fsync_messages: int  # per fsync produce measurement (JetStream fsyncs every message: 1-4k msg/s here)
    latency_samples: int
    latency_warmup: int
    overhead: OverheadPlan

    def produce_count(self, mode: str) -> int:
        return self.fsync_messages if mode == "fsync" else self.messages

    @property
    def latency_count(self) -> int:
        return self.latency_warmup + self.latency_samples

    @property
    def max_count(self) -> int:
        return max(self.messages, self.fsync_messages, self.latency_count, self.overhead.messages)


QUICK = Plan(
    runs=2,
    messages=20_000,
    fsync_messages=10_000,
    latency_samples=1000,
    latency_warmup=100,
    overhead=OverheadPlan(rounds=4, messages=20_000),
)
FULL = Plan(
    runs=3,
    messages=100_000,
    fsync_messages=30_000,
    latency_samples=4000,
    latency_warmup=200,
    overhead=OverheadPlan(rounds=16, messages=100_000),
)


async def measure_side(
    side: Side, mode: str, plan: Plan, payloads: Mapping[str, list[bytes]], samples: Samples
) -> None:
    for label, size in SIZES.items():
        stream = f"produce_{label}_{mode}"
        count = plan.produce_count(mode)
        rate = await side.produce(stream, payloads[label][:count])
        samples[side.name, f"produce_{label}_{mode}"].append(rate)
        log(f"  {side.name} produce_{label}_{mode}: {rate:,.0f} msg/s ({count} messages)")
        if mode == "nofsync":
            rate = await side.consume(stream, count, size)
            samples[side.name, f"consume_{label}"].append(rate)
            log(f"  {side.name} consume_{label}: {rate:,.0f} msg/s")
            if side.batch_reads:
                rate = await side.consume(stream, count, size, decode=False)
                samples[side.name, f"consume_{label}_batches"].append(rate)
                log(f"  {side.name} consume_{label}_batches: {rate:,.0f} msg/s")
    if side.encryption and mode == "nofsync":
        count = plan.produce_count(mode)
        rate = await side.produce(ENCRYPTED, payloads["1k"][:count], encrypted=True)
        samples[side.name, ENCRYPTED].append(rate)
        log(f"  {side.name} {ENCRYPTED}: {rate:,.0f} msg/s ({count} messages)")
    lat = await side.latencies(f"latency_{mode}", payloads[LATENCY_LABEL][: plan.latency_count], plan.latency_warmup)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    samples[side.name, f"latency_p50_{mode}"].append(p50)
    samples[side.name, f"latency_p99_{mode}"].append(p99)
    log(f"  {side.name} latency {mode}: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs")
    if side.idempotence:
        lat = await side.latencies(
            f"latency_{mode}_idem", payloads[LATENCY_LABEL][: plan.latency_count], plan.latency_warmup, idempotent=True
        )
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        samples[side.name, f"latency_p50_{mode}_idempotent"].append(p50)
        samples[side.name, f"latency_p99_{mode}_idempotent"].append(p99)
        log(f"  {side.name} latency {mode}, idempotent: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs")
    if mode == "nofsync":
        for label in SIZES:
            rate = await side.nats_ingest(f"ingest_{label}", payloads[label][: plan.messages])
            samples[side.name, f"nats_ingest_{label}"].append(rate)
            log(f"  {side.name} nats_ingest_{label}: {rate:,.0f} msg/s")


async def run(plan: Plan, sides: Sequence[str], root: Path, codec: Codec, *, metrics_only: bool = False) -> Samples:
    samples: Samples = defaultdict(list)
    payloads = {label: make_payloads(size, plan.max_count) for label, size in SIZES.items()}
    certificates = make_dev_certificates(root / "tls")
    for run_no in range(0 if metrics_only else plan.runs):
        # Alternate which side goes first, so drift on a shared machine does not always favour the same one.
        order = list(sides) if run_no % 2 == 0 else list(reversed(sides))
        for mode in MODES:
            for name in order:
                log(f"run {run_no + 1}/{plan.runs}, {mode}: {name}")
                async with SIDES[name](mode, root / f"run{run_no}-{mode}-{name}", codec) as side:
                    await measure_side(side, mode, plan, payloads, samples)
        for name in order:
            log(f"run {run_no + 1}/{plan.runs}, nofsync with TLS: {name}")
            async with SIDES[name]("nofsync", root / f"run{run_no}-tls-{name}", codec, certificates) as side:
                await measure_tls(side, payloads[TLS_LABEL][: plan.messages], SIZES[TLS_LABEL], samples)
    if "tidelog" in sides:

        def open_side(mode: str, metrics: bool) -> contextlib.AbstractAsyncContextManager[Any]:
            data_dir = root / f"overhead-{mode}-{'on' if metrics else 'off'}"
            return TidelogSide.open(mode, data_dir, codec, metrics=metrics)

        await measure_overhead(open_side, plan.overhead, payloads["1k"], samples)
        log("metrics: a scrape of 1,000 partitions")
        try:
            async with TidelogServer(root / "scrape", flush_policy="never") as server:
                await measure_scrape(server, samples)
        except (TidelogError, TimeoutError, RuntimeError) as exc:  # the row is then missing: its target unmet
            log(f"metrics_scrape_1000 not measured: {type(exc).__name__}: {exc}")
    return samples


def metric_names() -> list[tuple[str, str]]:
    names: list[tuple[str, str]] = []
    for mode in MODES:
        names += [(f"produce_{label}_{mode}", "msg/s") for label in SIZES]
    names += [(f"consume_{label}", "msg/s") for label in SIZES]
    names += [(f"consume_{label}_batches", "msg/s") for label in SIZES]
    for mode in MODES:
        names += [(f"latency_p50_{mode}", "µs"), (f"latency_p99_{mode}", "µs")]
        names += [(f"latency_p50_{mode}_idempotent", "µs"), (f"latency_p99_{mode}_idempotent", "µs")]
    names += [(f"nats_ingest_{label}", "msg/s") for label in SIZES]
    names += [("metrics_overhead", "msg/s"), ("metrics_overhead_nofsync", "msg/s")]
    names += [("metrics_overhead_cpu_fsync", "µs/msg"), ("metrics_overhead_cpu_nofsync", "µs/msg")]
    names.append(("metrics_scrape_1000", "ms"))
    names.append((ENCRYPTED, "msg/s"))
    names += list(TLS_METRICS)
    return names


def rows_from(samples: Samples, sides: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    for metric, unit in metric_names():
        if metric in METRICS_ROWS:
            rows += metrics_rows(BENCH, metric, unit, samples)
            continue
        ours = samples.get(("tidelog", metric))
        # JetStream has one way to consume, and publishes without deduplication
        theirs = samples.get(("jetstream", metric.removesuffix("_batches").removesuffix("_idempotent")))
        if metric == ENCRYPTED:
            theirs = samples.get(("tidelog", "produce_1k_nofsync"))  # what encryption costs tidelog itself
        if ours:
            rows.append(Row(BENCH, metric, median(ours), unit, median(theirs) if theirs else None))
        elif theirs and "tidelog" not in sides:  # peer-only run (development): report the peer as the value
            rows.append(Row(BENCH, metric, median(theirs), unit))
    return rows + tls_rows(BENCH, samples)


def run_loop(kind: str, main: Coroutine[Any, Any, Samples]) -> Samples:
    if kind == "uvloop":
        import uvloop

        result: Samples = uvloop.run(main)
        return result
    return asyncio.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.publish", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (under ~2 minutes)")
    parser.add_argument("--runs", type=int, help="runs per metric (medians are taken over them)")
    parser.add_argument("--messages", type=int, help="messages per nofsync measurement")
    parser.add_argument("--fsync-messages", type=int, help="messages per fsync produce measurement")
    parser.add_argument(
        "--codec", choices=[codec.name.lower() for codec in Codec], default="none", help="tidelog producer codec"
    )
    parser.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default="uvloop", help="event loop of the benchmark's clients"
    )
    parser.add_argument(
        "--metrics-only", action="store_true", help="only the metrics measurements (overhead and scrape)"
    )
    parser.add_argument("--overhead-rounds", type=int, help="metrics_overhead: alternations per mode")
    parser.add_argument("--overhead-messages", type=int, help="metrics_overhead: messages per sample")
    parser.add_argument("--sides", default="jetstream,tidelog", help="comma-separated sides (development)")
    args = parser.parse_args(argv)
    codec = Codec[args.codec.upper()]
    base = QUICK if args.quick else FULL
    plan = Plan(
        runs=args.runs or base.runs,
        messages=args.messages or base.messages,
        fsync_messages=args.fsync_messages or base.fsync_messages,
        latency_samples=base.latency_samples,
        latency_warmup=base.latency_warmup,
        overhead=OverheadPlan(
            rounds=args.overhead_rounds or base.overhead.rounds,
            messages=args.overhead_messages or base.overhead.messages,
        ),
    )
    sides = [name.strip() for name in args.sides.split(",") if name.strip()]
    if unknown := set(sides) - set(SIDES):
        parser.error(f"unknown sides: {', '.join(sorted(unknown))}")
    log(f"plan: {plan}, sides: {sides}, tidelog codec: {codec.name.lower()}, loop: {args.loop}")
    clock = RunClock.now()
    with scratch_dir("tidelog-bench-publish-") as root:
        samples = run_loop(args.loop, run(plan, sides, root, codec, metrics_only=args.metrics_only))
    rows = rows_from(samples, sides)
    report(
        BENCH,
        rows,
        TARGETS,
        clock,
        runs=plan.runs,
        messages=plan.messages,
        fsync_messages=plan.fsync_messages,
        latency_samples=plan.latency_samples,
        tidelog_codec=codec.name.lower(),
        metrics_overhead_spread=overhead_spread(samples),
        approaches=APPROACHES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
