"""Fault scenarios: a real 3-broker cluster under an acks-ALL load, one kind of fault injected in rounds, then
a history check (issue 4, item 9). Each scenario is a function returning a
:class:`~tidelog.testing.fault_run.FaultReport`, so the same code runs briefly in CI and for minutes with a long
:class:`~tidelog.testing.fault_run.FaultProfile`::

    report = await kill_leader(tmp_path, FaultProfile.short())
    assert report.ok, report

Each scenario drives a :class:`~tidelog.testing.fault_run.FaultRun` (how a run starts, settles and is
checked, and what its report says, is told there).

The scenarios: :func:`kill_leader`, :func:`pause_follower`, :func:`pause_leader`, :func:`isolate_leader`,
:func:`restart_all`, and on real network partitions (:class:`~tidelog.testing.netlab.NetLab`)
:func:`partition_leader`, :func:`partition_leader_from_etcd`, :func:`partition_follower` and
:func:`partition_etcd`, and :func:`corrupt_follower` (disk faults, :mod:`tidelog.testing.disk_faults`);
``SCENARIOS`` names them.
``python -m tidelog.testing.faults NAME --repeat N`` runs one from the command line and prints each report.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from tidelog.testing import disk_faults
from tidelog.testing.disk_faults import partition_files
from tidelog.testing.fault_run import (
    ELECT_WITHIN,
    REJOIN_WITHIN,
    SETTINGS,
    STREAM,
    FaultProfile,
    FaultReport,
    FaultRun,
    count_log_lines,
    format_counts,
)
from tidelog.testing.workload import tally

__all__ = [
    "SCENARIOS",
    "corrupt_follower",
    "isolate_leader",
    "kill_leader",
    "pause_follower",
    "partition_etcd",
    "partition_follower",
    "partition_leader",
    "partition_leader_from_etcd",
    "pause_leader",
    "restart_all",
]


# ---- scenarios ----


async def kill_leader(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """SIGKILL partition 0's leader under load; a new leader takes over; the old one restarts and rejoins."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "kill-leader", profile)
    async with run:
        await run.hold(profile.warmup)
        for _ in range(profile.rounds):
            victim = await run.depose_leader(run.cluster.kill)
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
            victim = await run.follower()
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
            victim = await run.depose_leader(run.cluster.pause)
            # A stale client: its requests reach the deposed leader as it wakes, before it sees new metadata.
            # It stops at the first NOT_LEADER: from then on the broker knows.
            probe = run.write_directly(victim, f"stale-{round_}", 5, until_refused=True)
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
        run.report.notes.append("truncations logged: " + format_counts(count_log_lines(run.cluster, "truncat")))
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
            cut_at = time.monotonic()
            await run.cluster.isolate(victim)
            cut = asyncio.Event()
            inside = run.write_directly(victim, f"inside-{round_}", 1000, stop=cut)

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
                + format_counts(tally(outcomes))
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


