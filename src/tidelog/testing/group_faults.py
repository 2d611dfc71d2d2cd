"""The consumer group fault scenario (issue 17): group members crash and restart at random while brokers fail,
then :class:`~tidelog.testing.group_history.GroupHistory` checks that no committed offset went back, that every
acknowledged record was consumed at least once, and that duplicates stay within what was consumed but not
committed. ``python -m tidelog.testing.group_faults --repeat N`` runs it N times (seeds ``--seed``, ``--seed`` + 1,
...) and prints each report; ``tests/testing/test_group_faults.py`` runs it once with a fixed seed.

One run, all real processes:

1. a :class:`~tidelog.local.cluster.LocalCluster` of three brokers with short failure detection (``SETTINGS``),
   ``__cursors`` with three replicas, and a stream of ``partitions`` partitions, replication factor 3;
2. an acks-ALL :class:`~tidelog.testing.workload.ProduceLoad` into the stream; ``members`` member processes
   (:mod:`tidelog.testing.group_member`) of one group, each committing every few records; and a sampler reading
   the group's committed offsets over and over;
3. for ``duration`` seconds, from a seeded random generator: a member SIGKILLed every one to four seconds and
   started again (same consumer id) a few seconds later; a broker SIGKILLed every few seconds and restarted,
   never two at a time (the group's state and the cursors live on a majority);
4. settle: every broker and member back up, the load stopped, until each partition's committed offset reaches
   its high watermark (every record consumed and committed); then the members stop (SIGTERM), the cluster
   stops, and the history is checked.

The report separates **violations** (a guarantee broken: the checker's) from **failures** (the run did not get
where it had to in time: a broker that did not restart, offsets that never caught up). Member event files and
logs stay under ``<root>/members``, broker logs under ``<root>/bI``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidelog.client import Admin, Cluster
from tidelog.launch.process import ManagedProcess
from tidelog.local.cluster import LocalCluster
from tidelog.testing.group_history import GroupCheckReport, GroupHistory
from tidelog.testing.history import History
from tidelog.testing.workload import ProduceLoad

__all__ = ["SETTINGS", "GroupFaultProfile", "GroupFaultReport", "MemberProcess", "group_faults"]

STREAM = "group-faults"
GROUP = "group-faults"
SETTINGS: Mapping[str, str] = {
    "broker_lease_ttl_ms": "2000",  # a killed broker's partitions, groups and cursors move within seconds
    "replica_lag_time_max_ms": "2500",
    "group_consumer_timeout_ms": "3000",  # a killed member's partitions move within seconds
    "group_coordinator_timeout_ms": "3000",
    "cursors_stream_replication_factor": "3",
    "shutdown_timeout_ms": "5000",
}
MEMBER_START_WITHIN = 60.0  # Python start-up and a join, with a broker maybe down, on a loaded machine
SETTLE_WITHIN = 120.0
SAMPLE_EVERY = 0.1  # seconds between passes of the committed-offset sampler (a pace, not a wait)


@dataclass(frozen=True, slots=True)
class GroupFaultProfile:
    """How long faults go on, how often each comes, and the load."""

    duration: float = 45.0
    seed: int = 17
    members: int = 3
    partitions: int = 4
    rate: float = 100.0  # records per second at most
    commit_every: int = 20
    member_kill_every: tuple[float, float] = (1.0, 4.0)  # seconds between member kills (uniform)
    member_down_for: tuple[float, float] = (0.5, 4.0)
    broker_kill_every: tuple[float, float] = (5.0, 10.0)
    broker_down_for: tuple[float, float] = (2.0, 6.0)


@dataclass
class GroupFaultReport:
    """What one run found; ``str()`` is the summary to print or to fail a test with."""

    seed: int
    root: Path
    seconds: float = 0.0
    member_kills: int = 0
    broker_kills: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    check: GroupCheckReport | None = None

    @property
    def ok(self) -> bool:
        return self.check is not None and self.check.ok and not self.failures

    def __str__(self) -> str:
        head = "OK" if self.ok else "FAILED"
        lines = [
            f"group-faults seed {self.seed}: {head} in {self.seconds:.1f}s; {self.member_kills} member kill(s), "
            f"{self.broker_kills} broker kill(s)"
        ]
        lines.append("  " + ("the history was not checked" if self.check is None else str(self.check)))
        lines += [f"  FAILURE: {f}" for f in self.failures]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append(f"  run root: {self.root}")
        return "\n".join(lines)


class MemberProcess:
    """One member of the group, run after run (each with its own event file); always the same consumer id."""

    def __init__(self, root: Path, member_id: str, bootstrap: Callable[[], list[str]], commit_every: int) -> None:
        self.id = member_id
        self._root = root
        self._bootstrap = bootstrap
        self._commit_every = commit_every
        self.event_files: list[Path] = []
        self._process: ManagedProcess | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    async def start(self) -> None:
        """Start a new run; return once it has joined the group (its first event)."""
        events = self._root / f"{self.id}-{len(self.event_files)}.jsonl"
        events.touch()
        self.event_files.append(events)
        argv = [sys.executable, "-m", "tidelog.testing.group_member", str(events), ",".join(self._bootstrap()),
                STREAM, GROUP, self.id, "--commit-every", str(self._commit_every)]  # fmt: skip
        self._process = ManagedProcess(argv, log_path=self._root / f"{self.id}.log", name=f"member-{self.id}")

        async def joined() -> bool:
            return events.stat().st_size > 0

        await self._process.start(joined, ready_within=MEMBER_START_WITHIN)

    async def kill(self) -> None:
        if self._process is not None:
            await self._process.kill()

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop(grace=30.0)

    def runs(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Each run's name and events; a line cut short by a SIGKILL is left out."""
        out = []
        for i, path in enumerate(self.event_files):
            events = []
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    events.append(json.loads(line))
            out.append((f"{self.id}#{i}", events))
        return out


