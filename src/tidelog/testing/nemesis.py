"""The nemesis: faults chosen at random from a menu, one after another, against a 3-broker cluster under an
acks-ALL load on a real network (issue 23, item 1).

A run is a :class:`~tidelog.testing.fault_run.FaultRun` with ``network=True`` (every process on a
:class:`~tidelog.testing.netlab.NetLab` host of its own). A :class:`Plan`, made from a seed before the run
starts, says when each fault comes, which one, how long it lasts and a number in [0, 1) that picks its target
among the candidates of that moment (brokers sorted by id; "the leader" is whoever leads partition 0 then).
The run applies the plan until its time is up, undoes the last fault, and the FaultRun settles (heals, restarts,
resumes), reads everything back and checks the history. The same seed replays the same plan; targets chosen by
role follow the cluster, so a replay meets the same faults at the same moments, not always the same broker.

The faults: the brokers' processes and network (here, :data:`BROKER_FAULTS` and :data:`NETWORK_FAULTS`: one
node, a pair, a ring, one way, a minority holding etcd), their dependencies (etcd members, NATS:
:mod:`~tidelog.testing.dependency_faults`), their disks (power cuts, I/O errors, a full disk:
:mod:`~tidelog.testing.lossy_faults`), their wall clocks (:mod:`~tidelog.testing.clock_faults`) and the
cluster's membership (brokers added and decommissioned: :mod:`~tidelog.testing.membership_faults`). A plan
that holds etcd member faults runs against a three-member etcd cluster, one with disk faults puts every
broker's data on a lossy FUSE disk, one with clock faults makes every broker's clock skewable, one with
membership faults holds a fourth broker ready.

One fault is in force at a time, so the cluster can make progress again once it is undone (``power-loss-all``
stops everything while it lasts); what is checked is that nothing acknowledged is lost, duplicated or
reordered whatever the faults did: the :class:`~tidelog.testing.history.History` check, the queue checker's
anomalies (:mod:`~tidelog.testing.nemesis_check`), replicas byte-identical below the HW at rest. The report
adds acknowledged writes per second in each phase (quiet, or the fault in force).

::

    python -m tidelog.testing.nemesis --time 300 --runs 20            # the long, mixed version (make chaos)
    python -m tidelog.testing.nemesis --time 60 --seed 1234 --faults kill-leader,partition-one

Each run prints its report, its seed and the schedule it applied; the exit status is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.testing.clock_faults import CLOCK_FAULTS, needs_skewed_clocks
from tidelog.testing.dependency_faults import (
    kill_etcd_member,
    needs_etcd_cluster,
    pause_etcd_member,
    restart_nats,
)
from tidelog.testing.fault_run import ELECT_WITHIN, STREAM, FaultProfile, FaultReport, FaultRun
from tidelog.testing.lossy_faults import DISK_FAULTS, needs_lossy_disks
from tidelog.testing.membership_faults import MEMBERSHIP_FAULTS, needs_spare_broker
from tidelog.testing.nemesis_check import (
    QueueRecordingHistory,
    availability,
    format_availability,
    replicas_differ,
)
from tidelog.testing.queue_checker import QueueReport

__all__ = ["BROKER_FAULTS", "FAULTS", "NETWORK_FAULTS", "Plan", "PlannedFault", "run_nemesis"]

MIN_GAP_S = 1.0  # quiet load between two faults
MAX_GAP_S = 3.0
MIN_LENGTH_S = 1.0  # how long a fault stays in force
MAX_LENGTH_S = 5.0  # above the lease (2 s in the fault settings): leases lapse, leaders move


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One step of a plan: after ``gap`` seconds of quiet, ``fault`` for ``length`` seconds on target ``pick``."""

    gap: float
    fault: str
    length: float
    pick: float