async def partition_leader(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """Kafka's 2013 Jepsen case on a real network: partition 0's leader cut off from etcd and from its followers
    (:class:`~tidelog.testing.netlab.NetLab` partition) while clients, NATS and the run itself still reach it.
    It loses its lease and the controller elects a follower. A client writing straight to the cut-off leader must
    get no ack: it cannot reach its ISR, and cannot shrink the ISR without etcd. Heal: it rejoins as a follower,
    truncating what it wrote alone (the final replica comparison checks that)."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "partition-leader", profile, network=True)
    assert run.lab is not None
    async with run:
        await run.hold(profile.warmup)
        for round_ in range(profile.rounds):
            victim = await run.leader()
            others = [b.id for b in run.cluster.brokers if b.id != victim]
            cut_at = time.monotonic()
            await run.lab.partition([victim], ["etcd", *others])
            cut = asyncio.Event()
            inside = run.write_directly(victim, f"inside-{round_}", 1000, stop=cut)
            await run.expect(run.leader_is_not(victim), ELECT_WITHIN, "a new leader", timing="leader_elected_s")
            await run.expect_failover(cut_at)
            await run.hold()
            cut.set()
            outcomes = await inside
            run.report.notes.append(
                f"round {round_}: leader {victim} cut off from etcd and {', '.join(others)}; writes to it: "
                + format_counts(tally(outcomes))
            )
            acked = [o for o in outcomes if o.outcome == "acked"]
            if acked:
                run.report.failures.append(
                    f"{victim}, cut off from etcd and its followers, acknowledged {len(acked)} acks-ALL write(s): "
                    + ", ".join(f"{o} {o.at - cut_at:.2f}s after the cut" for o in acked)
                )
            await run.lab.heal()
            await run.expect(run.in_isr(victim), REJOIN_WITHIN, f"{victim} to rejoin the ISR", timing="rejoin_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


async def partition_leader_from_etcd(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """Partition 0's leader cut off from etcd alone: its followers, clients and NATS still reach it. Its lease
    lapses and the controller elects a follower; until every follower has learnt that, they may still fetch
    from the old leader, which must still acknowledge nothing the new leader lacks (the history check finds any
    acknowledged write lost). A client writing straight to the old leader counts what it acknowledged after
    the new leader was elected. Heal: it rejoins as a follower."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "partition-leader-from-etcd", profile, network=True)
    assert run.lab is not None
    async with run:
        await run.hold(profile.warmup)
        for round_ in range(profile.rounds):
            victim = await run.leader()
            cut_at = time.monotonic()
            await run.lab.partition([victim], ["etcd"])
            cut = asyncio.Event()
            inside = run.write_directly(victim, f"stale-{round_}", 1000, stop=cut)
            await run.expect(run.leader_is_not(victim), ELECT_WITHIN, "a new leader", timing="leader_elected_s")
            elected_at = time.monotonic()
            await run.expect_failover(cut_at)
            await run.hold()
            cut.set()
            outcomes = await inside
            late = [o for o in outcomes if o.outcome == "acked" and o.at > elected_at]
            run.report.notes.append(
                f"round {round_}: leader {victim} cut off from etcd; writes to it: {format_counts(tally(outcomes))}"
                f"; acknowledged after the new leader's election: {len(late)}"
            )
            await run.lab.heal()
            await run.expect(run.in_isr(victim), REJOIN_WITHIN, f"{victim} to rejoin the ISR", timing="rejoin_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


async def partition_follower(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """A minority of one on a real network: a follower of partition 0 (not the controller) cut off from every
    other broker, etcd and NATS. It must leave the ISR while acks go on (``min_isr`` 2 still met); healed, it
    catches up and rejoins."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "partition-follower", profile, network=True)
    assert run.lab is not None
    async with run:
        await run.hold(profile.warmup)
        for _ in range(profile.rounds):
            victim = await run.follower()
            cut_at = time.monotonic()
            await run.lab.partition([victim], [name for name in run.lab.hosts if name != victim])
            if await run.expect(
                run.not_in_isr(victim), ELECT_WITHIN, f"cut-off {victim} to leave the ISR", timing="isr_shrink_s"
            ):
                await run.expect_failover(cut_at, "acked_after_shrink_s")
            await run.hold()
            await run.lab.heal()
            await run.expect(run.in_isr(victim), REJOIN_WITHIN, f"{victim} to rejoin the ISR", timing="rejoin_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


async def partition_etcd(root: Path, profile: FaultProfile | None = None) -> FaultReport:
    """etcd cut off from every broker for twice the lease TTL (every lease lapses, no controller can act), then
    healed: the brokers register again, a controller is elected, every ISR is full again and writes go on. No
    acknowledged write may be lost on the way, whatever the cluster did while it could not reach its metadata."""
    profile = profile or FaultProfile.short()
    run = FaultRun(root, "partition-etcd", profile, network=True)
    assert run.lab is not None
    lease_s = int(SETTINGS["broker_lease_ttl_ms"]) / 1000
    async with run:
        await run.hold(profile.warmup)
        for round_ in range(profile.rounds):
            brokers = [b.id for b in run.cluster.brokers]
            await run.lab.partition(["etcd"], brokers)
            acked_before = run.load.stats.acked
            await asyncio.sleep(2 * lease_s)
            run.report.notes.append(
                f"round {round_}: etcd cut off for {2 * lease_s:g}s; "
                f"{run.load.stats.acked - acked_before} writes acknowledged meanwhile"
            )
            healed_at = time.monotonic()
            await run.lab.heal()
            await run.expect(run._isr_full, REJOIN_WITHIN, "every ISR to be full after healing", timing="heal_s")
            await run.expect_failover(healed_at, "acked_after_heal_s")
            await run.hold()
            run.report.rounds += 1
    return run.report


CORRUPTIONS = ("bitflip", "truncate", "rollback", "checkpoint")


async def corrupt_follower(root: Path, profile: FaultProfile | None = None, how: str = "bitflip") -> FaultReport:
    """Crash a follower of partition 0 (not the controller), damage its files while it is down, start it again:
    it must notice, repair from the leader (never serve or acknowledge what it lost) and rejoin the ISR, and
    at rest every replica must hold the same records up to the high watermark (the history check compares
    them). ``how``: ``bitflip`` (10 bits in the middle of the log), ``truncate`` (the log's last half cut at
    random), ``rollback`` (a 4 KiB chunk of the log put back as it was a moment before), ``checkpoint`` (bits
    flipped in its high-watermark and leader-epoch checkpoints)."""
    if how not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {how!r}; known: {', '.join(CORRUPTIONS)}")
    profile = profile or FaultProfile.short()
    run = FaultRun(root, f"corrupt-follower-{how}", profile)
    rng = random.Random(len(how))  # a fixed choice of bits per kind: a failure replays
    async with run:
        await run.hold(profile.warmup)
        for _ in range(profile.rounds):
            victim = await run.follower()
            data_dir = run.cluster.broker(victim).data_dir
            logs = partition_files(data_dir, STREAM, 0)
            older = {path: disk_faults.snapshot(path) for path in logs} if how == "rollback" else {}
            if older:
                await run.hold()
            await run.cluster.kill(victim)
            done = []
            if how == "checkpoint":
                for name in ("hw-checkpoint", "leader-epoch-checkpoint"):
                    done += [disk_faults.flip_bits(p, rng, count=4) for p in partition_files(data_dir, STREAM, 0, name)]
            for path in logs if how != "checkpoint" else []:
                size = disk_faults.data_end(path)
                if how == "bitflip":
                    done.append(disk_faults.flip_bits(path, rng, count=10, start=size // 4, end=3 * size // 4))
                elif how == "truncate":
                    done.append(disk_faults.truncate_tail(path, rng))
                else:
                    done.append(disk_faults.roll_back(path, older.get(path, b""), rng))
            run.report.notes.append(f"{victim}: " + "; ".join(done or ["no file found to damage"]))
            await run.cluster.restart(victim)
            await run.expect(
                run.in_isr(victim), REJOIN_WITHIN, f"damaged {victim} to rejoin the ISR", timing="rejoin_s"
            )
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
    "partition-leader": partition_leader,
    "partition-leader-from-etcd": partition_leader_from_etcd,
    "partition-follower": partition_follower,
    "partition-etcd": partition_etcd,
    "restart-all": restart_all,
    **{f"corrupt-follower-{how}": functools.partial(corrupt_follower, how=how) for how in CORRUPTIONS},
}


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
