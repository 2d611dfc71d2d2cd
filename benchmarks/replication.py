"""Replication benchmark: a 3-broker tidelog cluster against a 3-node NATS JetStream cluster, in the same run.

Run: ``.venv/bin/python -m benchmarks.replication [--quick]``. Both clusters are started here, one after the
other (never at the same time), on free loopback ports of this one machine, each with its data in its own
directories under one scratch directory on the same disk, and stopped by PID afterwards. Each run starts fresh
clusters and alternates which side goes first.

- tidelog: :class:`~tidelog.local.cluster.LocalCluster` — one nats-server, one etcd and three ``tidelog serve``
  processes; streams with replication factor 3; every write acks ``ALL`` with the default flush policy
  ``always`` (each replica fsyncs before it counts). Broker settings: ``TIDELOG_SETTINGS`` below (the defaults,
  written out), overridable with ``--setting key=value``.
- JetStream: :class:`~benchmarks._jetstream.JetStreamCluster` — three ``nats-server -js`` joined by routes, each
  its own store; streams with ``num_replicas=3``, file storage, ``sync_interval: always`` on every node.

Clients are Python on both sides, sharing one uvloop loop here (``--loop asyncio`` for the default one): the
tidelog client and nats-py. Messages are 1 KiB distinct random values, the same list for both sides.

Metrics (``ratio`` = tidelog ÷ JetStream):

- ``produce_1k`` msg/s, every message acknowledged (acks ALL / R3 quorum). tidelog: the batching ``Producer``
  (codec none, default batching, ``max_in_flight`` 8) awaiting every record's future. JetStream:
  ``js.publish_async`` with up to 4000 acks outstanding, every ack checked.
- ``consume_1k`` msg/s, reading back the messages just produced, each value in hand, ``consume_repeats`` times
  per run. tidelog: ``Consumer.fetch_batches()`` decoding every batch's records. JetStream: a pull consumer
  (``AckNone``, R3 like its stream) fed by pipelined 10 000-message pull requests into a callback subscription.
- ``latency_p50``, ``latency_p99`` µs, one 1 KiB publish at a time. tidelog: ``send_and_wait`` (linger 0, acks
  ALL). JetStream: ``js.publish`` awaiting its ack. Lower is better.
- ``failover_s`` seconds, from the SIGKILL of the partition's (stream's) leader to the first acknowledged write
  on its successor. A writer sends one 1 KiB acks-ALL write at a time, each bounded by a short timeout
  (``WRITE_TIMEOUT``) and retried after ``RETRY_BACKOFF`` on any failure; once it is writing steadily the leader
  is SIGKILLed by PID. The clock starts just before the signal; the failover ends at the first ack of a write
  *sent* after the kill (an ack still in flight from the dead leader cannot count). tidelog: the leader from the
  partition's etcd record, killed through ``LocalCluster.kill``; the producer reconnects through its cluster
  metadata (refreshed after each failure). JetStream: the leader from ``stream_info().cluster.leader``, killed
  by PID; the writer's connection is on a follower node (all nodes listed, reconnect wait 0.1 s), so the
  failover is JetStream's leader election, not nats-py's reconnect. Each failover uses a new R3 stream and a
  fresh writer connection; the killed node is restarted and back in the ISR (all replicas current) before the
  next. ``failover_s`` is the case where the killed leader is *not* the controller (JetStream: not the meta
  leader) — with many partitions, nearly every leader.
- ``failover_controller_s`` (informational, no target) seconds, the same when the killed leader is also the
  controller (JetStream: the meta leader): tidelog then needs a new controller first, which waits for the dead
  one's etcd lease (``broker_lease_ttl_ms``) to lapse. tidelog's placement puts every RF 3 stream's preferred
  leader on the broker with the fewest partitions (all equal at RF 3 of 3: always the lowest id), so the
  benchmark steers the next stream's leader with single-replica "ballast" streams; JetStream places stream
  leaders at random, so new streams are tried until one fits. Each run measures ``failovers`` of each case.

- ``produce_1k_tls``, ``consume_1k_tls`` msg/s and ``*_tls_vs_plaintext``: the same produce and one read on
  fresh clusters with TLS on every link, each run (:mod:`benchmarks._replication_tls`).

Each value is the median over all samples of all runs. The last line is the summary with the targets, the
machine's core count and the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import nats
from nats.js.api import StorageType, StreamConfig

from benchmarks._common import Row, RunClock, Target, log, median, report, scratch_dir
from benchmarks._jetstream import JS_PUBLISH_WINDOW, JetStreamCluster, publish_all, publish_one_at_a_time, pull_all
from benchmarks._publish_sides import deadline_for, make_payloads, percentile, produce_all
from benchmarks._replication_tls import TLS_APPROACH, TLS_METRICS, measure_tls, tls_rows
from tidelog.client import Acks, Admin, Cluster, Codec, Consumer, Producer
from tidelog.launch.probes import http_get
from tidelog.local.certificates import make_dev_certificates
from tidelog.local.cluster import LocalCluster
from tidelog.protocol.tls import TlsFiles, client_context

BENCH = "replication"
SIZE = 1024
REPLICAS = 3
TARGETS = (
    Target("produce_1k", ">=", 4),
    Target("latency_p50", "<=", 0.6),
    Target("failover_s", "<=", 1),
)

TIDELOG_SETTINGS: dict[str, str] = {
    "default_flush_policy": "always",  # fsync before an append counts, on every replica
    "broker_lease_ttl_ms": "10000",  # lease expiry is the fallback: a refused wire port fails over at once
    "replica_lag_time_max_ms": "15000",
    "replica_fetch_wait_max_ms": "500",
    "default_ack_timeout_ms": "5000",
    "log_level": "warning",
}

APPROACHES = {
    "tidelog": "LocalCluster: 3 tidelog serve + shared nats-server + etcd; RF 3, acks ALL, flush always; other "
    "settings at their defaults (a leader polls its sockets for 500 µs after a lone acks-ALL write is fsynced: "
    "replica_ack_poll_us); "
    "Producer (codec none, default batching, max_in_flight 8); Consumer.fetch_batches() decoding records; "
    "latency: one send_and_wait at a time (linger 0); failover: SIGKILL the partition leader's broker while one "
    "writer sends acks-ALL writes (0.5 s timeout, retry after 10 ms, metadata refreshed after each failure)",
    "tls": TLS_APPROACH,
    "jetstream": "3 nats-server -js clustered on loopback routes, own store each, sync_interval always; R3 file "
    "stream; js.publish_async (4000 outstanding); pull consumer (AckNone) with pipelined 10k pulls into a "
    "callback; latency: one js.publish at a time; failover: SIGKILL the stream leader's nats-server while one "
    "writer (connected to a follower node) sends js.publish (0.5 s timeout, retry after 10 ms)",
}

WRITE_TIMEOUT = 0.5  # seconds: one failover write's bound, both sides
RETRY_BACKOFF = 0.01  # seconds before retrying a failed failover write
WARM_ACKS = 20  # failover writes acknowledged before the kill: the writer is running steadily
FAILOVER_LIMIT = 120.0  # seconds: a failover slower than this fails the benchmark
RECOVERY_LIMIT = 180.0  # seconds for a restarted node to be back in the ISR
POLL = 0.05  # seconds between state polls
ROLE_ATTEMPTS = 16  # new streams tried to find one led by (or not by) the controller / meta leader


@dataclass(frozen=True, slots=True)
class Plan:
    runs: int
    messages: int  # per produce measurement (also what is consumed)
    consume_repeats: int  # reads of the produced stream per run
    latency_samples: int
    latency_warmup: int
    failovers: int  # per run: this many kills of a leader that is not the controller, and of one that is

    @property
    def latency_count(self) -> int:
        return self.latency_warmup + self.latency_samples


QUICK = Plan(runs=2, messages=20_000, consume_repeats=2, latency_samples=500, latency_warmup=50, failovers=1)
FULL = Plan(runs=3, messages=30_000, consume_repeats=3, latency_samples=2000, latency_warmup=100, failovers=2)


async def poll(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll ``check()`` every ``POLL`` seconds until it is true; a check that raises counts as "not yet"."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = ""
    while True:
        try:
            if await asyncio.wait_for(check(), max(0.05, deadline - loop.time())):
                return
        except Exception as exc:  # not there yet (no leader, connection refused…)
            last = f" (last error: {exc!r})"
        if loop.time() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{last}")
        await asyncio.sleep(POLL)


@dataclass(slots=True)
class FailoverTrial:
    """One leader kill: when it happened and what the writer saw."""

    killed_at: float = 0.0  # perf_counter just before the SIGKILL; 0 until then
    first_ack_any: float | None = None  # first ack received after the kill, of any write
    first_ack_new: float | None = None  # first ack of a write sent after the kill: the failover's end
    acks: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)


async def measure_failover(
    write: Callable[[], Awaitable[object]],
    on_error: Callable[[BaseException], None],
    kill: Callable[[], Awaitable[None]],
    what: str,
) -> FailoverTrial:
    """Run one writer (``write()`` one at a time, ``WRITE_TIMEOUT`` each, retried after ``RETRY_BACKOFF``), kill
    the leader once ``WARM_ACKS`` writes are acknowledged, and return when a write sent after the kill is
    acknowledged (bounded by ``FAILOVER_LIMIT``)."""
    trial = FailoverTrial()
    warm, recovered, stop = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    writer_deadline = loop.time() + FAILOVER_LIMIT + 60

    async def writer() -> None:
        while not stop.is_set() and loop.time() < writer_deadline:
            sent = time.perf_counter()
            try:
                async with asyncio.timeout(WRITE_TIMEOUT):
                    await write()
            except Exception as exc:  # timeouts, refused connections, no leader: retry
                trial.errors += 1
                kind = type(exc).__name__
                trial.error_kinds[kind] = trial.error_kinds.get(kind, 0) + 1
                on_error(exc)
                await asyncio.sleep(RETRY_BACKOFF)
                continue
            acked = time.perf_counter()
            trial.acks += 1
            if trial.acks >= WARM_ACKS:
                warm.set()
            if trial.killed_at and acked > trial.killed_at:
                if trial.first_ack_any is None:
                    trial.first_ack_any = acked
                if sent >= trial.killed_at:
                    trial.first_ack_new = acked
                    recovered.set()
                    return

    task = asyncio.create_task(writer())
    try:
        await asyncio.wait_for(warm.wait(), 60)
        trial.killed_at = time.perf_counter()
        await kill()
        await asyncio.wait_for(recovered.wait(), FAILOVER_LIMIT)
    except TimeoutError:
        raise TimeoutError(f"{what}: no acknowledged write ({trial.acks} acks, {trial.errors} errors)") from None
    finally:
        stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, WRITE_TIMEOUT + 5)
    return trial


class Side(Protocol):
    """One cluster with the measurements the benchmark makes on it."""

    name: str

    async def produce(self, stream: str, payloads: Sequence[bytes]) -> float:
        """msg/s: every payload sent to a new R3 stream and acknowledged."""
        ...

    async def consume(self, stream: str, count: int) -> float:
        """msg/s: all ``count`` messages of ``stream`` (``SIZE`` bytes each) read back."""
        ...

    async def latencies(self, stream: str, payloads: Sequence[bytes], warmup: int) -> list[float]:
        """µs per publish, one at a time (the first ``warmup`` left out)."""
        ...

    async def failover(self, prefix: str, payload: bytes, controller: bool) -> float:
        """Seconds from killing the leader of a new R3 stream (named after ``prefix``) to the first acknowledged
        write on its successor; the leader is the controller (JetStream: meta leader) or not, as ``controller``
        says. The killed node is restarted and back in the ISR before this returns."""
        ...


SideFactory = Callable[..., contextlib.AbstractAsyncContextManager[Side]]  # (data_dir, settings, tls=False)


def _trial_log(side: str, victim: str, trial: FailoverTrial, extra: str = "") -> float:
    assert trial.first_ack_new is not None
    seconds = trial.first_ack_new - trial.killed_at
    any_s = (trial.first_ack_any or trial.first_ack_new) - trial.killed_at
    log(
        f"  {side} failover (killed {victim}{extra}): {seconds:.3f} s to the first ack of a new write "
        f"({any_s:.3f} s to any ack); {trial.errors} failed writes {trial.error_kinds}"
    )
    return seconds


# ---- NATS JetStream ----


class JetStreamSide:
    name = "jetstream"

    def __init__(self, cluster: JetStreamCluster, nc: Any) -> None:
        self.cluster = cluster
        self.nc = nc
        self.js = nc.jetstream(publish_async_max_pending=JS_PUBLISH_WINDOW, timeout=30)
        self._streams = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path, settings: Mapping[str, str], tls: bool = False) -> AsyncIterator[Side]:
        """``settings`` are tidelog's: JetStream's configuration is fixed (R3 streams, ``sync_interval: always``)."""
        files = make_dev_certificates(data_dir / "tls") if tls else None
        server_tls = (files.broker_cert, files.broker_key, files.ca) if files else None
        async with JetStreamCluster(data_dir, REPLICAS, sync_always=True, tls=server_tls) as cluster:
            pids = ", ".join(f"{node.name} pid {node.pid}" for node in cluster.nodes)
            log(f"jetstream cluster up: {pids}")
            nc = await nats.connect(
                servers=cluster.urls,
                name="bench-jetstream",
                pending_size=32 * 1024 * 1024,
                error_cb=_ignore_nats_error,  # its server may be the one a failover kills
                tls=client_context(TlsFiles(ca=files.ca)) if files else None,
            )
            try:
                yield cls(cluster, nc)
            finally:
                await nc.close()

    async def _create(self, stream: str) -> None:
        config = StreamConfig(name=stream, subjects=[stream], storage=StorageType.FILE, num_replicas=REPLICAS)

        async def created() -> bool:
            await self.js.add_stream(config)
            return True

        await poll(created, 30, f"jetstream stream {stream}")  # the meta leader may still be settling

    async def produce(self, stream: str, payloads: Sequence[bytes]) -> float:
        await self._create(stream)
        return await publish_all(self.js, stream, payloads, deadline_for(len(payloads)))

    async def consume(self, stream: str, count: int) -> float:
        return await pull_all(self.nc, self.js, stream, count, SIZE, deadline_for(count))

    async def latencies(self, stream: str, payloads: Sequence[bytes], warmup: int) -> list[float]:
        await self._create(stream)
        return await publish_one_at_a_time(self.js, stream, payloads, warmup)

    async def _leader(self, stream: str) -> str:
        info = await self.js.stream_info(stream)
        if info.cluster is None or not info.cluster.leader:
            raise RuntimeError(f"jetstream {stream} has no leader")
        return str(info.cluster.leader)

    async def _fully_replicated(self, stream: str) -> bool:
        info = await self.js.stream_info(stream)
        cluster = info.cluster
        if cluster is None or not cluster.leader:
            return False
        replicas = cluster.replicas or []
        return len(replicas) == REPLICAS - 1 and all(peer.current and not peer.offline for peer in replicas)

    async def _meta_leader(self) -> str:
        """The JetStream meta leader's server name (``/jsz`` of a running node)."""
        node = next(node for node in self.cluster.nodes if node.running)
        status, body = await http_get(f"{node.monitor_url}/jsz")
        leader = json.loads(body).get("meta_cluster", {}).get("leader") if status == 200 else None
        if not leader:
            raise RuntimeError(f"no JetStream meta leader known to {node.name}")
        return str(leader)

    async def _stream_led(self, prefix: str, by_meta_leader: bool) -> tuple[str, str, str]:
        """A new, fully replicated R3 stream whose leader is (or is not) the meta leader; stream leaders land at
        random, so new streams are created until one fits (bounded)."""
        for _ in range(ROLE_ATTEMPTS):
            self._streams += 1
            stream = f"{prefix}_{self._streams}"
            await self._create(stream)
            replicated = functools.partial(self._fully_replicated, stream)
            await poll(replicated, 60, f"jetstream {stream} fully replicated")
            leader, meta = await self._leader(stream), await self._meta_leader()
            if (leader == meta) == by_meta_leader:
                return stream, leader, meta
        raise RuntimeError(f"no jetstream stream led {'' if by_meta_leader else 'not '}by the meta leader")

    async def failover(self, prefix: str, payload: bytes, controller: bool) -> float:
        stream, leader, meta = await self._stream_led(prefix, controller)
        followers = [node.url for node in self.cluster.nodes if node.name != leader]
        others = [node.url for node in self.cluster.nodes if node.name == leader]
        nc = await nats.connect(
            servers=followers + others,
            dont_randomize=True,
            reconnect_time_wait=0.1,
            max_reconnect_attempts=1000,
            name="bench-jetstream-failover",
            error_cb=_ignore_nats_error,
        )
        try:
            js = nc.jetstream(timeout=WRITE_TIMEOUT)

            async def write() -> object:
                return await js.publish(stream, payload, timeout=WRITE_TIMEOUT)

            kill = functools.partial(self.cluster.kill, leader)
            trial = await measure_failover(write, lambda exc: None, kill, f"jetstream failover of {leader}")
            writer_on = getattr(nc.connected_url, "netloc", "?")
        finally:
            await nc.close()
        role = ", the meta leader" if meta == leader else f"; meta leader {meta}"
        seconds = _trial_log(self.name, leader, trial, f"{role}; writer on {writer_on}")
        await self.cluster.restart(leader)
        await poll(lambda: self._fully_replicated(stream), RECOVERY_LIMIT, f"jetstream {leader} back in {stream}")
        return seconds


