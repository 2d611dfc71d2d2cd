"""Fault scenarios: a real 3-broker cluster under an acks-ALL load, one kind of fault injected in rounds, then
a history check (issue 4, item 9). Each scenario is a function returning a :class:`FaultReport`, so the same
code runs briefly in CI and for minutes with a long :class:`FaultProfile`::

    report = await kill_leader(tmp_path, FaultProfile.short())
    assert report.ok, report

Every scenario runs the same way (:class:`FaultRun`):

1. start a :class:`~tidelog.testing.cluster.LocalCluster` with short timings (``SETTINGS``), create a stream
   with replication factor 3 (so ``min_isr`` is 2) and wait for its full ISR;
2. run a :class:`~tidelog.testing.workload.ProduceLoad` (acks ALL, flush ``always``, the broker default) and a
   :class:`~tidelog.testing.workload.TailConsumer`, both recording into one
   :class:`~tidelog.testing.history.History`;
3. inject the scenario's fault ``rounds`` times, each time waiting (bounded) for what the cluster must do about
   it — a new leader, an ISR shrink, a rejoin — and timing it;
4. settle: restart killed brokers, resume paused ones, heal cut ones, wait for every partition's ISR to be full
   and its HW to reach its log end; read everything committed once more; stop the brokers gracefully
   (followers first, so each checkpoints the final HW); read every replica at rest; run :meth:`History.check`.

A report separates **violations** (the history checker's: a safety guarantee broken) from **failures** (an
expectation about liveness or fencing not met in time: no new leader, no rejoin, a deposed leader that
acknowledged a write). ``ok`` needs neither. On anything wrong the report carries excerpts of the brokers' logs
(``<root>/bI/serve.log``), which stay on disk for a closer look.

The scenarios: :func:`kill_leader`, :func:`pause_follower`, :func:`pause_leader`, :func:`isolate_leader`,
:func:`restart_all`; ``SCENARIOS`` names them. ``python -m tidelog.testing.faults NAME --repeat N`` runs one
from the command line and prints each report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tidelog.client import Admin
from tidelog.metadata.records import PartitionRecord
from tidelog.testing.cluster import LocalCluster
from tidelog.testing.history import CheckReport, History
from tidelog.testing.workload import ProduceLoad, TailConsumer, produce_direct, read_all, tally

__all__ = [
    "SCENARIOS",
    "SETTINGS",
    "FaultProfile",
    "FaultReport",
    "FaultRun",
    "isolate_leader",
    "kill_leader",
    "pause_follower",
    "pause_leader",
    "restart_all",
]

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
    ) -> None:
        self.profile = profile
        self.cluster = LocalCluster(Path(root), 3, settings=settings, proxied=proxied)
        self.history = History()
        self.report = FaultReport(scenario, Path(root))
        self.load = ProduceLoad(self.cluster.bootstrap, STREAM, self.history, window=profile.window, rate=profile.rate)
        self.tail = TailConsumer(self.cluster.bootstrap, STREAM, self.history)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = 0.0

    # ---- lifecycle ----

    async def __aenter__(self) -> FaultRun:
        self._started = time.monotonic()
        await self.cluster.start()
        try:
            async with Admin(self.cluster.bootstrap()) as admin:
                await admin.create_stream(STREAM, partitions=self.profile.partitions, replication_factor=3)
            if not await self.expect(self._isr_full, SETTLE_WITHIN, "the new stream's ISR to be full"):
                raise RuntimeError(f"the stream never had a full ISR: {self.report}")
            self._tasks = [
                asyncio.create_task(self.load.run(self._stop), name="fault-load"),
                asyncio.create_task(self.tail.run(self._stop), name="fault-tail"),
            ]
        except BaseException:
            await self.cluster.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is not None:
                self.report.failures.append(f"the scenario raised {exc!r}")
            await self._stop_workloads()
            await self._settle_and_verify()
        finally:
            await self.cluster.stop()
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
            self.report.notes.append("producer outcomes: " + _counts(stats.errors))
        if self.tail.stats.errors:
            self.report.notes.append("consumer restarts after: " + _counts(self.tail.stats.errors))

    async def _settle_and_verify(self) -> None:
        """Bring every broker back, wait for full ISRs, read, stop gracefully, read replicas, check."""
        cluster = self.cluster
        for handle in cluster.brokers:
            if handle.proxy is not None:
                await cluster.heal(handle.id)
            if handle.paused:
                await cluster.resume(handle.id)
        await asyncio.gather(*(cluster.restart(b.id) for b in cluster.brokers if not b.running))
        settled = await self.expect(self._isr_full, SETTLE_WITHIN, "every ISR to be full at the end")
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
                snapshot = await cluster.read_replica(handle.id, STREAM, partition)
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

    async def _caught_up(self) -> bool:
        async with Admin(self.cluster.bootstrap()) as admin:
            info = await admin.describe_stream(STREAM)
        return all(p.leader is not None and p.high_watermark == p.log_end for p in info.partitions)


# ---- scenarios ----


async def kill_leader(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """SIGKILL partition 0's leader under load; a new leader takes over; the old one restarts and rejoins."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "kill-leader", profile)
    async with run:
        await run.hold(profile.warmup)
        for _ in range(profile.rounds):
            victim = await run.leader()
            fault_at = time.monotonic()
            await run.cluster.kill(victim)
            await run.expect(run.leader_is_not(victim), ELECT_WITHIN, "a new leader", timing="leader_elected_s")
            await run.expect_failover(fault_at)
            await run.hold()
            restarted_at = time.monotonic()
            await run.cluster.restart(victim)
            await run.expect(run.in_isr(victim), REJOIN_WITHIN, f"{victim} to rejoin the ISR")
            run.time("restart_to_isr_s", time.monotonic() - restarted_at)
            await run.hold()
            run.report.rounds += 1
    return run.report


