"""Partition reassignment as pure decisions on partition records: start, complete, cancel, and where to move.

A reassignment moves a partition from its replicas ``F`` to the replicas ``T`` (Kafka's model, KIP-455). It is
recorded in the partition record itself, so it survives the controller (a new controller finds it in etcd and
carries it on) and every step is one fenced compare-and-swap:

1. **start**: ``replicas = F + (T - F)``, ``reassign_from = F``, ``reassign_to = T``. The ISR and the leader
   are unchanged. The brokers being added see themselves among the replicas and start following: they copy
   sealed segments (far-horizon catch-up), then fetch, and the leader adds each to the ISR through the usual
   AlterIsr path once it has caught up.
2. **complete**, once every broker of ``T`` is in the ISR and the leader is live: ``replicas = T``, the ISR
   without the brokers removed, and, if the leader is not in ``T``, leadership to the first broker of ``T``
   that can take it (one epoch later). The removed brokers stop their replica and delete its data.
3. **cancel**, any time before completion: ``replicas = F``, the ISR without the brokers that were being
   added; a leader among them hands leadership back to a broker of ``F``.
4. **re-target**, any time before completion (a new plan for a partition already moving, as Kafka allows):
   ``replicas = F + (T2 - F)``, ``reassign_to = T2``, ``reassign_from`` still ``F``, so a cancel afterwards
   restores exactly the record the first start found. Brokers of ``T`` that ``T2`` drops leave the replicas
   and the ISR (a leader among them hands leadership to a live in-sync replica that stays). This is the way
   out when a broker being added dies while catching up: re-target that partition to a live broker (the
   controller does it by itself once that broker is gone past ``replica_replacement_delay_ms``:
   :func:`plan_retargets`).

**Never below min-ISR.** Completion keeps every broker of ``T`` (all in the ISR, and ``T`` may not be smaller
than the stream's min-ISR), and removes only brokers that are not needed for it. Cancelling refuses to take the
ISR below min-ISR (or to nothing) when the added brokers were the ones keeping it there, and so does re-targeting
away from added brokers that are in sync. A partition whose
targets cannot all join (one is dead, or the partition has no leader) simply waits: nothing is removed.

Planning moves (:func:`replace_broker`, used by ``tidelog partition reassign --generate``, ``tidelog broker
decommission`` and the automatic replacement of dead brokers) changes one broker at a time in place, so a
partition moves as few replicas as there are brokers to leave, and the new broker is chosen rack-aware: first
from racks the partition's other replicas do not use, then the least loaded.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Set
from dataclasses import dataclass

import msgspec

from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import InvalidArgumentError

OFFLINE = ""


def adding(record: PartitionRecord) -> tuple[str, ...]:
    """The brokers a reassignment in progress adds (empty when none is)."""
    return tuple(b for b in record.reassign_to if b not in record.reassign_from)


def removing(record: PartitionRecord) -> tuple[str, ...]:
    """The brokers a reassignment in progress removes once it completes."""
    if not record.reassign_to:
        return ()
    return tuple(b for b in record.reassign_from if b not in record.reassign_to)


def min_isr_of(stream: StreamRecord | None) -> int:
    """The min-ISR a stream's leaders enforce (the partition manager's rule)."""
    if stream is None:
        return 1
    return stream.config.min_isr or max(1, stream.replication_factor - 1)


def _name(record: PartitionRecord) -> str:
    return f"{record.stream}/{record.id}"


def check_target(record: PartitionRecord, target: tuple[str, ...], live: Set[str], min_isr: int) -> None:
    """InvalidArgumentError unless ``target`` is a replica list ``record`` may be reassigned to."""
    name = _name(record)
    if not target:
        raise InvalidArgumentError(f"{name}: the new replica list is empty")
    if len(set(target)) != len(target):
        raise InvalidArgumentError(f"{name}: replicas {list(target)} name a broker twice")
    # a replica it had before any reassignment may be down for now; a broker only being added must be live
    if dead := sorted(b for b in target if b not in (record.reassign_from or record.replicas) and b not in live):
        raise InvalidArgumentError(
            f"{name}: {', '.join(dead)} {'is' if len(dead) == 1 else 'are'} not a live broker "
            f"(live: {', '.join(sorted(live)) or 'none'})"
        )
    if len(target) < min_isr:
        raise InvalidArgumentError(
            f"{name}: {len(target)} replicas would be fewer than the stream's min_isr {min_isr}; "
            "lower min_isr first (tidelog stream alter) or keep more replicas"
        )


def start(
    record: PartitionRecord,
    target: tuple[str, ...],
    throttle_bps: int = 0,
    *,
    live: Set[str] = frozenset(),
    shutting_down: Set[str] = frozenset(),
    min_isr: int = 1,
    now_ns: int = 0,
) -> PartitionRecord:
    """``record`` with a reassignment to ``target`` started (or its throttle changed, when it is the same one).

    A target equal to the replicas changes nothing. A reassignment in progress to another target is re-targeted
    (:func:`retarget`; ``live``, ``shutting_down`` and ``min_isr`` are for that). A paused partition is resumed
    (at ``now_ns``): paused, it runs in neither role, and its new replicas could never catch up."""
    if record.reassign_to:
        if record.reassign_to == target:
            return msgspec.structs.replace(record, throttle_bps=throttle_bps)
        return retarget(record, target, live, shutting_down, min_isr, throttle_bps)
    if target == record.replicas:
        return record
    added = tuple(b for b in target if b not in record.replicas)
    if record.paused:
        record = msgspec.structs.replace(record, paused=False, resume_all=False, resumed_ns=now_ns)
    return msgspec.structs.replace(
        record,
        replicas=(*record.replicas, *added),
        reassign_from=record.replicas,
        reassign_to=target,
        throttle_bps=throttle_bps,
    )


def retarget(
    record: PartitionRecord,
    target: tuple[str, ...],
    live: Set[str],
    shutting_down: Set[str] = frozenset(),
    min_isr: int = 1,
    throttle_bps: int = 0,
) -> PartitionRecord:
    """``record``, being reassigned, with its target replaced by ``target`` (the module docstring), or
    InvalidArgumentError saying why that is not safe now. A target equal to the original replicas is a cancel."""
    name = _name(record)
    original = record.reassign_from
    if target == original:
        return cancel(record, live, shutting_down, min_isr)
    replicas = (*original, *(b for b in target if b not in original))
    isr = tuple(b for b in record.isr if b in replicas)
    dropped = [b for b in record.isr if b not in replicas]
    if not isr:
        raise InvalidArgumentError(
            f"{name}: re-targeting to {list(target)} would drop every in-sync replica ({', '.join(dropped)}) "
            "and lose committed records: let the reassignment complete"
        )
    if len(isr) < min(min_isr, len(record.isr)):
        raise InvalidArgumentError(
            f"{name}: re-targeting to {list(target)} would take the ISR from {len(record.isr)} to {len(isr)} "
            f"(it drops {', '.join(dropped)}, in sync), below min_isr {min_isr}; keep "
            f"{'it' if len(dropped) == 1 else 'them'} in the new target, or let the reassignment complete"
        )
    leader, epoch = record.leader, record.leader_epoch
    if leader != OFFLINE and leader not in replicas:
        successors = [b for b in isr if b in live and b not in shutting_down]
        if not successors:
            raise InvalidArgumentError(f"{name}: no replica that stays is live and in sync to take over leadership")
        leader, epoch = successors[0], epoch + 1
    return msgspec.structs.replace(
        record,
        replicas=replicas,
        isr=isr,
        leader=leader,
        leader_epoch=epoch,
        reassign_to=target,
        throttle_bps=throttle_bps,
    )


def complete(record: PartitionRecord, live: Set[str], shutting_down: Set[str] = frozenset()) -> PartitionRecord | None:
    """``record`` with its reassignment finished, or None while it must wait (the module docstring)."""
    target = record.reassign_to
    if not target or record.leader == OFFLINE or record.leader not in live:
        return None
    if any(b not in record.isr for b in target):
        return None
    isr = tuple(b for b in target if b in record.isr)
    leader, epoch = record.leader, record.leader_epoch
    if leader not in target:
        successors = [b for b in target if b in live and b not in shutting_down]
        if not successors:
            return None
        leader, epoch = successors[0], epoch + 1
    return msgspec.structs.replace(
        record,
        replicas=target,
        isr=isr,
        leader=leader,
        leader_epoch=epoch,
        reassign_to=(),
        reassign_from=(),
        throttle_bps=0,
    )


def cancel(
    record: PartitionRecord, live: Set[str], shutting_down: Set[str] = frozenset(), min_isr: int = 1
) -> PartitionRecord:
    """``record`` with its reassignment undone: the replicas it had before, or InvalidArgumentError saying why
    that is not safe now (the module docstring)."""
    name = _name(record)
    if not record.reassign_to:
        raise InvalidArgumentError(f"{name} is not being reassigned")
    original = record.reassign_from
    isr = tuple(b for b in original if b in record.isr)
    if not isr:
        raise InvalidArgumentError(
            f"{name}: none of its original replicas {list(original)} is in sync (ISR {list(record.isr)}); "
            "cancelling would lose committed records: let the reassignment complete"
        )
    if len(isr) < min(min_isr, len(record.isr)):
        raise InvalidArgumentError(
            f"{name}: cancelling would take the ISR from {len(record.isr)} to {len(isr)}, below min_isr "
            f"{min_isr}; let the reassignment complete, or wait for the original replicas to catch up"
        )
    leader, epoch = record.leader, record.leader_epoch
    if leader != OFFLINE and leader not in original:
        successors = [b for b in isr if b in live and b not in shutting_down]
        if not successors:
            raise InvalidArgumentError(f"{name}: no original replica is live and in sync to lead again")
        leader, epoch = successors[0], epoch + 1
    return msgspec.structs.replace(
        record,
        replicas=original,
        isr=isr,
        leader=leader,
        leader_epoch=epoch,
        reassign_to=(),
        reassign_from=(),
        throttle_bps=0,
    )


# ---- progress ----


@dataclass(frozen=True, slots=True)
class Progress:
    """Where one partition's reassignment stands, for ``--verify`` and ``broker decommission``."""

    state: str
    """``complete`` (its replicas are the target), ``in-progress``, ``waiting`` (it cannot complete now; see
    ``detail``), or ``other`` (its replicas are neither the target nor moving to it)."""
    detail: str