async def _ignore_nats_error(exc: Exception) -> None:
    """nats-py's error callback: the failover writer's lost connection is expected (the default one prints it)."""


# ---- tidelog ----


class TidelogSide:
    name = "tidelog"

    def __init__(self, cluster: LocalCluster, client: Cluster) -> None:
        self.cluster = cluster
        self.client = client
        self.admin = Admin(cluster=client)
        self._streams = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, data_dir: Path, settings: Mapping[str, str], tls: bool = False) -> AsyncIterator[Side]:
        async with LocalCluster(data_dir, REPLICAS, settings=settings, tls=tls) as cluster:
            pids = ", ".join(f"{b.id} pid {b.pid}" for b in cluster.brokers)
            log(f"tidelog cluster up: {pids}; controller {await cluster.controller_id()}")
            client = Cluster(cluster.bootstrap(), ssl=cluster.client_ssl())
            try:
                yield cls(cluster, client)
            finally:
                await client.close()

    async def _full_isr(self, stream: str) -> bool:
        record = await self.cluster.partition_record(stream, 0)
        return record is not None and bool(record.leader) and len(record.isr) == REPLICAS

    async def _create(self, stream: str) -> None:
        await self.admin.create_stream(stream, stream, replication_factor=REPLICAS)
        await poll(lambda: self._full_isr(stream), 60, f"tidelog {stream} with a full ISR")

    def _producer(self, **settings: Any) -> Producer:
        settings.setdefault("idempotent", False)  # like js.publish without a Nats-Msg-Id: no deduplication either side
        return Producer(cluster=self.client, acks=Acks.ALL, compression=Codec.NONE, **settings)

    async def produce(self, stream: str, payloads: Sequence[bytes]) -> float:
        await self._create(stream)
        return await produce_all(self._producer(), stream, payloads)

    async def consume(self, stream: str, count: int) -> float:
        got = received_bytes = 0
        start = time.perf_counter()
        async with Consumer(stream=stream, cluster=self.client, start="earliest", stop_at_end=True) as consumer:
            async with asyncio.timeout(deadline_for(count)):
                async for batch in consumer.fetch_batches():
                    records = batch.records()
                    got += len(records)
                    received_bytes += sum(len(record.value or b"") for record in records)
        elapsed = time.perf_counter() - start
        if got != count or received_bytes != count * SIZE:
            raise RuntimeError(f"tidelog {stream}: read {got} records, {received_bytes} bytes; expected {count}")
        return count / elapsed

    async def latencies(self, stream: str, payloads: Sequence[bytes], warmup: int) -> list[float]:
        await self._create(stream)
        producer = self._producer(linger_ms=0)
        await producer.start()
        out: list[float] = []
        try:
            for i, payload in enumerate(payloads):
                start = time.perf_counter_ns()
                await producer.send_and_wait(stream, payload)
                if i >= warmup:
                    out.append((time.perf_counter_ns() - start) / 1000)
        finally:
            await producer.close()
        return out

    async def _stream_led(self, prefix: str, by_controller: bool) -> tuple[str, str, str]:
        """A new RF 3 stream with a full ISR whose leader is (or is not) the controller.

        Placement starts each new stream's replica list (its preferred leader first) at the broker holding the
        fewest partitions, the lowest id on a tie; RF 3 streams on 3 brokers add one partition to every broker,
        so they would all be led by the same broker. A single-replica "ballast" stream adds one partition to
        that broker alone and moves the next stream's leader on to the next broker (bounded attempts)."""
        controller = await self.cluster.controller_id()
        for _ in range(ROLE_ATTEMPTS):
            self._streams += 1
            stream = f"{prefix}_{self._streams}"
            await self._create(stream)
            record = await self.cluster.partition_record(stream, 0)
            assert record is not None
            if (record.leader == controller) == by_controller:
                return stream, record.leader, str(controller)
            await self.admin.create_stream(f"ballast_{self._streams}", replication_factor=1)
        raise RuntimeError(f"no tidelog stream led {'' if by_controller else 'not '}by the controller {controller}")

    async def failover(self, prefix: str, payload: bytes, controller: bool) -> float:
        stream, leader, controller_id = await self._stream_led(prefix, controller)
        client = Cluster(self.cluster.bootstrap())
        producer = Producer(cluster=client, acks=Acks.ALL, compression=Codec.NONE, linger_ms=0, ack_timeout_ms=500)
        await producer.start()
        try:

            async def write() -> object:
                return await producer.send_and_wait(stream, payload)

            def on_error(exc: BaseException) -> None:
                client.forget(stream)  # the next write asks for the partition's leader again

            kill = functools.partial(self.cluster.kill, leader)
            trial = await measure_failover(write, on_error, kill, f"tidelog failover of {leader}")
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.close(), 10)
            await client.close()
        after = await self.cluster.partition_record(stream, 0)
        moved = f" → {after.leader} epoch {after.leader_epoch}" if after is not None else ""
        role = ", the controller" if controller_id == leader else f"; controller {controller_id}"
        seconds = _trial_log(self.name, leader, trial, f"{moved}{role}")
        await self.cluster.restart(leader)
        await poll(lambda: self._full_isr(stream), RECOVERY_LIMIT, f"tidelog {leader} back in {stream}'s ISR")
        return seconds


