"""Nemeses on the cluster's membership: brokers added and removed while the other faults go on (issue 23, item 2,
"membership"), through the reassignment a cluster operator uses (``tidelog partition reassign``, ``tidelog broker
decommission``: :mod:`tidelog.metadata.reassignment`).

Each is a nemesis fault (:data:`tidelog.testing.nemesis.FAULTS`) and needs ``FaultRun(spare_brokers=1)``
(:func:`needs_spare_broker` says so for a list of faults): a fourth broker, ``b3``, ready but not started.
A membership change is not undone when the fault's time is up: it goes on in the background (replicas copy,
join the ISR, the old ones leave) while the next faults (kills, pauses, partitions) strike, which is the point.

- ``add-broker``: start a broker that is not running (the spare, or one decommissioned before) and reassign one to
  all of the stream's partitions so that it holds a replica of each, in place of one of their replicas (chosen
  by the plan). With every broker running already, the partitions move onto the one holding the fewest.
- ``decommission-one``: move every replica off one running broker (``tidelog broker decommission``), then, in
  the background, stop it once it holds none (bounded: :data:`DRAIN_WITHIN`). With only three brokers running it
  starts a stopped one first (the stream's replication factor is 3: the replicas need somewhere to go). One
  decommission at a time: while one drains, another is skipped (noted).

The settle waits for the background work (bounded), does not restart a decommissioned broker, and checks the
history as after any fault: nothing acknowledged lost or duplicated, replicas byte-identical below the HW.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from tidelog.client import Admin
from tidelog.protocol.errors import TidelogError
from tidelog.protocol.reassign_messages import PartitionReplicas
from tidelog.testing.fault_run import STREAM, FaultRun

__all__ = ["MEMBERSHIP_FAULTS", "needs_spare_broker"]

Undo = Callable[[], Awaitable[None]]
DRAIN_WITHIN = 120.0  # seconds a decommissioned broker may take to hand every replica on
_POLL = 0.5


def needs_spare_broker(faults: Iterable[str]) -> bool:
    """Whether a run of these faults needs ``FaultRun(spare_brokers=1)``."""
    return any(fault in MEMBERSHIP_FAULTS for fault in faults)


async def _nothing() -> None:
    return None


def _running(run: FaultRun) -> list[str]:
    return sorted(b.id for b in run.cluster.brokers if b.running and b.id not in run.retired)


def _draining(run: FaultRun) -> set[str]:
    """Brokers being decommissioned: no partition is moved onto them."""
    return {task.get_name().removeprefix("drain ") for task in run.background if not task.done()}


async def _start_stopped(run: FaultRun) -> str | None:
    """Start a broker that is not a member now (the spare, or a decommissioned one); its id, None if none."""
    stopped = sorted(run.retired)
    if not stopped:
        return None
    broker = stopped[0]
    run.retired.discard(broker)
    if not run.cluster.broker(broker).running:  # a kill's undo may have restarted one being stopped
        await run.cluster.restart(broker)
    return broker


async def add_broker(run: FaultRun, pick: float) -> tuple[str, Undo]:
    added = await _start_stopped(run)
    target = added
    if target is None:  # every broker runs: the partitions move onto the one holding the fewest replicas
        counts = {b: 0 for b in _running(run) if b not in _draining(run)}
        for partition in range(run.profile.partitions):
            record = await run.partition_record(partition)
            for replica in record.replicas if record is not None else ():
                if replica in counts:
                    counts[replica] += 1
        if not counts:
            return "skipped: no broker to move partitions onto", _nothing
        target = min(sorted(counts), key=lambda b: counts[b])
    plan: list[PartitionReplicas] = []
    for partition in range(run.profile.partitions):
        record = await run.partition_record(partition)
        if record is None or target in record.replicas:
            continue
        replicas = record.replicas
        replaced = replicas[min(int(pick * len(replicas)), len(replicas) - 1)]
        plan.append(PartitionReplicas(STREAM, partition, tuple(target if r == replaced else r for r in replicas)))
    moved = await _reassign(run, plan)
    return f"{target}{' (started)' if added else ''}, {moved} partition(s) moving onto it", _nothing


async def _reassign(run: FaultRun, plan: list[PartitionReplicas]) -> int:
    """Start ``plan``, one partition at a time (one under way already is skipped); how many started."""
    started = 0
    async with Admin(run.cluster.bootstrap()) as admin:
        for entry in plan:
            try:
                await admin.reassign_partitions([entry])
            except TidelogError as exc:
                run.report.notes.append(f"reassigning {entry.stream}/{entry.partition} refused: {exc.message[:160]}")
            else:
                started += 1
    return started


async def decommission_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    if _draining(run):
        return "skipped: a decommission is under way", _nothing
    added = await _start_stopped(run) if len(_running(run)) <= 3 else None
    members = [b for b in _running(run) if b != added]  # not the one started to take the replicas
    victim = members[min(int(pick * len(members)), len(members) - 1)]
    async with Admin(run.cluster.bootstrap()) as admin:
        moves = await admin.decommission_broker(victim)
    stuck = [f"{m.stream}/{m.partition}: {m.note}" for m in moves.moves if m.note]
    if stuck:
        run.report.notes.append(f"decommission of {victim}: not moving now: {'; '.join(stuck)[:240]}")
    run.background.append(asyncio.create_task(_drain(run, victim), name=f"drain {victim}"))  # see _draining
    started = f" (started {added} first)" if added else ""
    return f"{victim}{started}, {len(moves.moves)} replica(s) moving off", _nothing


async def _drain(run: FaultRun, victim: str) -> None:
    """Stop ``victim`` once it holds no replica (a controlled shutdown), and count it out of the cluster."""
    deadline = time.monotonic() + DRAIN_WITHIN
    while time.monotonic() < deadline:
        try:
            async with Admin(run.cluster.bootstrap()) as admin:
                left = (await admin.list_reassignments(broker_id=victim)).replicas_on
        except (TidelogError, OSError):  # the cluster is under some other fault: look again
            left = -1
        if left == 0 and run.cluster.broker(victim).running:
            run.retired.add(victim)
            await run.cluster.stop_broker(victim)
            return
        await asyncio.sleep(_POLL)
    run.report.notes.append(f"decommissioned broker {victim} still held replicas after {DRAIN_WITHIN:g}s")


MEMBERSHIP_FAULTS = {
    "add-broker": add_broker,
    "decommission-one": decommission_one,
}
