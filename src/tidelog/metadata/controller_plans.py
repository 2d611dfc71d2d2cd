"""The controller's decisions, as pure functions of a metadata snapshot: no I/O, no clock, no state.

Each plan takes what the controller knows (a :class:`~tidelog.metadata.snapshot.MetadataSnapshot`, the brokers
that asked to shut down, the broker default for unclean election) and returns the partition records it wants
written, as :class:`PartitionChange` values. The :class:`~tidelog.metadata.controller.Controller` writes each one
with a compare-and-swap on the exact old record, so a plan made from a stale view simply fails to land and is
made again from the newer one.

Terms, as in Kafka: a broker is *live* while its registration key exists (``snapshot.brokers``); it is
*eligible* to lead when it is also not shutting down. The ISR always includes the leader; leader ``""`` means
the partition is offline; ``leader_epoch`` grows by one on every change of leader, going offline included, so
that followers (and the old leader) can tell an old leader's requests from the new one's.

The invariant every plan keeps, and that makes them safe: **every ISR member holds every committed record**. A
leader only lets its high watermark pass data that all of the ISR *as stored in etcd* has, so:

- failover may elect any ISR member, and shrinks the ISR only to members that are alive (it never adds any);
- a member leaves the ISR (dead follower, controlled shutdown, AlterIsr) *before* the HW may move past data it
  lacks, never after (Rama's ordering): the leader only stops waiting for it once etcd says it is out;
- an ISR is never emptied, even when its members are all gone: the last of them still has every committed
  record, and will be elected when it returns. Only unclean election (opt-in) gives that up.

Plans:

- :func:`plan_failover`: leaders that died, and dead followers that must leave the ISR. Run on every change.
- :func:`plan_balance`: leadership back to the preferred (first) replica. Run periodically.
- :func:`plan_controlled_shutdown`: a broker's leadership and ISR memberships handed off before it exits.
- :func:`decide_alter_isr`: a leader's request to change its ISR, validated.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass
from typing import Protocol

import msgspec

from tidelog.metadata.fenced_writer import ControllerError
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey

OFFLINE = ""
"""The ``leader`` of a partition that has none."""


class ChangeReason(enum.Enum):
    """Why a plan changes a partition; logged, and asserted by tests."""

    FAILOVER = "failover"
    """The leader died; an ISR member leads now."""
    UNCLEAN = "unclean"
    """The leader and every ISR member died; a replica outside the ISR leads (opt-in; may lose records)."""
    OFFLINE = "offline"
    """The leader died and no replica may lead: the partition waits for an ISR member to come back."""
    SHRINK_ISR = "shrink-isr"
    """Followers in the ISR died and leave it; the leader stays."""
    PREFERRED = "preferred"
    """Leadership moves back to the first replica."""
    SHUTDOWN_MOVE = "shutdown-move"
    """The leader is shutting down and hands leadership to another ISR member."""
    SHUTDOWN_LEAVE = "shutdown-leave"
    """A follower that is shutting down leaves the ISR."""
    ALTER_ISR = "alter-isr"
    """The leader changed its ISR."""
    SUSPEND = "suspend"
    """The leader found evidence of lost consistency and refuses appends (:mod:`tidelog.metadata.suspension`)."""
    RESET_HEAD = "reset-head"
    """An operator confirmed the head of a suspended partition: appends resume, one leader epoch later."""
    REASSIGN = "reassign"
    """A reassignment started, completed or was cancelled (:mod:`tidelog.metadata.reassignment_plans`)."""


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """Replace ``old`` by ``new`` (same stream and id), for ``reason``."""

    old: PartitionRecord
    new: PartitionRecord
    reason: ChangeReason


@dataclass(frozen=True, slots=True)
class ShutdownPlan:
    """What a controlled shutdown of one broker can do now."""

    changes: tuple[PartitionChange, ...]
    still_leading: int
    """Partitions the broker leads after ``changes`` because no other ISR member can take over (e.g. replication
    factor 1): the broker may exit anyway, and they go offline with it."""


def _move_leader(record: PartitionRecord, leader: str, isr: Iterable[str]) -> PartitionRecord:
    """``record`` led by ``leader`` (one epoch later) with ``isr``."""
    return msgspec.structs.replace(record, leader=leader, isr=tuple(isr), leader_epoch=record.leader_epoch + 1)


def _unclean_allowed(snapshot: MetadataSnapshot, record: PartitionRecord, default: bool) -> bool:
    stream = snapshot.streams.get(record.stream)
    configured = stream.config.unclean_leader_election if stream is not None else None
    return default if configured is None else configured


def failover(record: PartitionRecord, live: Set[str], shutting_down: Set[str], unclean: bool) -> PartitionChange | None:
    """One partition's failover and dead-follower removal; None when nothing needs to change.

    A dead leader is replaced by the first replica (in ``replicas`` order, so that the preferred leader wins when
    it can) that is live, in the ISR and not shutting down; the ISR shrinks to its live members. With no live ISR
    member at all, ``unclean`` elects the first eligible replica with an ISR of itself; otherwise the partition
    goes offline with its ISR unchanged, so that whichever ISR member comes back first is elected cleanly. Going
    offline bumps the epoch (the old leader, should it be merely cut off, is fenced); staying offline does not.
    A live ISR member that is shutting down is never elected, and prevents unclean election (it has every
    committed record and will be back).

    With a live leader, dead ISR members leave the ISR, without an epoch bump. The leader's HW may then advance
    without them — but only once this change is in etcd and the leader has seen it, never before (Rama's
    ordering): a follower is out of the ISR before the HW moves past data it lacks.
    """
    if record.leader != OFFLINE and record.leader in live:
        isr = tuple(b for b in record.isr if b in live)
        if isr == record.isr or record.leader not in isr:
            return None
        return PartitionChange(record, msgspec.structs.replace(record, isr=isr), ChangeReason.SHRINK_ISR)
    live_isr = tuple(b for b in record.isr if b in live)
    clean = [b for b in record.replicas if b in live_isr and b not in shutting_down]
    if clean:
        return PartitionChange(record, _move_leader(record, clean[0], live_isr), ChangeReason.FAILOVER)
    eligible = [b for b in record.replicas if b in live and b not in shutting_down]
    if unclean and not live_isr and eligible:
        return PartitionChange(record, _move_leader(record, eligible[0], (eligible[0],)), ChangeReason.UNCLEAN)
    if record.leader == OFFLINE:
        return None
    return PartitionChange(record, _move_leader(record, OFFLINE, record.isr), ChangeReason.OFFLINE)


def plan_failover(
    snapshot: MetadataSnapshot,
    shutting_down: Set[str] = frozenset(),
    unclean_default: bool = False,
    keys: Iterable[PartitionKey] | None = None,
) -> list[PartitionChange]:
    """:func:`failover` for every partition (or those of ``keys`` that exist), in (stream, id) order; leader
    changes first, then ISR shrinks.

    Leader changes come first because they are what restores availability; a shrink only lets a live leader's
    HW move on. ``keys`` lets the controller plan only what changed since its last plan, when no broker came
    or went meanwhile (a partition's plan depends only on its record and the live brokers).
    """
    live = snapshot.brokers.keys()
    changes: list[PartitionChange] = []
    for key in sorted(snapshot.partitions if keys is None else keys):
        record = snapshot.partitions.get(key)
        if record is None:
            continue
        change = failover(record, live, shutting_down, _unclean_allowed(snapshot, record, unclean_default))
        if change is not None:
            changes.append(change)
    return sorted(changes, key=lambda c: c.reason is ChangeReason.SHRINK_ISR)  # stable: keeps key order


def plan_balance(snapshot: MetadataSnapshot, shutting_down: Set[str] = frozenset()) -> list[PartitionChange]:
    """Move leadership back to the preferred replica wherever it can take it; nothing else moves.

    Placement spread the first replicas evenly, so restoring them restores balance, and each partition whose
    leader is not its first replica costs exactly one switch: this is the fewest switches that reach the
    placement's balance (Rama's leadership balancing). The preferred replica must be live, not shutting down and
    in the ISR — a broker that just came back leads again only once it has caught up and rejoined the ISR, so
    nothing committed is lost. Partitions whose leader is dead or offline are left to :func:`plan_failover`.
    The ISR is unchanged: the old leader stays in it as a follower.
    """
    live = snapshot.brokers.keys()
    changes: list[PartitionChange] = []
    for key in sorted(snapshot.partitions):
        record = snapshot.partitions[key]
        if not record.replicas or record.leader == OFFLINE or record.leader not in live:
            continue
        preferred = record.replicas[0]
        if (
            preferred != record.leader
            and preferred in live
            and preferred in record.isr
            and preferred not in shutting_down
        ):
            changes.append(PartitionChange(record, _move_leader(record, preferred, record.isr), ChangeReason.PREFERRED))
    return changes


def plan_controlled_shutdown(
    snapshot: MetadataSnapshot, broker_id: str, shutting_down: Set[str] = frozenset()
) -> ShutdownPlan:
    """Hand off what ``broker_id`` leads, and take it out of the ISRs it follows in, before it exits.

    A partition it leads moves to the first other replica that is live, in the ISR and not shutting down (one
    epoch later, ISR without it), so producers switch over at once instead of after its lease's TTL. A
    partition it follows loses it from the ISR, so that its leader's HW (and ALL acks) stop waiting for a
    replica that is about to stop; an ISR is never emptied, and offline partitions are left alone (the broker
    may be the ISR member they wait for). The broker stays a replica everywhere and catches up when it returns.
    """
    gone = {*shutting_down, broker_id}
    live = snapshot.brokers.keys()
    changes: list[PartitionChange] = []
    still_leading = 0
    for key in sorted(snapshot.partitions):
        record = snapshot.partitions[key]
        if broker_id not in record.isr and record.leader != broker_id:
            continue
        isr = tuple(b for b in record.isr if b != broker_id)
        if record.leader == broker_id:
            successors = [b for b in record.replicas if b in isr and b in live and b not in gone]
            if successors:
                new = _move_leader(record, successors[0], isr)
                changes.append(PartitionChange(record, new, ChangeReason.SHUTDOWN_MOVE))
            else:
                still_leading += 1
        elif record.leader != OFFLINE and isr:
            new = msgspec.structs.replace(record, isr=isr)
            changes.append(PartitionChange(record, new, ChangeReason.SHUTDOWN_LEAVE))
    return ShutdownPlan(tuple(changes), still_leading)


# ---- AlterIsr ----


class AlterIsrRejection(enum.Enum):
    """Why an AlterIsr request was refused."""

    UNKNOWN_PARTITION = "unknown-partition"
    """No such partition (the stream was deleted)."""
    STALE_EPOCH = "stale-epoch"
    """The request's leader epoch is older than the partition's: another leader was elected since. The sender
    must stop acting as leader."""
    NEWER_EPOCH = "newer-epoch"
    """The request's leader epoch is newer than the controller knows: its view lags. Retriable."""
    NOT_LEADER = "not-leader"
    """The epoch matches but the sender is not the partition's leader."""
    INVALID_ISR = "invalid-isr"
    """The new ISR is empty, names a non-replica, adds a broker that is dead or shutting down, or (stepping down)
    names no live in-sync replica to lead."""
    CONFLICT = "conflict"
    """The partition kept changing under the controller's compare-and-swap. Retriable."""