@dataclass(frozen=True, slots=True)
class Plan:
    """The faults of one run, made from its seed alone."""

    seed: int
    duration: float
    faults: tuple[str, ...]
    steps: tuple[PlannedFault, ...]

    @property
    def replay(self) -> str:
        """The command line that replays this plan."""
        return (
            f"python -m tidelog.testing.nemesis --seed {self.seed} --time {self.duration:g} "
            f"--faults {','.join(self.faults)}"
        )

    @classmethod
    def make(cls, seed: int, duration: float, faults: Sequence[str]) -> Plan:
        """Steps until their gaps and lengths add up to ``duration`` seconds."""
        if not faults:
            raise ValueError("a plan needs at least one fault")
        unknown = sorted(set(faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
        rng = random.Random(seed)
        steps: list[PlannedFault] = []
        total = 0.0
        while True:
            step = PlannedFault(
                gap=round(rng.uniform(MIN_GAP_S, MAX_GAP_S), 2),
                fault=rng.choice(list(faults)),
                length=round(rng.uniform(MIN_LENGTH_S, MAX_LENGTH_S), 2),
                pick=rng.random(),
            )
            if total + step.gap + step.length > duration and steps:
                return cls(seed, duration, tuple(faults), tuple(steps))
            steps.append(step)
            total += step.gap + step.length


@dataclass(slots=True)
class Schedule:
    """What a run applied: ``(seconds since the first fault's gap began, what, target)``, in order."""

    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str, str]] = field(default_factory=list)

    def add(self, what: str, target: str) -> None:
        self.events.append((time.monotonic() - self.started, what, target))

    def lines(self) -> list[str]:
        return [f"{at:7.2f}s {what} {target}" for at, what, target in self.events]


# ---- the faults: each applies itself to a target and returns how to undo it ----

Undo = Callable[[], Awaitable[None]]


def _pick(candidates: Sequence[str], pick: float) -> str:
    ordered = sorted(candidates)
    return ordered[min(int(pick * len(ordered)), len(ordered) - 1)]


async def _leader(run: FaultRun) -> str:
    """Partition 0's leader, waiting (bounded) for one while a leadership is moving after the previous fault."""

    async def has_leader() -> bool:
        record = await run.partition_record()
        return record is not None and bool(record.leader)

    await run.cluster.wait_until(has_leader, ELECT_WITHIN, "partition 0 to have a leader")
    return await run.leader()


def _brokers(run: FaultRun) -> list[str]:
    """The cluster's members: not a spare broker not added yet, nor one decommissioned (membership faults)."""
    return [b.id for b in run.cluster.brokers if b.id not in run.retired]


async def kill_leader(run: FaultRun, pick: float) -> tuple[str, Undo]:
    victim = await _leader(run)
    await run.cluster.kill(victim)
    return victim, lambda: run.cluster.restart(victim)


async def kill_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    victim = _pick(_brokers(run), pick)
    await run.cluster.kill(victim)
    return victim, lambda: run.cluster.restart(victim)


async def pause_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    victim = _pick(_brokers(run), pick)
    await run.cluster.pause(victim)
    return victim, lambda: run.cluster.resume(victim)


def _lab(run: FaultRun) -> Undo:
    lab = run.lab
    if lab is None:
        raise RuntimeError("network faults need FaultRun(network=True)")
    return lab.heal


def _etcd_hosts(run: FaultRun) -> list[str]:
    """The lab's etcd hosts: ``etcd``, and ``etcd1``, ``etcd2`` with a three-member cluster."""
    assert run.lab is not None
    return [name for name in run.lab.hosts if name.startswith("etcd")]


async def partition_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    """One broker cut off from every other host (brokers, etcd, NATS); clients still reach it."""
    heal = _lab(run)
    assert run.lab is not None
    victim = _pick(_brokers(run), pick)
    await run.lab.partition([victim], [name for name in run.lab.hosts if name != victim])
    return victim, heal


async def partition_leader_from_etcd(run: FaultRun, pick: float) -> tuple[str, Undo]:
    heal = _lab(run)
    assert run.lab is not None
    victim = await _leader(run)
    await run.lab.partition([victim], _etcd_hosts(run))
    return f"{victim} | etcd", heal


async def partition_pair(run: FaultRun, pick: float) -> tuple[str, Undo]:
    """Two brokers cut off from each other, each still reaching the third (a bridge: no clean majority)."""
    heal = _lab(run)
    assert run.lab is not None
    brokers = sorted(_brokers(run))
    keep = _pick(brokers, pick)
    a, b = [broker for broker in brokers if broker != keep][:2]
    await run.lab.partition([a], [b])
    return f"{a} | {b}", heal


async def partition_etcd(run: FaultRun, pick: float) -> tuple[str, Undo]:
    heal = _lab(run)
    assert run.lab is not None
    await run.lab.partition(_etcd_hosts(run), _brokers(run))
    return "etcd | all brokers", heal


