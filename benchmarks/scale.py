"""Scale benchmark: what N one-partition streams cost tidelog, against NATS JetStream holding N streams, in the
same run.

Run: ``.venv/bin/python -m benchmarks.scale [--quick]``. Each side is started here, one after the other (never at
the same time), on free loopback ports, its data under one scratch directory, and stopped by PID afterwards.

- One broker: ``tidelog serve`` (embedded NATS and etcd, flush ``always``) against one ``nats-server -js``
  (file storage, ``sync_interval: always``), N in ``--single`` (100, 1,000 and 5,000; ``--quick`` 50 and 200).
- Three brokers, replication factor 3: :class:`~tidelog.local.cluster.LocalCluster` (one NATS, one etcd, three
  brokers) against a 3-node JetStream cluster with R3 streams, N in ``--replicated`` (100 and 1,000; ``--quick``
  30 and 90).

Each side is charged for every process it runs (:mod:`benchmarks._procstats`: a broker with its embedded NATS
and etcd; the three brokers with the NATS and etcd they share, divided by three). Metrics, for each N
(``ratio`` = tidelog ÷ JetStream; lower is better for all of them):

- ``create_s_{N}`` seconds to create the N streams one after the other, each acknowledged (tidelog
  ``Admin.create_stream``; JetStream ``js.add_stream``). Three brokers: ``create_rf3_s_{N}``.
- ``create_growth_{N}`` ms: the median of the last ten creations; its peer is tidelog's own median of the first
  ten (the N-th stream should cost what the first did; target ratio ≤ 2 at 1,000).
- ``rss_mb_{N}``, ``fds_{N}``: resident MiB and open descriptors once every stream exists and has one message.
  Three brokers: per broker (``rss_rf3_mb_{N}``, ``fds_rf3_{N}``).
- ``idle_cpu_{N}`` % of one core while nothing is published: the median of ``--idle-windows`` windows of
  ``--idle-seconds`` each, after ``SETTLE_S`` of quiet. Three brokers: per broker (``idle_cpu_rf3_{N}``).
- ``produce_all_{N}`` seconds: one message to every stream, all in flight together, every one acknowledged.
- ``broker_connections_{N}`` (three brokers): established TCP connections from the servers to each other's
  server ports (tidelog: wire ports; JetStream: route ports). Target: the same at every N.
- ``failover_s_{N}`` (three brokers) seconds from the SIGKILL (by PID) of the server leading the most streams to
  every one of its streams taking an acknowledged write again (writers retry each stream every ``RETRY_S``).
  ``failover_growth`` compares ``failover_s`` at the largest N with the smallest (target ratio ≤ 2).

The last line is the summary with the targets (at N = 1,000) that the run measured and the load average before
and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import nats
from nats.js.api import StorageType, StreamConfig

from benchmarks import _procstats as procstats
from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from benchmarks._jetstream import JetStreamCluster, JetStreamServer
from benchmarks._publish_sides import TidelogServer
from tidelog.client import Acks, Admin, Cluster, Codec, Producer
from tidelog.local.cluster import LocalCluster

BENCH = "scale"
PAYLOAD = b"x" * 100
SETTLE_S = 5.0
RETRY_S = 0.1
WRITE_TIMEOUT_S = 2.0
ADMIN_TIMEOUT_S = 60.0  # creating a stream, reading its leader: an R3 JetStream at 1,600 streams took over 2 s
FAILOVER_LIMIT_S = 180.0
WRITE_ALL_S_PER_STREAM = 0.1  # produce_all's bound grows with N (5,000 streams took 90 s on a loaded machine)
WRITERS = 64  # streams written at once during produce_all and failover
TARGET_N = 1000
TARGETS = (
    Target(f"rss_mb_{TARGET_N}", "<=", 1),
    Target(f"fds_{TARGET_N}", "<=", 1),
    Target(f"idle_cpu_{TARGET_N}", "<=", 2),
    Target(f"create_growth_{TARGET_N}", "<=", 2),
    Target("failover_growth", "<=", 2),
)


def stream_name(index: int) -> str:
    return f"s{index:05d}"


@dataclass(slots=True)
class Sample:
    """What one side measured at one N."""

    create_ms: list[float] = field(default_factory=list)
    rss_mb: float = 0.0
    fds: float = 0.0
    idle_cpu: float = 0.0
    produce_all_s: float = 0.0
    connections: int = 0
    failover_s: float | None = None


class Side(Protocol):
    """N streams on one server or cluster, and the processes to charge for them."""

    name: str
    servers: int

    def pids(self) -> list[int]: ...
    async def create(self, stream: str) -> None: ...
    async def write(self, stream: str) -> None: ...
    async def connections(self) -> int: ...
    async def leaders(self, streams: Sequence[str]) -> dict[str, str]: ...
    async def kill(self, server: str) -> float:
        """SIGKILL ``server``; returns ``perf_counter()`` just before the signal."""
        ...


async def measure(side: Side, count: int, args: argparse.Namespace, *, failover: bool) -> Sample:
    """Create ``count`` streams on ``side``, write one message to each, then read its costs at rest."""
    sample = Sample()
    streams = [stream_name(i) for i in range(count)]
    started = time.perf_counter()
    for index, stream in enumerate(streams):
        begin = time.perf_counter()
        await side.create(stream)
        sample.create_ms.append((time.perf_counter() - begin) * 1000)
        if (index + 1) % max(1, count // 10) == 0:
            log(f"{side.name}: {index + 1}/{count} streams ({time.perf_counter() - started:.1f}s)")
    begin = time.perf_counter()
    await write_each(side, streams, limit=max(FAILOVER_LIMIT_S, WRITE_ALL_S_PER_STREAM * count))
    sample.produce_all_s = time.perf_counter() - begin
    await asyncio.sleep(SETTLE_S)
    pids = procstats.descendants(side.pids())
    sample.rss_mb = procstats.rss_mb(pids) / side.servers
    sample.fds = procstats.open_fds(pids) / side.servers
    sample.idle_cpu = await idle_cpu(pids, args.idle_seconds, args.idle_windows) / side.servers
    sample.connections = await side.connections()
    log(
        f"{side.name} N={count}: create {sum(sample.create_ms) / 1000:.1f}s, rss {sample.rss_mb:.0f} MiB, "
        f"fds {sample.fds:.0f}, idle cpu {sample.idle_cpu:.1f}%, produce_all {sample.produce_all_s:.2f}s, "
        f"connections {sample.connections} (per server where more than one)"
    )
    if failover:
        sample.failover_s = await measure_failover(side, streams)
    return sample


async def idle_cpu(pids: Sequence[int], seconds: float, windows: int) -> float:
    """Median CPU of ``pids`` over ``windows`` windows of ``seconds``, % of one core."""
    values = []
    for _ in range(windows):
        before = procstats.cpu_seconds(pids)
        await asyncio.sleep(seconds)
        values.append((procstats.cpu_seconds(pids) - before) / seconds * 100)
    return float(statistics.median(values))


async def write_each(side: Side, streams: Sequence[str], *, limit: float) -> None:
    """One acknowledged write to every stream, ``WRITERS`` at a time, each retried until it succeeds (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    queue = list(reversed(streams))
    failures: Counter[str] = Counter()

    async def writer() -> None:
        while queue:
            stream = queue.pop()
            while True:
                try:
                    await asyncio.wait_for(side.write(stream), WRITE_TIMEOUT_S)
                    break
                except Exception as exc:  # no leader yet, connection refused, timeout: retry
                    failures[type(exc).__name__] += 1
                    if loop.time() > deadline:
                        raise TimeoutError(f"{side.name}: {stream} took no write within {limit:g}s") from exc
                    await asyncio.sleep(RETRY_S)

    await asyncio.gather(*(writer() for _ in range(min(WRITERS, len(streams)))))
    if failures:
        log(f"{side.name}: retried writes after {dict(failures)}")


async def measure_failover(side: Side, streams: Sequence[str]) -> float:
    """Seconds from killing the server that leads the most streams to every one of them taking a write."""
    leaders = await side.leaders(streams)
    victim, led = Counter(leaders.values()).most_common(1)[0]
    affected = [stream for stream, leader in leaders.items() if leader == victim]
    log(f"{side.name}: killing {victim}, leader of {led} of {len(streams)} streams")
    started = await side.kill(victim)
    await write_each(side, affected, limit=FAILOVER_LIMIT_S)
    seconds = time.perf_counter() - started
    log(f"{side.name}: {len(affected)} streams writable again after {seconds:.2f}s")
    return seconds


# ---- tidelog ----


class TidelogSingle:
    """One broker with its embedded NATS and etcd."""

    name = "tidelog"
    servers = 1

    def __init__(self, server: TidelogServer, client: Cluster) -> None:
        self.server = server
        self.client = client
        self.admin = Admin(cluster=client)
        self.producer = Producer(cluster=client, acks=Acks.ALL, compression=Codec.NONE, linger_ms=0, idempotent=False)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path) -> AsyncIterator[Side]:
        async with TidelogServer(data_dir, flush_policy="always", ready_within=120) as server:
            log(f"tidelog pid {server.pid}")
            async with _producing(cls(server, Cluster(server.bootstrap))) as side:
                yield side

    def pids(self) -> list[int]:
        return [self.server.pid] if self.server.pid is not None else []

    async def create(self, stream: str) -> None:
        await self.admin.create_stream(stream, stream)

    async def write(self, stream: str) -> None:
        await (await self.producer.send(stream, PAYLOAD))

    async def connections(self) -> int:
        return 0

    async def leaders(self, streams: Sequence[str]) -> dict[str, str]:
        raise NotImplementedError("one broker has no failover")

    async def kill(self, server: str) -> float:
        raise NotImplementedError("one broker has no failover")