# ---- the run ----

SIDES: dict[str, SideFactory] = {"jetstream": JetStreamSide.open, "tidelog": TidelogSide.open}

Samples = dict[tuple[str, str], list[float]]


async def measure_side(side: Side, plan: Plan, payloads: Sequence[bytes], samples: Samples) -> None:
    rate = await side.produce("produce_1k", payloads[: plan.messages])
    samples[side.name, "produce_1k"].append(rate)
    log(f"  {side.name} produce_1k: {rate:,.0f} msg/s ({plan.messages} messages)")
    for _ in range(plan.consume_repeats):
        rate = await side.consume("produce_1k", plan.messages)
        samples[side.name, "consume_1k"].append(rate)
        log(f"  {side.name} consume_1k: {rate:,.0f} msg/s")
    lat = await side.latencies("latency_1k", payloads[: plan.latency_count], plan.latency_warmup)
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    samples[side.name, "latency_p50"].append(p50)
    samples[side.name, "latency_p99"].append(p99)
    log(f"  {side.name} latency: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs")
    for _ in range(plan.failovers):
        for controller, metric in ((False, "failover_s"), (True, "failover_controller_s")):
            samples[side.name, metric].append(await side.failover("failover", payloads[0], controller))


async def run(plan: Plan, sides: Sequence[str], root: Path, settings: Mapping[str, str]) -> Samples:
    samples: Samples = defaultdict(list)
    payloads = make_payloads(SIZE, max(plan.messages, plan.latency_count))
    for run_no in range(plan.runs):
        # Alternate which side goes first, so drift on a shared machine does not always favour the same one.
        order = list(sides) if run_no % 2 == 0 else list(reversed(sides))
        for name in order:
            log(f"run {run_no + 1}/{plan.runs}: {name} (load average {os.getloadavg()[0]:.2f})")
            async with SIDES[name](root / f"run{run_no}-{name}", settings) as side:
                await measure_side(side, plan, payloads, samples)
        for name in order:  # the TLS rows (benchmarks._replication_tls)
            log(f"run {run_no + 1}/{plan.runs}: {name} with TLS")
            async with SIDES[name](root / f"run{run_no}-{name}-tls", settings, tls=True) as side:
                await measure_tls(side, payloads[: plan.messages], samples)
    return samples