def progress(record: PartitionRecord | None, target: tuple[str, ...], live: Set[str], min_isr: int = 1) -> Progress:
    """How far ``record`` is from having the replicas ``target``."""
    if record is None:
        return Progress("other", "no such partition")
    if not record.reassign_to:
        if record.replicas == target:
            return Progress("complete", f"replicas {','.join(target)}")
        return Progress("other", f"replicas {','.join(record.replicas)}, not being reassigned")
    if record.reassign_to != target:
        return Progress("other", f"being reassigned to {','.join(record.reassign_to)}{_instead(record, target, live)}")
    missing = [b for b in target if b not in record.isr]
    dead = [b for b in missing if b not in live]
    if record.leader == OFFLINE or record.leader not in live:
        return Progress("waiting", "no live leader")
    if dead:
        return Progress(
            "waiting",
            f"{', '.join(dead)} not running; bring it back, cancel, or --execute a plan without it (the "
            "controller does that itself once it is gone for replica_replacement_delay_ms)",
        )
    if len(record.isr) < min_isr:
        return Progress("waiting", f"below min-ISR ({len(record.isr)} in sync, min_isr {min_isr})")
    if missing:
        return Progress("in-progress", f"catching up: {', '.join(missing)}")
    return Progress("in-progress", "all in sync; completing")