class TidelogReplicated:
    """Three brokers sharing one NATS and one etcd; streams with replication factor 3."""

    name = "tidelog"
    servers = 3

    def __init__(self, cluster: LocalCluster, client: Cluster) -> None:
        self.cluster = cluster
        self.client = client
        self.admin = Admin(cluster=client)
        self.producer = Producer(cluster=client, acks=Acks.ALL, compression=Codec.NONE, linger_ms=0, idempotent=False)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path) -> AsyncIterator[Side]:
        async with LocalCluster(data_dir, 3) as cluster:
            log(f"tidelog cluster: {', '.join(f'{b.id} pid {b.pid}' for b in cluster.brokers)}")
            async with _producing(cls(cluster, Cluster(cluster.bootstrap()))) as side:
                yield side

    def pids(self) -> list[int]:
        shared = [self.cluster.nats.pid, self.cluster.etcd.pid]
        return [pid for pid in [*(b.pid for b in self.cluster.brokers), *shared] if pid is not None]

    async def create(self, stream: str) -> None:
        await self.admin.create_stream(stream, stream, replication_factor=3)

    async def write(self, stream: str) -> None:
        try:
            await (await self.producer.send(stream, PAYLOAD))
        except Exception:
            self.client.forget(stream)  # ask for the partition's leader again next time
            raise

    async def connections(self) -> int:
        pids = [b.pid for b in self.cluster.brokers if b.pid is not None]
        return procstats.connections_between(pids, [b.wire_port for b in self.cluster.brokers])

    async def leaders(self, streams: Sequence[str]) -> dict[str, str]:
        out = {}
        for stream in streams:
            record = await self.cluster.partition_record(stream, 0)
            if record is None or not record.leader:
                raise RuntimeError(f"tidelog {stream} has no leader")
            out[stream] = record.leader
        return out

    async def kill(self, server: str) -> float:
        started = time.perf_counter()
        await self.cluster.kill(server)
        return started