async def partition_ring(run: FaultRun, pick: float) -> tuple[str, Undo]:
    """Every broker, NATS and etcd (its members together) in a ring, in an order ``pick`` shuffles: each reaches
    only its two neighbours, so no node sees a majority and every pair of brokers but one is cut."""
    heal = _lab(run)
    assert run.lab is not None
    nodes = [[b] for b in sorted(_brokers(run))] + [["nats"], _etcd_hosts(run)]
    random.Random(pick).shuffle(nodes)
    count = len(nodes)
    for i in range(count):
        for j in range(i + 2, count):
            if (i, j) != (0, count - 1):  # the first and the last close the ring
                await run.lab.partition(nodes[i], nodes[j])
    return " - ".join("+".join(node) for node in nodes), heal


async def partition_one_way(run: FaultRun, pick: float) -> tuple[str, Undo]:
    """One broker's packets to the other brokers are dropped, theirs to it still arrive (or, for the upper half
    of ``pick``, the other way round): TCP fails both ways, but each side sees it fail differently."""
    heal = _lab(run)
    assert run.lab is not None
    brokers = sorted(_brokers(run))
    victim = _pick(brokers, pick * 2 % 1.0)
    others = [b for b in brokers if b != victim]
    outward = pick < 0.5
    for other in others:
        await (run.lab.cut(victim, other) if outward else run.lab.cut(other, victim))
    return f"{victim} -> {','.join(others)}" if outward else f"{','.join(others)} -> {victim}", heal


async def partition_minority_with_etcd(run: FaultRun, pick: float) -> tuple[str, Undo]:
    """One broker keeps etcd while the other brokers keep NATS and each other: the majority of brokers loses the
    metadata store (no lease renewals, no controller writes) and the minority loses its peers."""
    heal = _lab(run)
    assert run.lab is not None
    victim = _pick(_brokers(run), pick)
    minority = [victim, *_etcd_hosts(run)]
    await run.lab.partition(minority, [name for name in run.lab.hosts if name not in minority])
    return f"{victim}+etcd | the rest", heal


Fault = Callable[[FaultRun, float], Awaitable[tuple[str, Undo]]]
BROKER_FAULTS: Mapping[str, Fault] = {
    "kill-leader": kill_leader,
    "kill-one": kill_one,
    "pause-one": pause_one,
    "partition-one": partition_one,
    "partition-leader-from-etcd": partition_leader_from_etcd,
    "partition-pair": partition_pair,
    "partition-etcd": partition_etcd,
}
"""The process and network faults of brokers (the CI gate's seed 79 plans from these)."""
NETWORK_FAULTS: Mapping[str, Fault] = {
    "partition-ring": partition_ring,
    "partition-one-way": partition_one_way,
    "partition-minority-with-etcd": partition_minority_with_etcd,
}
"""Network partitions beyond one node and one pair (not in the CI gate's plans)."""
FAULTS: Mapping[str, Fault] = {
    **BROKER_FAULTS,
    **NETWORK_FAULTS,
    "kill-etcd-member": kill_etcd_member,
    "pause-etcd-member": pause_etcd_member,
    "restart-nats": restart_nats,
    **DISK_FAULTS,
    **CLOCK_FAULTS,
    **MEMBERSHIP_FAULTS,
}
"""Every fault a plan may hold (``--faults``; all of them by default)."""


# ---- a run ----


@dataclass(slots=True)
class NemesisReport:
    """A FaultRun's report with the plan's seed, the schedule applied, the queue checker's counts per anomaly,
    the replicas whose bytes differ below the HW at rest, and acknowledged writes per second per phase."""

    plan: Plan
    report: FaultReport
    schedule: Schedule
    queue: QueueReport | None = None
    differing: list[str] = field(default_factory=list)
    phases: dict[str, tuple[int, float]] = field(default_factory=dict)

    @property
    def anomalies(self) -> dict[str, int]:
        """Every anomaly's count (the queue checker's, plus ``replicas-differ``), zeros included."""
        counts = dict(self.queue.counts) if self.queue is not None else {}
        counts["replicas-differ"] = len(self.differing)
        return counts

    @property
    def ok(self) -> bool:
        return self.report.ok and self.queue is not None and self.queue.ok and not self.differing

    def __str__(self) -> str:
        anomalies = sum(self.anomalies.values())
        history = "OK" if self.report.ok else "FAILED"
        verdict = "OK" if self.ok else f"FAILED: {anomalies} anomalies, the history check and liveness {history}"
        lines = [f"verdict: {verdict}", str(self.report)]
        if self.queue is None:
            lines.append("  anomalies: not checked")
        else:
            lines.append("  anomalies: " + ", ".join(f"{count} {name}" for name, count in self.anomalies.items()))
            lines += [f"    {line}" for line in str(self.queue).splitlines()[1:]]
        lines += [f"    replicas-differ: {line}" for line in self.differing]
        lines.append(f"  availability: {format_availability(self.phases)}")
        lines += [f"  seed: {self.plan.seed}; replay: {self.plan.replay}", "  schedule:"]
        lines += [f"    {line}" for line in self.schedule.lines()]
        return "\n".join(lines)