PAUSE_FOLLOWER_SETTINGS: Mapping[str, str] = {
    **SETTINGS,
    "replica_lag_time_max_ms": "2000",
    # The lease outlives the pause, so it is the lag rule, not the follower's death, that takes it out of the ISR.
    "broker_lease_ttl_ms": "10000",
}


async def pause_follower(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """SIGSTOP a follower (not the controller) past ``replica_lag_time_max``: it must leave the ISR while acks
    continue (``min_isr`` 2 still met); SIGCONT it: it catches up and rejoins."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "pause-follower", profile, settings=PAUSE_FOLLOWER_SETTINGS)
    async with run:
        await run.hold(profile.warmup)
        for _ in range(profile.rounds):
            record = await run.partition_record()
            assert record is not None
            controller = await run.cluster.controller_id()
            followers = [b for b in record.replicas if b != record.leader]
            victim = next((b for b in followers if b != controller), followers[0])
            await run.cluster.pause(victim)
            if await run.expect(
                run.not_in_isr(victim), ELECT_WITHIN, f"paused {victim} to leave the ISR", timing="isr_shrink_s"
            ):
                await run.expect_failover(time.monotonic(), "acked_after_shrink_s")
            await run.hold()
            await run.cluster.resume(victim)
            await run.expect(run.in_isr(victim), REJOIN_WITHIN, f"{victim} to rejoin the ISR", timing="rejoin_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


PAUSE_LEADER_SETTINGS: Mapping[str, str] = {
    **SETTINGS,
    # No leadership balancing: the woken leader stays a follower, so any ack it gives is one it must not give.
    "leader_balance_interval_ms": "600000",
}


async def pause_leader(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """SIGSTOP partition 0's leader past its lease: a new leader is elected. When the old one wakes up it is
    deposed: a client still writing to it directly must not get an ack; it rejoins as a follower, truncating
    any divergent tail (the final ISR comparison checks that)."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "pause-leader", profile, settings=PAUSE_LEADER_SETTINGS)
    async with run:
        await run.hold(profile.warmup)
        for round_ in range(profile.rounds):
            victim = await run.leader()
            handle = run.cluster.broker(victim)
            fault_at = time.monotonic()
            await run.cluster.pause(victim)
            await run.expect(run.leader_is_not(victim), ELECT_WITHIN, "a new leader", timing="leader_elected_s")
            await run.expect_failover(fault_at)
            await run.hold()
            # A stale client: its requests reach the deposed leader as it wakes, before it sees new metadata.
            # It stops at the first NOT_LEADER: from then on the broker knows.
            probe = asyncio.create_task(
                produce_direct(
                    handle.direct_wire_address,
                    STREAM,
                    0,
                    run.history,
                    name=f"stale-{round_}",
                    count=5,
                    timeout=5.0,
                    until_refused=True,
                )
            )
            await asyncio.sleep(0.2)  # the probe connects (the kernel accepts for a paused process) and sends
            await run.cluster.resume(victim)
            outcomes = await probe
            shown = ", ".join(map(str, outcomes))
            if any(o.outcome == "acked" for o in outcomes):
                run.report.failures.append(f"deposed leader {victim} acknowledged write(s) before refusing: {shown}")
            run.report.notes.append(f"round {round_}: writes to the deposed leader {victim}: {shown}")
            await run.expect(run.in_isr(victim), REJOIN_WITHIN, f"{victim} to rejoin the ISR", timing="rejoin_s")
            await run.hold()
            run.report.rounds += 1
        run.report.notes.append("truncations logged: " + _counts(count_log_lines(run.cluster, "truncat")))
    return run.report


async def isolate_leader(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """Cut partition 0's leader off (its wire port, through the proxy): followers cannot fetch, clients cannot
    reach it; its own outgoing connections and its etcd lease stay. A client on its side of the cut keeps
    writing to it directly: nothing may be acknowledged without the ISR (the writes time out, or are refused
    once the ISR is below ``min_isr``). Heal: the ISR must be full again."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "isolate-leader", profile, proxied=True)
    async with run:
        await run.hold(profile.warmup)
        for round_ in range(profile.rounds):
            victim = await run.leader()
            handle = run.cluster.broker(victim)
            cut_at = time.monotonic()
            await run.cluster.isolate(victim)
            cut = asyncio.Event()
            inside = asyncio.create_task(
                produce_direct(
                    handle.direct_wire_address,
                    STREAM,
                    0,
                    run.history,
                    name=f"inside-{round_}",
                    count=1000,
                    timeout=5.0,
                    stop=cut,
                )
            )

            async def isr_changed(victim: str = victim) -> bool:
                record = await run.partition_record()
                return record is not None and (record.leader != victim or set(record.isr) != set(record.replicas))

            await run.expect(isr_changed, ELECT_WITHIN, "the ISR or the leader to change", timing="isr_change_s")
            await run.hold()
            cut.set()
            outcomes = await inside
            record = await run.partition_record()
            isr = record.isr if record is not None else ()
            run.report.notes.append(
                f"round {round_}: leader {victim} cut off; ISR now {isr}; writes from inside the cut: "
                + _counts(tally(outcomes))
            )
            acked = [o for o in outcomes if o.outcome == "acked"]
            if acked:
                run.report.failures.append(
                    f"{victim}, cut off from its followers, acknowledged {len(acked)} acks-ALL write(s) "
                    f"(ISR {isr}): " + ", ".join(f"{o} {o.at - cut_at:.2f}s after the cut" for o in acked)
                )
            await run.cluster.heal(victim)
            await run.expect(run._isr_full, REJOIN_WITHIN, "the ISR to be full after healing", timing="heal_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


async def restart_all(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """Kill a follower (writes go on: the ISR still meets ``min_isr``), then the leader (the survivor leads
    alone and must refuse acks-ALL writes), then restart both: the ISR must be full again and writes resume."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "restart-all", profile)
    async with run:
        await run.hold(profile.warmup)
        for _ in range(profile.rounds):
            record = await run.partition_record()
            assert record is not None
            leader = record.leader
            follower = next(b for b in record.replicas if b != leader)
            await run.cluster.kill(follower)
            await run.expect(run.not_in_isr(follower), ELECT_WITHIN, f"killed {follower} to leave the ISR")
            await run.hold()
            await run.cluster.kill(leader)
            await run.expect(run.leader_is_not(leader), ELECT_WITHIN, "a new leader", timing="leader_elected_s")
            await run.hold()
            restarted_at = time.monotonic()
            await asyncio.gather(run.cluster.restart(follower), run.cluster.restart(leader))
            await run.expect(run._isr_full, REJOIN_WITHIN, "the ISR to be full after restarts", timing="isr_full_s")
            await run.expect_failover(restarted_at, "acked_after_restart_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


Scenario = Callable[[Path, FaultProfile | None], Awaitable[FaultReport]]
SCENARIOS: Mapping[str, Scenario] = {
    "kill-leader": kill_leader,
    "pause-follower": pause_follower,
    "pause-leader": pause_leader,
    "isolate-leader": isolate_leader,
    "restart-all": restart_all,
}


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


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


# ---- command line ----


async def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.faults", description=__doc__.split("\n")[0])
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--long", action="store_true", help="the long profile (minutes per run)")
    parser.add_argument("--root", type=Path, default=None, help="where runs keep their clusters (a new temp dir)")
    args = parser.parse_args(argv)
    root: Path = args.root or Path(tempfile.mkdtemp(prefix="tidelog-faults-"))
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    profile = FaultProfile.long() if args.long else FaultProfile.short()
    passed: dict[str, int] = dict.fromkeys(names, 0)
    for i in range(args.repeat):
        for name in names:
            try:
                report = await SCENARIOS[name](root / f"{name}-{i}", profile)
            except Exception as exc:  # a cluster that did not start, a scenario step that raised: one failed run
                print(f"{name}: ERROR in run {i}: {exc!r}", flush=True)
                continue
            print(report, flush=True)
            passed[name] += report.ok
    print("passed: " + ", ".join(f"{n} {passed[n]}/{args.repeat}" for n in names))
    return 0 if all(v == args.repeat for v in passed.values()) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