@contextlib.asynccontextmanager
async def _producing(side: TidelogSingle | TidelogReplicated) -> AsyncIterator[Side]:
    """``side`` with its producer started; the producer and the client closed afterwards."""
    await side.producer.start()
    try:
        yield side
    finally:
        await side.producer.close()
        await side.client.close()


# ---- JetStream ----


class JetStreamSide:
    """One nats-server, or a cluster of three with R3 streams."""

    name = "jetstream"

    def __init__(self, nc: Any, servers: int, pid_of: Callable[[], list[int]]) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=WRITE_TIMEOUT_S)
        self.jsm = nc.jsm(timeout=ADMIN_TIMEOUT_S)
        self.servers = servers
        self._pids = pid_of
        self.cluster: JetStreamCluster | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path, servers: int) -> AsyncIterator[Side]:
        if servers == 1:
            async with JetStreamServer(data_dir, sync_always=True) as server:
                nc = await nats.connect(server.url, name="bench-scale")
                try:
                    yield cls(nc, 1, lambda: [server.pid] if server.pid is not None else [])
                finally:
                    await nc.close()
            return
        async with JetStreamCluster(data_dir, servers, sync_always=True, ready_within=60) as cluster:

            def pids() -> list[int]:
                return [node.pid for node in cluster.nodes if node.pid is not None]

            nc = await nats.connect(
                servers=cluster.urls, reconnect_time_wait=0.1, max_reconnect_attempts=-1, name="bench-scale"
            )
            side = cls(nc, servers, pids)
            side.cluster = cluster
            try:
                yield side
            finally:
                await side.nc.close()

    def pids(self) -> list[int]:
        return self._pids()

    async def create(self, stream: str) -> None:
        config = StreamConfig(name=stream, subjects=[stream], storage=StorageType.FILE, num_replicas=self.servers)
        await self.jsm.add_stream(config)

    async def write(self, stream: str) -> None:
        await self.js.publish(stream, PAYLOAD, timeout=WRITE_TIMEOUT_S)

    async def connections(self) -> int:
        if self.cluster is None:
            return 0
        ports = [node.cluster_port for node in self.cluster.nodes]
        return procstats.connections_between(self.pids(), ports)

    async def leaders(self, streams: Sequence[str]) -> dict[str, str]:
        out = {}
        for stream in streams:
            info = await self.jsm.stream_info(stream)
            if info.cluster is None or not info.cluster.leader:
                raise RuntimeError(f"jetstream {stream} has no leader")
            out[stream] = info.cluster.leader
        return out

    async def kill(self, server: str) -> float:
        """Move the client to the other nodes first (so the failover is JetStream's election, not nats-py's
        reconnection), then SIGKILL ``server``."""
        assert self.cluster is not None
        others = [node.url for node in self.cluster.nodes if node.name != server]
        await self.nc.close()
        self.nc = await nats.connect(servers=others, reconnect_time_wait=0.1, name="bench-scale")
        self.js = self.nc.jetstream(timeout=WRITE_TIMEOUT_S)
        self.jsm = self.nc.jsm(timeout=ADMIN_TIMEOUT_S)
        started = time.perf_counter()
        await self.cluster.kill(server)
        return started