def _instead(record: PartitionRecord, target: tuple[str, ...], live: Set[str]) -> str:
    """Why ``record``, being reassigned, does not go to ``target``, when the likely reason is that brokers of it
    are gone (the controller re-targets a reassignment whose target broker is gone past
    ``replica_replacement_delay_ms``; the record does not say whether it or a newer plan did)."""
    have = record.reassign_to
    gone = [b for b in target if b not in have]
    if not gone or any(b in live for b in gone):
        return ""
    return (
        f" instead; {', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not running (a target broker gone longer "
        "than replica_replacement_delay_ms is replaced by the controller); --verify the new replicas to follow it"
    )


# ---- planning moves ----


def replica_load(snapshot: MetadataSnapshot) -> dict[str, int]:
    """The replicas each broker holds (a reassignment's both sides count)."""
    load: dict[str, int] = {}
    for record in snapshot.partitions.values():
        for broker in record.replicas:
            load[broker] = load.get(broker, 0) + 1
    return load


def replace_broker(
    replicas: tuple[str, ...],
    broker: str,
    candidates: Collection[str],
    racks: Mapping[str, str],
    load: dict[str, int],
) -> tuple[str, ...] | None:
    """``replicas`` with ``broker`` replaced in place by the best of ``candidates`` (the module docstring), or
    None when no candidate fits. ``load`` is counted up for the broker chosen, so a plan spreads its moves."""
    others = [b for b in replicas if b != broker]
    used = {racks.get(b, "") for b in others}
    choices = [c for c in candidates if c not in replicas]
    if not choices:
        return None
    best = min(choices, key=lambda c: (racks.get(c, "") in used, load.get(c, 0), c))
    load[best] = load.get(best, 0) + 1
    load[broker] = load.get(broker, 0) - 1
    return tuple(best if b == broker else b for b in replicas)


