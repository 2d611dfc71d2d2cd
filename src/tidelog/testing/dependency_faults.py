"""Nemeses on what the brokers depend on: a member of a three-member etcd cluster killed or paused, NATS
restarted (issue 23, item 2, "dependencies").

Each is a nemesis fault (:data:`tidelog.testing.nemesis.FAULTS`): it applies itself to a running
:class:`~tidelog.testing.fault_run.FaultRun` and returns what it hit and how to undo it.

- ``kill-etcd-member``: SIGKILL one etcd member (by PID); undone by restarting it on its data, healthy again
  once it is back in the quorum. Two members keep the quorum, so metadata keeps changing: the brokers' etcd
  clients must move to another endpoint, leases and watches be taken up again.
- ``pause-etcd-member``: SIGSTOP one member, SIGCONT to undo. Harder than a kill: the member's connections stay
  open and answer nothing, so a client stuck on it learns of the fault only from its own deadlines. If the
  member led the etcd cluster, the other two elect a new leader after etcd's election timeout (1 s).
- ``restart-nats``: stop NATS (SIGTERM), start it again on the same port when undone. Writes through the wire
  protocol do not touch NATS; ingest from NATS subjects reconnects. Messages published to NATS while it is down
  are lost: plain NATS is at-most-once (``docs/durability.md``).

These need ``FaultRun(etcd_members=3)`` for the etcd faults (:func:`needs_etcd_cluster` says so for a list
of faults); ``restart-nats`` works with any run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from tidelog.testing.fault_run import FaultRun

__all__ = ["ETCD_FAULTS", "kill_etcd_member", "needs_etcd_cluster", "pause_etcd_member", "restart_nats"]

Undo = Callable[[], Awaitable[None]]

ETCD_FAULTS = frozenset({"kill-etcd-member", "pause-etcd-member"})


def needs_etcd_cluster(faults: Iterable[str]) -> bool:
    """Whether a run of these faults needs a three-member etcd cluster."""
    return any(fault in ETCD_FAULTS for fault in faults)


def _member(run: FaultRun, pick: float) -> int:
    if run.etcd is None:
        raise RuntimeError("etcd member faults need FaultRun(etcd_members=3)")
    count = len(run.etcd.members)
    return min(int(pick * count), count - 1)


async def kill_etcd_member(run: FaultRun, pick: float) -> tuple[str, Undo]:
    index = _member(run, pick)
    etcd = run.etcd
    assert etcd is not None
    await etcd.kill(index)
    return f"etcd m{index}", lambda: etcd.restart(index)


async def pause_etcd_member(run: FaultRun, pick: float) -> tuple[str, Undo]:
    index = _member(run, pick)
    etcd = run.etcd
    assert etcd is not None
    etcd.pause(index)

    async def undo() -> None:
        etcd.resume(index)

    return f"etcd m{index}", undo


async def restart_nats(run: FaultRun, pick: float) -> tuple[str, Undo]:
    nats = run.cluster.nats
    await nats.stop()
    return "nats", nats.start