METRICS: tuple[tuple[str, str, int], ...] = (
    ("produce_1k", "msg/s", 1),
    ("consume_1k", "msg/s", 1),
    ("latency_p50", "µs", 1),
    ("latency_p99", "µs", 1),
    ("failover_s", "s", 3),
    ("failover_controller_s", "s", 3),
    *TLS_METRICS,
)


def rows_from(samples: Samples, sides: Sequence[str]) -> list[Row]:
    rows: list[Row] = []
    for metric, unit, digits in METRICS:
        ours, theirs = samples.get(("tidelog", metric)), samples.get(("jetstream", metric))
        if ours:
            rows.append(Row(BENCH, metric, median(ours), unit, median(theirs) if theirs else None, digits))
        elif theirs and "tidelog" not in sides:  # peer-only run (development): report the peer as the value
            rows.append(Row(BENCH, metric, median(theirs), unit, digits=digits))
    return rows + tls_rows(BENCH, samples)


def run_loop(kind: str, main: Coroutine[Any, Any, Samples]) -> Samples:
    if kind == "uvloop":
        import uvloop

        result: Samples = uvloop.run(main)
        return result
    return asyncio.run(main)


def parse_settings(pairs: Sequence[str]) -> dict[str, str]:
    settings = dict(TIDELOG_SETTINGS)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {pair!r}")
        settings[key.strip()] = value.strip()
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replication", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--runs", type=int, help="runs (fresh clusters each); medians are taken over them")
    parser.add_argument("--messages", type=int, help="messages per produce measurement")
    parser.add_argument("--failovers", type=int, help="leader kills per run (0: none)")
    parser.add_argument(
        "--setting", action="append", default=[], metavar="KEY=VALUE", help="tidelog broker setting (repeatable)"
    )
    parser.add_argument(
        "--loop", choices=["uvloop", "asyncio"], default="uvloop", help="event loop of the benchmark's clients"
    )
    parser.add_argument("--sides", default="jetstream,tidelog", help="comma-separated sides (development)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    plan = Plan(
        runs=args.runs or base.runs,
        messages=args.messages or base.messages,
        consume_repeats=base.consume_repeats,
        latency_samples=base.latency_samples,
        latency_warmup=base.latency_warmup,
        failovers=base.failovers if args.failovers is None else args.failovers,
    )
    try:
        settings = parse_settings(args.setting)
    except ValueError as exc:
        parser.error(str(exc))
    sides = [name.strip() for name in args.sides.split(",") if name.strip()]
    if unknown := set(sides) - set(SIDES):
        parser.error(f"unknown sides: {', '.join(sorted(unknown))}")
    log(f"plan: {plan}, sides: {sides}, tidelog settings: {settings}, loop: {args.loop}")
    clock = RunClock.now()
    with scratch_dir("tidelog-bench-replication-") as root:
        samples = run_loop(args.loop, run(plan, sides, root, settings))
    rows = rows_from(samples, sides)
    report(
        BENCH,
        rows,
        TARGETS,
        clock,
        runs=plan.runs,
        messages=plan.messages,
        latency_samples=plan.latency_samples,
        failover_samples={name: len(samples.get((name, "failover_s"), [])) for name in sides},
        failover_controller_samples={name: len(samples.get((name, "failover_controller_s"), [])) for name in sides},
        replicas=REPLICAS,
        tidelog_settings=settings,
        approaches=APPROACHES,
        machine=f"{os.cpu_count()} cores, both clusters and the clients on this one machine, one after the other",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