def plan_off(
    snapshot: MetadataSnapshot,
    leaving: Collection[str],
    onto: Collection[str],
    *,
    streams: Collection[str] | None = None,
    load: dict[str, int] | None = None,
) -> tuple[list[tuple[PartitionRecord, tuple[str, ...]]], list[tuple[PartitionRecord, str]]]:
    """Targets that take every replica off the brokers ``leaving``, onto brokers of ``onto``: the moves
    ``(record, target)``, and the partitions that cannot move now with the reason (no broker left to take the
    replica, or a reassignment already in progress). ``streams`` limits the plan to those streams; ``load``
    (:func:`replica_load` by default) is counted up for the brokers chosen."""
    racks = {b: r.rack for b, r in snapshot.brokers.items()}
    load = replica_load(snapshot) if load is None else load
    gone = set(leaving)
    candidates = sorted(b for b in onto if b not in gone)
    moves: list[tuple[PartitionRecord, tuple[str, ...]]] = []
    stuck: list[tuple[PartitionRecord, str]] = []
    for key in sorted(snapshot.partitions):
        record = snapshot.partitions[key]
        if streams is not None and record.stream not in streams:
            continue
        if not gone.intersection(record.replicas):
            continue
        if record.reassign_to:
            if gone.intersection(record.reassign_to):
                stuck.append((record, f"being reassigned to {','.join(record.reassign_to)}"))
            continue
        target: tuple[str, ...] | None = record.replicas
        for broker in [b for b in record.replicas if b in gone]:
            assert target is not None
            target = replace_broker(target, broker, candidates, racks, load)
            if target is None:
                stuck.append((record, f"no other broker can take its replica on {broker}"))
                break
        if target is not None:
            moves.append((record, target))
    return moves, stuck


def plan_retargets(
    snapshot: MetadataSnapshot,
    gone: Collection[str],
    onto: Collection[str],
    load: dict[str, int] | None = None,
) -> tuple[list[tuple[PartitionRecord, tuple[str, ...]]], list[tuple[PartitionRecord, str]]]:
    """New targets for the reassignments in progress whose target names a broker of ``gone``: each such broker
    replaced in place by a broker of ``onto``, chosen as :func:`plan_off` chooses (rack-aware, then least
    loaded; ``load`` is counted up). Never by a broker the partition already has: not one the reassignment
    removes (that would undo a decommission), nor one of its target. The re-targets ``(record, target)`` (to
    write with :func:`start`, which refuses one below min-ISR), and the partitions no broker can serve, with
    the reason."""
    racks = {b: r.rack for b, r in snapshot.brokers.items()}
    load = replica_load(snapshot) if load is None else load
    dead = set(gone)
    moves: list[tuple[PartitionRecord, tuple[str, ...]]] = []
    stuck: list[tuple[PartitionRecord, str]] = []
    for key in sorted(snapshot.partitions):
        record = snapshot.partitions[key]
        if not dead.intersection(record.reassign_to):
            continue
        candidates = sorted(b for b in onto if b not in dead and b not in record.replicas)
        target: tuple[str, ...] | None = record.reassign_to
        for broker in [b for b in record.reassign_to if b in dead]:
            assert target is not None
            target = replace_broker(target, broker, candidates, racks, load)
            if target is None:
                stuck.append((record, f"no other live broker can take the place of {broker} in its target"))
                break
        if target is not None:
            moves.append((record, target))
    return moves, stuck