class _Run:
    """One scenario run: the cluster, the load, the members, the sampler and the faults."""

    def __init__(self, root: Path, profile: GroupFaultProfile) -> None:
        self.root = root
        self.profile = profile
        self.report = GroupFaultReport(profile.seed, root)
        self.cluster = LocalCluster(root, 3, settings=SETTINGS)
        self.produced = History()
        self.history = GroupHistory()
        (root / "members").mkdir(parents=True, exist_ok=True)
        self.members = [
            MemberProcess(root / "members", f"m{i}", self.cluster.bootstrap, profile.commit_every)
            for i in range(profile.members)
        ]
        self._rng = random.Random(profile.seed)
        self._pending: set[asyncio.Task[None]] = set()
        self._down: set[str] = set()  # ids of brokers and members killed and not started again yet
        self._stop_load = asyncio.Event()
        self._stop_sampling = asyncio.Event()

    async def run(self) -> None:
        profile = self.profile
        async with Admin(self.cluster.bootstrap()) as admin:
            await admin.create_stream(STREAM, partitions=profile.partitions, replication_factor=3)
        load = ProduceLoad(self.cluster.bootstrap, STREAM, self.produced, rate=profile.rate)
        load_task = asyncio.create_task(load.run(self._stop_load), name="group-faults-load")
        sampler = asyncio.create_task(self._sample(), name="group-faults-sampler")
        try:
            await asyncio.gather(*(m.start() for m in self.members))
            await self._faults()
            await self._settle(load_task)
        finally:
            self._stop_load.set()
            self._stop_sampling.set()
            for task in list(self._pending):
                task.cancel()
            await asyncio.gather(load_task, sampler, *self._pending, return_exceptions=True)
            for member in self.members:
                with contextlib.suppress(Exception):
                    await member.stop()
        stats = load.stats
        self.report.notes.append(f"produced: acked {stats.acked}, failed {stats.failed}, "
                                 f"indeterminate {stats.indeterminate}")  # fmt: skip

    # ---- faults ----

    async def _faults(self) -> None:
        profile, rng = self.profile, self._rng
        now = time.monotonic()
        end = now + profile.duration
        next_member = now + rng.uniform(*profile.member_kill_every)
        next_broker = now + rng.uniform(*profile.broker_kill_every)
        while (now := time.monotonic()) < end:
            await asyncio.sleep(max(0.0, min(next_member, next_broker, end) - now))
            now = time.monotonic()
            if now >= next_member:
                next_member = now + rng.uniform(*profile.member_kill_every)
                alive = [m for m in self.members if m.running and m.id not in self._down]
                if alive:
                    victim = rng.choice(alive)
                    self._down.add(victim.id)  # until its restart is done: a starting process is no victim
                    await victim.kill()
                    self.report.member_kills += 1
                    self._later(self._restart_member(victim, rng.uniform(*profile.member_down_for)))
            if now >= next_broker:
                next_broker = now + rng.uniform(*profile.broker_kill_every)
                brokers = self.cluster.brokers
                if not any(b.id in self._down for b in brokers):  # never two down: a majority holds everything
                    victim_id = rng.choice(brokers).id
                    self._down.add(victim_id)
                    await self.cluster.kill(victim_id)
                    self.report.broker_kills += 1
                    self._later(self._restart_broker(victim_id, rng.uniform(*profile.broker_down_for)))

    def _later(self, step: Any) -> None:
        task = asyncio.create_task(step)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _restart_member(self, member: MemberProcess, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await member.start()
        except Exception as exc:  # noted, and started again when the run settles
            self.report.notes.append(f"member {member.id} did not start again at once: {exc!r}")
        finally:
            self._down.discard(member.id)

    async def _restart_broker(self, broker_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.cluster.restart(broker_id)
        except Exception as exc:
            self.report.failures.append(f"broker {broker_id} did not restart: {exc!r}")
        finally:
            self._down.discard(broker_id)

    # ---- settling ----

    async def _settle(self, load_task: asyncio.Task[None]) -> None:
        await asyncio.gather(*self._pending, return_exceptions=True)
        for handle in self.cluster.brokers:
            if not handle.running:
                await self.cluster.restart(handle.id)
        for member in self.members:
            if not member.running:
                await member.start()
        self._stop_load.set()
        await load_task
        try:
            await self.cluster.wait_until(self._caught_up, SETTLE_WITHIN, "every committed offset to reach its HW")
        except TimeoutError as exc:
            self.report.failures.append(str(exc))
        self._stop_sampling.set()
        async with Admin(self.cluster.bootstrap()) as admin:
            for p in range(self.profile.partitions):
                self.history.final(p, await admin.fetch_cursor(STREAM, p, GROUP))

    async def _caught_up(self) -> bool:
        async with Admin(self.cluster.bootstrap()) as admin:
            info = await admin.describe_stream(STREAM)
            for p in info.partitions:
                if p.leader is None or await admin.fetch_cursor(STREAM, p.id, GROUP) != p.high_watermark:
                    return False
        return True

    async def _sample(self) -> None:
        """Read the group's committed offsets over and over, in order, into the history."""
        cluster = Cluster(self.cluster.bootstrap(), connect_timeout=2.0, request_timeout=5.0)
        admin = Admin(cluster=cluster)
        try:
            while not self._stop_sampling.is_set():
                for p in range(self.profile.partitions):
                    try:
                        offset = await asyncio.wait_for(admin.fetch_cursor(STREAM, p, GROUP), 10.0)
                    except Exception:  # a broker down, a failover of __cursors: read it on the next pass
                        continue
                    self.history.sample(p, offset)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_sampling.wait(), SAMPLE_EVERY)
        finally:
            await cluster.close()

    # ---- checking ----

    def check(self) -> None:
        for p in range(self.profile.partitions):
            for offset, value in self.produced.acknowledged(STREAM, p):
                self.history.acked(p, offset, value)
        for member in self.members:
            for name, events in member.runs():
                self.history.member_run(name, events)
        self.report.check = self.history.check()


async def group_faults(root: Path, profile: GroupFaultProfile | None = None) -> GroupFaultReport:
    """Run the scenario once under ``root`` (see the module docstring) and return its report."""
    profile = profile or GroupFaultProfile()
    started = time.monotonic()
    run = _Run(Path(root), profile)
    await run.cluster.start()
    try:
        await run.run()
    except Exception as exc:
        run.report.failures.append(f"the scenario raised {exc!r}")
    finally:
        await run.cluster.stop()
    run.check()
    run.report.seconds = time.monotonic() - started
    return run.report


async def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidelog.testing.group_faults", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    defaults = GroupFaultProfile()
    parser.add_argument("--seed", type=int, default=defaults.seed, help="of the first run (then +1 each)")
    parser.add_argument("--duration", type=float, default=defaults.duration, help="seconds of faults")
    parser.add_argument("--root", type=Path, default=None, help="where runs keep their clusters (a new temp dir)")
    args = parser.parse_args(argv)
    logging.getLogger("tidelog.client").setLevel(logging.ERROR)  # the load's refused writes are expected here
    root: Path = args.root or Path(tempfile.mkdtemp(prefix="tidelog-group-faults-"))
    passed = 0
    for i in range(args.repeat):
        profile = GroupFaultProfile(duration=args.duration, seed=args.seed + i)
        report = await group_faults(root / f"run-{i}", profile)
        print(report, flush=True)
        passed += report.ok
    print(f"passed: {passed}/{args.repeat}")
    return 0 if passed == args.repeat else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
