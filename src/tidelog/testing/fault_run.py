"""How a fault scenario runs (:mod:`tidelog.testing.faults` holds the scenarios): a real 3-broker cluster under an
acks-ALL load, faults injected in rounds, then a history check; the outcome is a :class:`FaultReport`.

Every scenario runs the same way, inside a :class:`FaultRun`:

1. start a :class:`~tidelog.local.cluster.LocalCluster` with short timings (``SETTINGS``), create a stream
   with replication factor 3 (so ``min_isr`` is 2) and wait for its full ISR;
2. run a :class:`~tidelog.testing.workload.ProduceLoad` (acks ALL, flush ``always``, the broker default) and a
   :class:`~tidelog.testing.workload.TailConsumer`, both recording into one
   :class:`~tidelog.testing.history.History`;
3. inject the scenario's fault ``rounds`` times, each time waiting (bounded) for what the cluster must do about
   it — a new leader, an ISR shrink, a rejoin — and timing it;
4. settle: heal the network, restart killed brokers, resume paused ones, heal cut ones, wait for every
   partition's ISR to be full and its HW to reach its log end; read everything committed once more; stop the
   brokers gracefully (followers first, so each checkpoints the final HW); read every replica at rest; run
   :meth:`History.check`.

A report separates **violations** (the history checker's: a safety guarantee broken) from **failures** (an
expectation about liveness or fencing not met in time: no new leader, no rejoin, a deposed leader that
acknowledged a write). ``ok`` needs neither. On anything wrong the report carries excerpts of the brokers' logs
(``<root>/bI/serve.log``), which stay on disk for a closer look.

How long the load runs and how often the fault comes is a :class:`FaultProfile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol.errors import InvalidArgumentError, TidelogError
from tidelog.testing.clock_skew import SkewedClock, skew_env
from tidelog.testing.etcd_cluster import EtcdCluster
from tidelog.testing.history import CheckReport, History, read_cluster_replica
from tidelog.testing.lossy_disk import LossyDisk
from tidelog.testing.netlab import NetLab
from tidelog.testing.workload import DirectOutcome, ProduceLoad, TailConsumer, produce_direct, read_all

STREAM = "faults"
SETTINGS: Mapping[str, str] = {
    "broker_lease_ttl_ms": "2000",  # a killed or paused broker loses its registration within ~2 s
    "replica_lag_time_max_ms": "2500",
    "leader_balance_interval_ms": "3000",  # leadership goes back to the preferred replica during the run
    "shutdown_timeout_ms": "5000",
}
ELECT_WITHIN = 20.0  # lease expiry + controller reaction, with slack for a loaded 2-core machine
REJOIN_WITHIN = 30.0  # restart (Python start-up) + recovery + catch-up + ISR change
SETTLE_WITHIN = 45.0
READ_WITHIN = 30.0
QUIET = 1.0  # two follower long polls: followers learn the final HW before they stop


@dataclass(frozen=True, slots=True)
class FaultProfile:
    """How long the load runs and how often the fault comes: :meth:`short` for CI, :meth:`long` for soak runs."""

    warmup: float  # seconds of load before the first fault
    hold: float  # seconds of load after each step of a round (fault, recovery)
    rounds: int
    partitions: int = 1
    window: int = 32  # records in flight at most
    rate: float | None = 2000.0  # records per second at most (the brokers, not the load, should be the test)

    @classmethod
    def short(cls) -> FaultProfile:
        return cls(warmup=1.0, hold=1.5, rounds=1)

    @classmethod
    def long(cls) -> FaultProfile:
        return cls(warmup=5.0, hold=10.0, rounds=5, partitions=3)


@dataclass
class FaultReport:
    """What one scenario run found; ``str()`` is the summary to print or to fail a test with."""

    scenario: str
    root: Path
    rounds: int = 0
    acked: int = 0
    failed: int = 0
    indeterminate: int = 0
    consumed: int = 0
    producers: int = 0
    consumers: int = 0
    seconds: float = 0.0
    timings: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    check: CheckReport | None = None
    excerpts: dict[str, list[str]] = field(default_factory=dict)

    @property
    def violations(self) -> tuple[str, ...]:
        return () if self.check is None else tuple(str(v) for v in self.check.violations)

    @property
    def ok(self) -> bool:
        return self.check is not None and self.check.ok and not self.failures

    @property
    def failover_s(self) -> list[float]:
        """Seconds from each fault on a leader to the first acknowledged write sent after it."""
        return self.timings.get("failover_s", [])

    def __str__(self) -> str:
        head = "OK" if self.ok else "FAILED"
        lines = [
            f"{self.scenario}: {head} in {self.seconds:.1f}s, {self.rounds} round(s); acked {self.acked}, "
            f"failed {self.failed}, indeterminate {self.indeterminate}, consumed {self.consumed}; "
            f"{self.producers} producer(s), {self.consumers} consumer(s)"
        ]
        lines += [f"  {k}: " + ", ".join(f"{v:.2f}" for v in vs) for k, vs in sorted(self.timings.items())]
        lines += [f"  FAILURE: {f}" for f in self.failures]
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        lines += [f"  note: {n}" for n in self.notes]
        if self.check is None:
            lines.append("  the history was not checked")
        elif self.check.notes:
            lines += [f"  history note: {n}" for n in self.check.notes]
        for broker, excerpt in sorted(self.excerpts.items()):
            lines.append(f"  --- {self.root / broker / 'serve.log'} (excerpt)")
            lines += [f"    {line}" for line in excerpt]
        lines.append(f"  cluster root: {self.root}")
        return "\n".join(lines)


class FaultRun:
    """One scenario's cluster, workloads, history and report (see the module docstring).

    ``async with FaultRun(...) as run:`` starts everything; the scenario injects faults and calls
    :meth:`expect`; leaving the block settles, verifies and fills ``run.report`` (also on an error in the
    scenario, which then propagates after the report is made)."""

    def __init__(
        self,
        root: Path,
        scenario: str,
        profile: FaultProfile,
        *,
        settings: Mapping[str, str] = SETTINGS,
        proxied: bool = False,
        network: bool = False,
        history: History | None = None,
        etcd_members: int = 1,
        lossy_disks: bool = False,
        skewed_clocks: bool = False,
        spare_brokers: int = 0,
    ) -> None:
        """``network``: every process on a host of its own (:class:`~tidelog.testing.netlab.NetLab`, in
        :attr:`lab`), so the scenario can partition the network between brokers, etcd and NATS. ``history``: a
        ``History`` (subclass) to record into instead of a new one. ``etcd_members`` 3: the brokers use a
        three-member :class:`~tidelog.testing.etcd_cluster.EtcdCluster` (in :attr:`etcd`, members on hosts
        ``etcd``, ``etcd1``, ``etcd2`` with ``network``) instead of one embedded etcd. ``lossy_disks``: each
        broker's data directory is a :class:`~tidelog.testing.lossy_disk.LossyDisk` (in :attr:`disks`), whose
        power can be cut and whose I/O can fail. ``skewed_clocks``: each broker's wall clock can be moved
        (:class:`~tidelog.testing.clock_skew.SkewedClock`, in :attr:`clocks`). ``spare_brokers``: brokers ``b3``…
        made ready (host, disk, clock) but not started, for membership faults to add
        (:mod:`~tidelog.testing.membership_faults`); :attr:`retired` names the brokers not meant to run."""
        if etcd_members not in (1, 3):
            raise ValueError(f"etcd_members is 1 (embedded) or 3 (a cluster), not {etcd_members}")
        self.profile = profile
        etcd_hosts = ["etcd", *(f"etcd{index}" for index in range(1, etcd_members))]
        names = ["nats", *etcd_hosts, *(f"b{index}" for index in range(3 + spare_brokers))]
        self.lab = NetLab(names) if network else None
        placements = self.lab.hosts if self.lab is not None else None
        self.etcd: EtcdCluster | None = None
        if etcd_members > 1:
            hosts = [self.lab.host(name) for name in etcd_hosts] if self.lab is not None else None
            self.etcd = EtcdCluster(Path(root) / "etcd-cluster", etcd_members, hosts=hosts)
        self.cluster = LocalCluster(
            Path(root),
            3 + spare_brokers,
            settings=settings,
            proxied=proxied,
            placements=placements,
            etcd_endpoints=self.etcd.endpoints if self.etcd is not None else None,
        )
        self.disks: dict[str, LossyDisk] = {}
        if lossy_disks:
            for handle in self.cluster.brokers:
                disk = LossyDisk(handle.data_dir.parent / "disk", handle.data_dir, name=f"lossy-fs {handle.id}")
                self.disks[handle.id] = disk
        self.clocks: dict[str, SkewedClock] = {}
        if skewed_clocks:
            for handle in self.cluster.brokers:
                env = handle.process.env if handle.process.env is not None else dict(os.environ)
                env.update(skew_env(handle.data_dir.parent, env.get("PYTHONPATH")))
                handle.process.env = env
                self.clocks[handle.id] = SkewedClock(handle.data_dir.parent)
        self.retired = {handle.id for handle in self.cluster.brokers[3:]}  # not started, or decommissioned
        self.background: list[asyncio.Task[None]] = []  # faults' work that outlives them (a decommission's drain)
        self.history = history if history is not None else History()
        self.report = FaultReport(scenario, Path(root))
        self.load = ProduceLoad(self.cluster.bootstrap, STREAM, self.history, window=profile.window, rate=profile.rate)
        self.tail = TailConsumer(self.cluster.bootstrap, STREAM, self.history)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = 0.0

    # ---- lifecycle ----

    async def __aenter__(self) -> FaultRun:
        self._started = time.monotonic()
        if self.lab is not None:
            await self.lab.start()
        try:
            if self.etcd is not None:
                await self.etcd.start()
            for disk in self.disks.values():
                await disk.start()
            spares = [handle for handle in self.cluster.brokers if handle.id in self.retired]
            self.cluster.brokers[:] = [handle for handle in self.cluster.brokers if handle.id not in self.retired]
            try:
                await self.cluster.start()
            finally:
                self.cluster.brokers.extend(spares)
        except BaseException:
            await self._stop_dependencies()
            raise
        try:
            await self._create_stream()
            if not await self.expect(self._isr_full, SETTLE_WITHIN, "the new stream's ISR to be full"):
                raise RuntimeError(f"the stream never had a full ISR: {self.report}")
            self._tasks = [
                asyncio.create_task(self.load.run(self._stop), name="fault-load"),
                asyncio.create_task(self.tail.run(self._stop), name="fault-tail"),
            ]
        except BaseException:
            await self.cluster.stop()
            await self._stop_dependencies()
            raise
        return self

    async def _create_stream(self) -> None:
        """Create the stream, again while the controller has not yet seen every broker alive: each is registered
        when the cluster has started, but the controller, elected moments before, may not have read them yet
        (slow starts on lossy disks showed it: "replicationFactor 3 needs 3 brokers but 1 is alive")."""
        deadline = time.monotonic() + SETTLE_WITHIN
        while True:
            try:
                async with Admin(self.cluster.bootstrap()) as admin:
                    await admin.create_stream(STREAM, partitions=self.profile.partitions, replication_factor=3)
                return
            except InvalidArgumentError as exc:
                if "alive" not in str(exc) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _stop_dependencies(self) -> None:
        """Unmount the lossy disks, stop the etcd cluster (if any) and the network lab; after the brokers."""
        for disk in self.disks.values():
            await disk.stop()
        if self.etcd is not None:
            await self.etcd.stop()
        if self.lab is not None:
            await self.lab.stop()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is not None:
                self.report.failures.append(f"the scenario raised {exc!r}")
            await self._stop_workloads()
            await self._finish_background()
            await self._settle_and_verify()
        finally:
            await self.cluster.stop()
            await self._stop_dependencies()
            self.report.seconds = time.monotonic() - self._started
            if not self.report.ok:
                self.report.excerpts = log_excerpts(self.cluster)

    async def _stop_workloads(self) -> None:
        self._stop.set()
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                self.report.failures.append(f"a workload crashed: {result!r}")
        stats = self.load.stats
        self.report.acked, self.report.failed, self.report.indeterminate = (
            stats.acked,
            stats.failed,
            stats.indeterminate,
        )
        self.report.producers = stats.producers
        self.report.consumed, self.report.consumers = self.tail.stats.consumed, self.tail.stats.consumers
        if stats.errors:
            self.report.notes.append("producer outcomes: " + format_counts(stats.errors))
        if self.tail.stats.errors:
            self.report.notes.append("consumer restarts after: " + format_counts(self.tail.stats.errors))

    async def _finish_background(self) -> None:
        """Let the faults' background work end (bounded), then cancel what is left."""
        if not self.background:
            return
        _, late = await asyncio.wait(self.background, timeout=SETTLE_WITHIN)
        for task in late:
            task.cancel()
            self.report.notes.append(f"{task.get_name()} had not finished by the settle: cancelled")
        await asyncio.gather(*self.background, return_exceptions=True)

    async def _settle_and_verify(self) -> None:
        """Bring every broker back, wait for full ISRs, read, stop gracefully, read replicas, check."""
        cluster = self.cluster
        if self.lab is not None:
            await self.lab.heal()
        if self.etcd is not None:
            await self.etcd.heal()
        if not cluster.nats.running:
            await cluster.nats.start()
        for disk in self.disks.values():
            await disk.heal()
        for clock in self.clocks.values():
            clock.jump(0)
        for handle in cluster.brokers:
            if handle.proxy is not None:
                await cluster.heal(handle.id)
            if handle.paused:
                await cluster.resume(handle.id)
        await asyncio.gather(
            *(cluster.restart(b.id) for b in cluster.brokers if not b.running and b.id not in self.retired)
        )
        settled = await self.expect(self._isr_full_confirming, SETTLE_WITHIN, "every ISR to be full at the end")
        if settled:
            await self.expect(self._caught_up, SETTLE_WITHIN, "every HW to reach its log end at the end")
        await asyncio.sleep(QUIET)
        records = {p: await self.partition_record(p) for p in range(self.profile.partitions)}
        try:
            final = await read_all(cluster.bootstrap, STREAM, READ_WITHIN)
        except Exception as exc:
            self.report.failures.append(f"the final read failed: {exc!r}")
        else:
            for partition, found in final.items():
                self.history.final_read(STREAM, partition, found)
        leaders = {r.leader for r in records.values() if r is not None}
        for handle in sorted(cluster.brokers, key=lambda b: b.id in leaders):  # followers first
            code = await cluster.stop_broker(handle.id)
            if code not in (0, None):
                self.report.failures.append(f"broker {handle.id} exited with status {code} on SIGTERM")
        for partition, record in records.items():
            isr = set(record.isr) if record is not None else set()
            for handle in cluster.brokers:
                snapshot = await read_cluster_replica(cluster, handle.id, STREAM, partition)
                if snapshot is not None:
                    self.history.replica_log(
                        handle.id,
                        STREAM,
                        partition,
                        snapshot.records,
                        snapshot.high_watermark,
                        in_isr=handle.id in isr,
                    )
        self.report.check = self.history.check()

    # ---- helpers for scenarios ----

    async def hold(self, seconds: float | None = None) -> None:
        """Let the load run (``profile.hold`` seconds by default)."""
        await asyncio.sleep(self.profile.hold if seconds is None else seconds)

    async def partition_record(self, partition: int = 0) -> PartitionRecord | None:
        return await self.cluster.partition_record(STREAM, partition)

    async def leader(self, partition: int = 0) -> str:
        record = await self.partition_record(partition)
        if record is None or not record.leader:
            raise RuntimeError(f"{STREAM}/{partition} has no leader")
        return record.leader

    async def follower(self, partition: int = 0) -> str:
        """A follower of the partition, not the controller when there is a choice (so that a fault on it does not
        also move the controller)."""
        record = await self.partition_record(partition)
        if record is None or not record.leader:
            raise RuntimeError(f"{STREAM}/{partition} has no leader")
        controller = await self.cluster.controller_id()
        followers = [b for b in record.replicas if b != record.leader]
        return next((b for b in followers if b != controller), followers[0])

    async def expect(
        self, predicate: Callable[[], bool | Awaitable[bool]], timeout: float, what: str, *, timing: str = ""
    ) -> bool:
        """Wait (bounded) for ``predicate``; on time out record a failure. ``timing`` names the report entry
        that gets the seconds it took."""
        started = time.monotonic()
        try:
            await self.cluster.wait_until(predicate, timeout, what)
        except TimeoutError as exc:
            self.report.failures.append(str(exc))
            return False
        if timing:
            self.time(timing, time.monotonic() - started)
        return True

    def time(self, name: str, seconds: float) -> None:
        self.report.timings.setdefault(name, []).append(seconds)

    async def expect_failover(self, fault_at: float, timing: str = "failover_s") -> None:
        """Wait for the first acknowledged write sent after ``fault_at`` (``time.monotonic``); time it."""

        def acked_after() -> bool:
            return self.load.stats.first_ack_sent_after(fault_at) is not None

        if await self.expect(acked_after, ELECT_WITHIN + 10, "an acknowledged write after the fault"):
            first = self.load.stats.first_ack_sent_after(fault_at)
            assert first is not None
            self.time(timing, first - fault_at)

    async def depose_leader(self, fault: Callable[[str], Awaitable[None]]) -> str:
        """Apply ``fault`` (kill, pause) to partition 0's leader, then wait for another leader and for the first
        write acknowledged after the fault, and hold; returns the deposed leader's id."""
        victim = await self.leader()
        fault_at = time.monotonic()
        await fault(victim)
        await self.expect(self.leader_is_not(victim), ELECT_WITHIN, "a new leader", timing="leader_elected_s")
        await self.expect_failover(fault_at)
        await self.hold()
        return victim

    def write_directly(
        self, broker_id: str, name: str, count: int, *, stop: asyncio.Event | None = None, until_refused: bool = False
    ) -> asyncio.Task[list[DirectOutcome]]:
        """A client writing partition 0 straight to ``broker_id``'s wire listener, bypassing metadata and any
        proxy (as a client with a stale view, or on the broker's side of a cut, would), into the run's history:
        up to ``count`` acks-ALL records, 5 s each at most (see :func:`~tidelog.testing.workload.produce_direct`)."""
        address = self.cluster.broker(broker_id).direct_wire_address
        write = produce_direct(
            address,
            STREAM,
            0,
            self.history,
            name=name,
            count=count,
            timeout=5.0,
            stop=stop,
            until_refused=until_refused,
        )
        return asyncio.create_task(write)

    def in_isr(self, broker_id: str, partition: int = 0) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            record = await self.partition_record(partition)
            return record is not None and broker_id in record.isr

        return check

    def not_in_isr(self, broker_id: str, partition: int = 0) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            record = await self.partition_record(partition)
            return record is not None and broker_id not in record.isr

        return check

    def leader_is_not(self, broker_id: str, partition: int = 0) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            record = await self.partition_record(partition)
            return record is not None and bool(record.leader) and record.leader != broker_id

        return check

    async def _isr_full(self) -> bool:
        for partition in range(self.profile.partitions):
            record = await self.partition_record(partition)
            if record is None or not record.leader or set(record.isr) != set(record.replicas):
                return False
        return True

    async def _isr_full_confirming(self) -> bool:
        """:meth:`_isr_full`, acting as the operator of ``docs/durability.md`` ("Fail to safety") meanwhile: a
        partition whose leader suspended appends (a replica holds offsets it lacks: a power cut or a failed
        write took its unsynced tail) gets its head confirmed with ``reset-head``, noted in the report. What
        that gives up was never acknowledged; if it was, the history check says so."""
        for partition in range(self.profile.partitions):
            record = await self.partition_record(partition)
            if record is None or not record.suspended or not record.leader:
                continue
            try:
                async with Admin(self.cluster.bootstrap()) as admin:
                    confirmed = await admin.reset_head(STREAM, partition)
            except TidelogError as exc:
                self.report.notes.append(f"reset-head {STREAM}/{partition} failed, retrying: {exc}")
                continue
            self.report.notes.append(
                f"operator: confirmed the head of {STREAM}/{partition} at {confirmed.head} (suspended: "
                f"{record.suspended[:160]})"
            )
        return await self._isr_full()

    async def _caught_up(self) -> bool:
        async with Admin(self.cluster.bootstrap()) as admin:
            info = await admin.describe_stream(STREAM)
        return all(p.leader is not None and p.high_watermark == p.log_end for p in info.partitions)