# ---- the run ----

Opener = Callable[[Path], contextlib.AbstractAsyncContextManager[Side]]


async def run_case(
    root: Path, label: str, count: int, openers: dict[str, Opener], args: argparse.Namespace, *, failover: bool
) -> dict[str, Sample]:
    out = {}
    for name, opener in openers.items():
        with scratch_dir(f"scale-{label}-{name}-") as data_dir:
            log(f"---- {label} N={count}: {name} ----")
            async with opener(data_dir) as side:
                out[name] = await measure(side, count, args, failover=failover)
    return out


def rows_for(count: int, samples: dict[str, Sample], replicated: bool) -> list[Row]:
    ours, peer = samples["tidelog"], samples["jetstream"]
    tag = "_rf3" if replicated else ""
    first, last = ours.create_ms[:10], ours.create_ms[-10:]
    rows = [
        Row(BENCH, f"create{tag}_s_{count}", sum(ours.create_ms) / 1000, "s", sum(peer.create_ms) / 1000, 2),
        Row(BENCH, f"create_growth{tag}_{count}", median(last), "ms", median(first), 2),
        Row(BENCH, f"rss{tag}_mb_{count}", ours.rss_mb, "MiB", peer.rss_mb),
        Row(BENCH, f"fds{tag}_{count}", ours.fds, "fds", peer.fds, 0),
        Row(BENCH, f"idle_cpu{tag}_{count}", ours.idle_cpu, "% core", peer.idle_cpu, 2),
        Row(BENCH, f"produce_all{tag}_{count}", ours.produce_all_s, "s", peer.produce_all_s, 3),
    ]
    if replicated:
        rows.append(Row(BENCH, f"broker_connections_{count}", ours.connections, "conns", peer.connections, 0))
        if ours.failover_s is not None and peer.failover_s is not None:
            rows.append(Row(BENCH, f"failover_s_{count}", ours.failover_s, "s", peer.failover_s, 2))
    return rows


async def main_async(args: argparse.Namespace) -> None:
    clock = RunClock.now()
    rows: list[Row] = []
    single: dict[str, Opener] = {
        "tidelog": TidelogSingle.open,
        "jetstream": lambda path: JetStreamSide.open(path, 1),
    }
    replicated: dict[str, Opener] = {
        "tidelog": TidelogReplicated.open,
        "jetstream": lambda path: JetStreamSide.open(path, 3),
    }
    with scratch_dir("scale-") as root:
        for count in args.single:
            rows += rows_for(count, await run_case(root, "one", count, single, args, failover=False), False)
        failovers: dict[int, float] = {}
        for count in args.replicated:
            samples = await run_case(root, "rf3", count, replicated, args, failover=True)
            rows += rows_for(count, samples, True)
            if samples["tidelog"].failover_s is not None:
                failovers[count] = samples["tidelog"].failover_s
    if len(failovers) >= 2:
        low, high = min(failovers), max(failovers)
        rows.append(Row(BENCH, "failover_growth", failovers[high], f"s at N={high} vs N={low}", failovers[low], 2))
    measured = {row.metric for row in rows}  # a partial run (--single 5000) judges only what it measured
    targets = [target for target in TARGETS if target.metric in measured]
    report(BENCH, rows, targets, clock, single=args.single, replicated=args.replicated)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small N and short idle windows")
    parser.add_argument("--single", type=int, nargs="*", help="stream counts on one broker")
    parser.add_argument("--replicated", type=int, nargs="*", help="stream counts on three brokers, RF 3")
    parser.add_argument("--idle-seconds", type=float, help="length of one idle-CPU window")
    parser.add_argument("--idle-windows", type=int, default=3, help="idle-CPU windows (their median is reported)")
    args = parser.parse_args(argv)
    if args.single is None:
        args.single = [50, 200] if args.quick else [100, 1000, 5000]
    if args.replicated is None:
        args.replicated = [30, 90] if args.quick else [100, 1000]
    if args.idle_seconds is None:
        args.idle_seconds = 2.0 if args.quick else 10.0
    for count in [*args.single, *args.replicated]:
        if count < 1:
            parser.error(f"stream counts must be at least 1, got {count}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