async def run_nemesis(root: Path, plan: Plan, *, partitions: int = 3) -> NemesisReport:
    """Apply ``plan`` to a fresh cluster under load, then settle and check (see the module docstring)."""
    profile = FaultProfile(warmup=1.0, hold=1.0, rounds=0, partitions=partitions)
    history = QueueRecordingHistory()
    run = FaultRun(
        root,
        f"nemesis seed {plan.seed}",
        profile,
        network=True,
        history=history,
        etcd_members=3 if needs_etcd_cluster(plan.faults) else 1,
        lossy_disks=needs_lossy_disks(plan.faults),
        skewed_clocks=needs_skewed_clocks(plan.faults),
        spare_brokers=1 if needs_spare_broker(plan.faults) else 0,
    )
    schedule = Schedule()
    ended = 0.0
    async with run:
        schedule.started = time.monotonic()
        for step in plan.steps:
            await asyncio.sleep(step.gap)
            target, undo = await FAULTS[step.fault](run, step.pick)
            schedule.add(f"start {step.fault}", target)
            try:
                await asyncio.sleep(step.length)
            finally:
                await undo()
                schedule.add(f"stop {step.fault}", target)
            run.report.rounds += 1
        ended = time.monotonic()
    result = NemesisReport(plan, run.report, schedule, queue=history.check_queue())
    result.phases = availability(run.load.stats.acks, schedule.events, schedule.started, ended or time.monotonic())
    data_dirs = {handle.id: handle.data_dir for handle in run.cluster.brokers}
    for (stream, partition), seen in sorted(history.replicas_seen.items()):
        if stream == STREAM:
            result.differing += await replicas_differ(data_dirs, stream, partition, seen)
    return result


async def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.nemesis", description=__doc__.split("\n\n")[0])
    parser.add_argument("--time", type=float, default=60.0, help="seconds of faults per run (default 60)")
    parser.add_argument("--runs", type=int, default=1, help="runs, each with a new seed after the first")
    parser.add_argument("--seed", type=int, default=None, help="the first run's seed (default: random)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, from: {', '.join(FAULTS)}")
    parser.add_argument("--root", type=Path, default=None, help="where runs keep their clusters (a new temp dir)")
    args = parser.parse_args(argv)
    if args.time <= 0 or args.runs < 1:
        parser.error("--time must be positive and --runs at least 1")
    faults = [name.strip() for name in args.faults.split(",") if name.strip()]
    root: Path = args.root or Path(tempfile.mkdtemp(prefix="tidelog-nemesis-"))
    seed = args.seed if args.seed is not None else secrets.randbelow(1 << 31)
    passed = 0
    for index in range(args.runs):
        try:
            plan = Plan.make(seed + index, args.time, faults)
        except ValueError as exc:
            parser.error(str(exc))
        try:
            result = await run_nemesis(root / f"run-{index}", plan)
        except Exception as exc:  # a cluster that did not start, a fault that could not be applied
            print(f"run {index} (seed {plan.seed}): ERROR {exc!r}", flush=True)
            continue
        print(result, flush=True)
        passed += result.ok
    print(f"passed: {passed}/{args.runs} runs of {args.time:g}s ({', '.join(faults)})")
    return 0 if passed == args.runs else 1


async def _main_until_stopped(argv: Sequence[str]) -> int:
    """:func:`_main`, stopped by SIGTERM as by Ctrl-C: the run in progress is cancelled and its ``async with``
    blocks stop its cluster and unmount its disks (killed outright, they left FUSE mounts behind)."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await _main(argv)
    except asyncio.CancelledError:
        print("stopped: the run in progress was cancelled and its cluster stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(asyncio.run(_main_until_stopped(sys.argv[1:])))