# ---- logs ----

_INTERESTING = re.compile(r"WARNING|ERROR|Traceback|truncat|epoch|ISR|leader", re.IGNORECASE)


def log_excerpts(cluster: LocalCluster, limit: int = 40) -> dict[str, list[str]]:
    """The last ``limit`` lines of each broker's log that speak of leaders, epochs, the ISR, truncation or
    errors: where to start reading when a run went wrong."""
    out: dict[str, list[str]] = {}
    for handle in cluster.brokers:
        path = cluster.root / handle.id / "serve.log"
        with contextlib.suppress(OSError):
            lines = path.read_text(errors="replace").splitlines()
            out[handle.id] = [line for line in lines if _INTERESTING.search(line)][-limit:]
    return out


def count_log_lines(cluster: LocalCluster, needle: str) -> dict[str, int]:
    """How many lines of each broker's log contain ``needle`` (case-insensitive)."""
    counts: dict[str, int] = {}
    for handle in cluster.brokers:
        path = cluster.root / handle.id / "serve.log"
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace").lower()
            counts[handle.id] = sum(1 for line in text.splitlines() if needle.lower() in line)
    return counts


def format_counts(counts: Mapping[str, int]) -> str:
    """``{"a": 2, "b": 1}`` as ``a 2, b 1`` (``none`` when empty), for a report's notes."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
