"""Nemeses on a broker's disk through :class:`~tidelog.testing.lossy_disk.LossyDisk`: power cuts that lose every
byte not fsynced, and I/O errors (issue 23, item 2, "disk").

Each is a nemesis fault (:data:`tidelog.testing.nemesis.FAULTS`) and needs ``FaultRun(lossy_disks=True)``
(:func:`needs_lossy_disks` says so for a list of faults):

- ``power-loss-one``: one broker's power goes: SIGKILL, then its disk drops whatever was not fsynced. It comes
  back (restart on what was synced) when the fault is undone.
- ``power-loss-all``: every broker at once, the correlated failure (a rack, a data centre). Nothing is served
  until they come back; what was acknowledged must all be there when they do, since an acks-ALL write is
  fsynced by every ISR member before it is acknowledged (flush policy ``always``, the default).
- ``eio-fsync-one``: one broker's fsyncs fail with ``EIO`` until undone. Its logs must refuse what they could
  not make durable, never acknowledge it, never trust a retried fsync; the partitions it leads move to another
  in-sync replica, and each failed log is recovered in place (reopened, cut to its last good fsync, fetched
  again: :mod:`tidelog.broker.partitions.failed_logs`). Undone by healing the disk alone: no restart, no
  operator.
- ``eio-write-one``: one broker's writes fail with ``EIO`` until undone (healed the same way).
- ``enospc-one``: one broker's disk is full (writes that grow a file fail with ``ENOSPC``) until undone. A full
  disk refuses writes but takes nothing down: healing it is enough.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from tidelog.testing.fault_run import FaultRun
from tidelog.testing.lossy_disk import LossyDisk

__all__ = ["DISK_FAULTS", "needs_lossy_disks"]

Undo = Callable[[], Awaitable[None]]


def needs_lossy_disks(faults: Iterable[str]) -> bool:
    """Whether a run of these faults needs ``FaultRun(lossy_disks=True)``."""
    return any(fault in DISK_FAULTS for fault in faults)


def _disk(run: FaultRun, broker_id: str) -> LossyDisk:
    disk = run.disks.get(broker_id)
    if disk is None:
        raise RuntimeError("disk faults need FaultRun(lossy_disks=True)")
    return disk


def _pick(run: FaultRun, pick: float) -> str:
    ordered = sorted(b.id for b in run.cluster.brokers if b.id not in run.retired)
    return ordered[min(int(pick * len(ordered)), len(ordered) - 1)]


async def power_cut(run: FaultRun, broker_id: str) -> int:
    """SIGKILL the broker, then drop its disk's unsynced bytes (returned); it stays down."""
    await run.cluster.kill(broker_id)
    return await _disk(run, broker_id).power_loss()


async def power_loss_one(run: FaultRun, pick: float) -> tuple[str, Undo]:
    victim = _pick(run, pick)
    lost = await power_cut(run, victim)
    return f"{victim} (dropped {lost} unsynced bytes)", lambda: run.cluster.restart(victim)


async def power_loss_all(run: FaultRun, pick: float) -> tuple[str, Undo]:
    brokers = sorted(b.id for b in run.cluster.brokers if b.id not in run.retired)
    await asyncio.gather(*(run.cluster.kill(b) for b in brokers))
    lost = [await _disk(run, b).power_loss() for b in brokers]

    async def undo() -> None:
        await asyncio.gather(*(run.cluster.restart(b) for b in brokers))

    return f"all brokers (dropped {sum(lost)} unsynced bytes)", undo


def _failing(kind: str) -> Callable[[FaultRun, float], Awaitable[tuple[str, Undo]]]:
    async def fault(run: FaultRun, pick: float) -> tuple[str, Undo]:
        victim = _pick(run, pick)
        disk = _disk(run, victim)
        await disk.fail(kind)

        return victim, disk.heal

    return fault


DISK_FAULTS = {
    "power-loss-one": power_loss_one,
    "power-loss-all": power_loss_all,
    "eio-fsync-one": _failing("eio-fsync"),
    "eio-write-one": _failing("eio-write"),
    "enospc-one": _failing("enospc"),
}