class AlterIsrError(ControllerError):
    """An AlterIsr request the controller refused; nothing was written. ``reason`` says why."""

    def __init__(self, reason: AlterIsrRejection, message: str, current: PartitionRecord | None) -> None:
        super().__init__(f"alter ISR refused ({reason.value}): {message}")
        self.reason = reason
        self.current = current
        """The partition as the controller decided on it (None: it does not exist)."""

    @property
    def retriable(self) -> bool:
        """Whether the same request may succeed later (only when the controller's view lags the sender's)."""
        return self.reason in (AlterIsrRejection.NEWER_EPOCH, AlterIsrRejection.CONFLICT)


@dataclass(frozen=True, slots=True)
class AlterIsrRequest:
    """A leader asks to set the ISR of its partition. ``isr`` is the whole new set, the leader included, or
    without the leader to step down (see :func:`decide_alter_isr`)."""

    stream: str
    partition: int
    leader_id: str
    leader_epoch: int
    isr: tuple[str, ...]


class FromLeader(Protocol):
    """A request a partition's leader sends the controller about its partition (AlterIsr, a suspension)."""

    @property
    def stream(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def leader_id(self) -> str: ...
    @property
    def leader_epoch(self) -> int: ...


def check_leadership(
    record: PartitionRecord | None,
    request: FromLeader,
    sent: str,
    refuse: Callable[[str, str, PartitionRecord | None], Exception],
) -> PartitionRecord:
    """``record``, when ``request`` comes from its partition's current leader; otherwise ``refuse(kind, message,
    record)`` is raised, ``kind`` naming the rejection as the requests' rejection enums all do:
    ``UNKNOWN_PARTITION``, ``STALE_EPOCH``, ``NEWER_EPOCH`` or ``NOT_LEADER``. ``sent`` names the request in
    messages ("request", "report")."""
    name = f"{request.stream}/{request.partition}"
    leader_id, leader_epoch = request.leader_id, request.leader_epoch
    if record is None:
        raise refuse("UNKNOWN_PARTITION", f"no partition {name}", None)
    if leader_epoch < record.leader_epoch:
        raise refuse(
            "STALE_EPOCH",
            f"{name} is at leader epoch {record.leader_epoch} (leader {record.leader or 'none'}), "
            f"the {sent} is from epoch {leader_epoch}",
            record,
        )
    if leader_epoch > record.leader_epoch:
        raise refuse(
            "NEWER_EPOCH",
            f"{name}: the controller knows leader epoch {record.leader_epoch}, the {sent} is from {leader_epoch}",
            record,
        )
    if record.leader != leader_id:
        raise refuse(
            "NOT_LEADER",
            f"{name} is led by {record.leader or 'nobody'} at epoch {record.leader_epoch}, not {leader_id}",
            record,
        )
    return record


def decide_alter_isr(
    record: PartitionRecord | None,
    request: AlterIsrRequest,
    live: Set[str],
    shutting_down: Set[str] = frozenset(),
) -> PartitionRecord:
    """The record with the requested ISR (in replicas order), or :class:`AlterIsrError`.

    The leader epoch names the leadership the request was made under, so a deposed leader's shrink cannot undo
    its successor's ISR. Members the request *adds* must be live and not shutting down (Kafka's KIP-841): a
    leader working from an older view must not put back a follower the controller has just removed as dead, and
    a broker in controlled shutdown must not rejoin while it is leaving. Members it keeps are not checked: the
    failover plan removes dead ones on its own.

    **Stepping down**: an ISR without the leader (itself in the ISR), made only of current ISR members, hands the
    leadership (one epoch later) to the first of them in replicas order that is live and not shutting down, and
    leaves the old leader out of the ISR. A leader whose log lost records it cannot serve (start-up recovery
    found damage with intact data after it: :mod:`tidelog.broker.partitions.damaged`) asks this so that a replica
    holding the records leads, while it cuts its log and fetches them again as a follower. It is a clean
    election: every ISR member holds everything committed.
    """
    name = f"{request.stream}/{request.partition}"
    record = check_leadership(
        record, request, "request", lambda kind, message, found: AlterIsrError(AlterIsrRejection[kind], message, found)
    )
    wanted = set(request.isr)
    problems = []
    stepping_down = request.leader_id not in wanted and request.leader_id in record.isr
    if not wanted or (request.leader_id not in wanted and not stepping_down):
        problems.append(f"it lacks the leader {request.leader_id}")
    if strangers := sorted(wanted.difference(record.replicas)):
        problems.append(f"{', '.join(strangers)} {'is' if len(strangers) == 1 else 'are'} not a replica")
    if dead := sorted(b for b in wanted.difference(record.isr) if b not in live or b in shutting_down):
        problems.append(f"it adds {', '.join(dead)}, dead or shutting down")
    isr = tuple(b for b in record.replicas if b in wanted)
    successor = next((b for b in isr if b in live and b not in shutting_down), None)
    if stepping_down and wanted and not problems:
        if added := sorted(wanted.difference(record.isr)):
            problems.append(f"leader {request.leader_id} steps down to in-sync replicas only, not {', '.join(added)}")
        elif successor is None:
            problems.append(f"leader {request.leader_id} steps down, but no in-sync replica is live to lead")
    if problems:
        raise AlterIsrError(
            AlterIsrRejection.INVALID_ISR, f"ISR {list(request.isr)} for {name}: {'; '.join(problems)}", record
        )
    if stepping_down:
        assert successor is not None
        return _move_leader(record, successor, isr)
    return msgspec.structs.replace(record, isr=isr)
