"""The controller's reassignments: started on request, carried to completion, and started on their own for
brokers that are gone for good.

A :class:`Reassigner` sits beside the :class:`~tidelog.metadata.controller.Controller` (a term task and a mirror
listener: the controller itself only hands out its writer). Its decisions are the pure functions of
:mod:`tidelog.metadata.reassignment_plans`; every write is a fenced compare-and-swap of one partition record
(:class:`~tidelog.metadata.partition_writes.PartitionWrites`), so a deposed controller writes nothing and a
decision made on a stale view is made again.

- **Requests** (:meth:`Reassigner.execute`, :meth:`Reassigner.cancel`, :meth:`Reassigner.decommission`) start,
  re-target or undo reassignments, each partition decided on the newest record.
- **Completion**: on every metadata change during a term, each partition whose reassignment can complete
  (every target in the ISR) gets its final record. A new controller finds the reassignments in etcd and goes
  on with them: nothing of a reassignment lives only in a controller's memory.
- **Automatic replacement**: a broker that still holds replicas but has been gone (no registration key) for
  ``replacement_delay`` seconds has each of its replicas reassigned to a live broker (rack-aware, least
  loaded; :func:`~tidelog.metadata.reassignment_plans.plan_off`). The time is counted from when this
  controller saw it gone, so a new controller waits a full delay again: replacing later is safe, replacing a
  broker that is merely restarting copies data for nothing. A delay of 0 turns it off.

  A partition already being reassigned is not moved again: when its *target* names a broker gone that long
  (one being added died while catching up, and will not come back), the reassignment is re-targeted instead,
  that broker replaced in the target by a live one chosen the same way
  (:func:`~tidelog.metadata.reassignment_plans.plan_retargets`), through the path of a new plan
  (:func:`~tidelog.metadata.reassignment_plans.retarget`): ``reassign_from`` kept, so a cancel still restores
  the record the reassignment started from, and refused (logged, tried again on the next change) when it would
  take the ISR below min-ISR. Without it such a reassignment waits for an operator forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.clock import Clock, SystemClock
from tidelog.metadata import reassignment_plans as plans
from tidelog.metadata.controller_plans import ChangeReason, PartitionChange
from tidelog.metadata.fenced_writer import ControllerFencedError, FencedWriter
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.partition_writes import PartitionWrites
from tidelog.metadata.records import Keys, PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import InvalidArgumentError, UnavailableError, UnknownPartitionError

if TYPE_CHECKING:
    from tidelog.metadata.controller import Controller

log = logging.getLogger(__name__)

_CATCH_UP = 10.0
"""Seconds a request waits for this broker's mirror to show the brokers registered in etcd."""


@dataclass(frozen=True, slots=True)
class Move:
    """One partition's reassignment as a request made it: the replicas before and after the request."""

    stream: str
    partition: int
    before: tuple[str, ...]
    after: tuple[str, ...]
    note: str = ""
    """Why a partition did not move (decommission: it cannot now), empty when it did."""


class Reassigner:
    """Reassignment requests, completion and automatic replacement (the module docstring)."""

    def __init__(
        self,
        controller: Controller,
        client: Any,
        keys: Keys,
        mirror: MetadataMirror,
        *,
        replacement_delay: float = 600.0,
        clock: Clock | None = None,
        write_concurrency: int = 32,
        tick: float = 1.0,
    ) -> None:
        """``replacement_delay``: seconds a broker must be gone before its replicas are replaced (0: never);
        ``tick``: how often gone brokers are looked at when nothing else changes."""
        self._tick = tick
        self._controller = controller
        self._writes = PartitionWrites(client, keys, controller.broker_id, concurrency=write_concurrency)
        self._mirror = mirror
        self._latest = mirror.snapshot  # the newest snapshot the mirror announced (ahead of mirror.snapshot)
        self._delay = replacement_delay
        self._clock = clock or SystemClock()
        self._dirty = asyncio.Event()
        self._gone_since: dict[str, float] = {}  # broker → monotonic time this term first saw it gone
        self._looked_at: MetadataSnapshot | None = None  # the snapshot _gone_since was computed from
        self._planned: tuple[MetadataSnapshot, set[str]] | None = None  # what the last replacement plan saw
        self._completed: tuple[MetadataSnapshot, frozenset[str]] | None = None  # what the last _complete scanned
        mirror.add_listener(self._on_change)
        controller.add_term_task("reassignment", self.run)

    # ---- requests ----

    async def execute(self, targets: Sequence[tuple[str, int, tuple[str, ...]]], throttle_bps: int = 0) -> list[Move]:
        """Start reassigning each ``(stream, partition, replicas)``; the replicas before and after, in order.
        A partition already being reassigned elsewhere is re-targeted (:func:`~.reassignment_plans.retarget`).

        Every target is checked before anything is written, so a plan with one bad entry changes nothing."""
        writer = self._controller.current_writer()
        if any(b not in self._latest.brokers for _, _, target in targets for b in target):
            await self._mirror.with_registrations(_CATCH_UP)  # registered a moment ago, or not live at all
        snap = self._latest
        live = snap.brokers.keys()
        for stream, pid, target in targets:
            record = snap.partition(stream, pid)
            if record is None:
                raise UnknownPartitionError(f"no partition {stream}/{pid}")
            plans.check_target(record, target, live, plans.min_isr_of(snap.stream(stream)))
            self._started(record, target, throttle_bps)  # raises when it is refused (a re-target below min-ISR)
        moves = []
        for stream, pid, target in targets:
            old, new = await self._decide(
                writer, stream, pid, lambda r, t=target: self._started(r, t, throttle_bps), "reassignment"
            )
            # before: the replicas it had before any reassignment, the plan that moves it back
            moves.append(Move(stream, pid, old.reassign_from or old.replicas, new.reassign_to or new.replicas))
        self._dirty.set()
        return moves

    def _started(self, record: PartitionRecord, target: tuple[str, ...], throttle_bps: int) -> PartitionRecord:
        """``record`` reassigned to ``target`` (started, re-targeted, or only its throttle changed)."""
        snap = self._latest
        return plans.start(
            record,
            target,
            throttle_bps,
            live=snap.brokers.keys(),
            shutting_down=self._controller.shutting_down,
            min_isr=plans.min_isr_of(snap.stream(record.stream)),
            now_ns=self._clock.now_ns(),
        )

    async def cancel(self, partitions: Sequence[tuple[str, int]]) -> list[Move]:
        """Undo the reassignments of ``partitions``; the replicas before and after (a partition not being
        reassigned is refused by name)."""
        writer = self._controller.current_writer()

        def undo(record: PartitionRecord) -> PartitionRecord:
            snap = self._latest
            min_isr = plans.min_isr_of(snap.stream(record.stream))
            return plans.cancel(record, snap.brokers.keys(), self._controller.shutting_down, min_isr)

        moves = []
        for stream, pid in partitions:
            old, new = await self._decide(writer, stream, pid, undo, "cancel")
            moves.append(Move(stream, pid, old.replicas, new.replicas))
        return moves

    async def decommission(self, broker: str, throttle_bps: int = 0) -> list[Move]:
        """Start moving every replica off ``broker`` (the fewest moves: each partition changes that one
        replica); one :class:`Move` per partition it holds, ``note`` saying why one cannot move now."""
        writer = self._controller.current_writer()
        await self._mirror.with_registrations(_CATCH_UP)  # every live broker may take a replica
        snap = self._latest
        if broker not in snap.brokers and not any(broker in p.replicas for p in snap.partitions.values()):
            raise InvalidArgumentError(f"no broker {broker!r} is live or holds replicas")
        onto = [b for b in snap.brokers if b not in self._controller.shutting_down]
        planned, stuck = plans.plan_off(snap, [broker], onto)
        moves: list[Move] = []
        for record, target in planned:
            old, new = await self._decide(
                writer,
                record.stream,
                record.id,
                lambda r, t=target: plans.start(r, t, throttle_bps, now_ns=self._clock.now_ns()),
                "decommission",
            )
            moves.append(Move(record.stream, record.id, old.replicas, new.reassign_to or new.replicas))
        moves += [Move(r.stream, r.id, r.replicas, r.replicas, note) for r, note in stuck]
        for record in snap.partitions.values():  # already moving off it (an earlier decommission)
            if broker in plans.removing(record):
                moves.append(Move(record.stream, record.id, record.reassign_from, record.reassign_to))
        self._dirty.set()
        log.info(
            "controller %s: decommissioning %s: %d partitions to move", self._controller.broker_id, broker, len(moves)
        )
        return sorted(moves, key=lambda m: (m.stream, m.partition))

    async def _decide(
        self, writer: FencedWriter, stream: str, pid: int, decide: Any, what: str
    ) -> tuple[PartitionRecord, PartitionRecord]:
        async def decided(record: PartitionRecord | None) -> PartitionRecord:
            if record is None:
                raise UnknownPartitionError(f"no partition {stream}/{pid}")
            new: PartitionRecord = decide(record)
            return new

        def conflict(_: PartitionRecord | None) -> Exception:
            return UnavailableError(f"{stream}/{pid} kept changing; try the {what} again")

        old, new = await self._writes.write_decided(
            writer,
            stream,
            pid,
            self._latest.partition(stream, pid),
            decided,
            InvalidArgumentError,  # type: ignore[arg-type]  # refusals are the client's own errors here
            conflict,  # type: ignore[arg-type]
        )
        if new != old:
            log.info(
                "controller %s: %s/%d %s: replicas %s → %s",
                self._controller.broker_id,
                stream,
                pid,
                what,
                list(old.replicas),
                list(new.reassign_to or new.replicas),
            )
        return old, new

    # ---- the term task ----

    async def run(self, writer: FencedWriter) -> None:
        """Complete reassignments and replace gone brokers while the term lasts (a controller term task)."""
        self._gone_since.clear()
        self._looked_at = self._planned = None
        self._completed = None
        self._dirty.set()
        while True:
            try:
                async with asyncio.timeout(self._tick if self._delay > 0 else None):
                    await self._dirty.wait()
            except TimeoutError:
                pass
            self._dirty.clear()
            try:
                await self._complete(writer)
                await self._replace(writer)
            except ControllerFencedError:
                return
            except Exception as error:
                log.warning("controller: reassignment step failed (%s); retrying", error)
                self._completed = None
                self._dirty.set()
                await self._clock.sleep(self._tick)

    async def _complete(self, writer: FencedWriter) -> None:
        snap = self._latest
        live, leaving = snap.brokers.keys(), self._controller.shutting_down
        if self._completed is not None and self._completed[0] is snap and self._completed[1] == leaving:
            return  # the scan is over every partition: only when something changed (not at every idle tick)
        self._completed = (snap, leaving)
        changes = []
        for record in snap.partitions.values():
            new = plans.complete(record, live, leaving)
            if new is not None:
                changes.append(PartitionChange(record, new, ChangeReason.REASSIGN))
        landed = await self._writes.apply(writer, changes)
        for change, ok in zip(changes, landed, strict=True):
            if ok:
                log.info(
                    "controller %s: %s/%d reassigned: replicas %s → %s, leader %s",
                    self._controller.broker_id,
                    change.old.stream,
                    change.old.id,
                    list(change.old.reassign_from),
                    list(change.new.replicas),
                    change.new.leader,
                )

    async def _replace(self, writer: FencedWriter) -> None:
        if self._delay <= 0:
            return
        snap = self._latest
        now = self._clock.monotonic_ns() / 1e9
        if snap is not self._looked_at:  # the scan is over every partition: only when something changed
            holding = {b for p in snap.partitions.values() for b in p.replicas}
            gone = holding - snap.brokers.keys()
            self._gone_since = {b: self._gone_since.get(b, now) for b in gone}
            self._looked_at = snap
        due = [b for b, since in self._gone_since.items() if now - since >= self._delay]
        last = self._planned
        if not due or not snap.brokers or (last is not None and last[0] is snap and last[1] == set(due)):
            return
        onto = [b for b in snap.brokers if b not in self._controller.shutting_down]
        load = plans.replica_load(snap)
        planned, _ = plans.plan_off(snap, due, onto, load=load)
        wall_ns = self._clock.now_ns()
        changes = [PartitionChange(r, plans.start(r, t, now_ns=wall_ns), ChangeReason.REASSIGN) for r, t in planned]
        changes += self._retargets(snap, due, onto, load)
        landed = await self._writes.apply(writer, changes)
        self._planned = (snap, set(due))  # planned again only when the metadata or the brokers due change
        for change, ok in zip(changes, landed, strict=True):
            if ok:
                log.warning(
                    "controller %s: %s/%d: replacing replicas of %s (gone for %.0fs): %s → %s",
                    self._controller.broker_id,
                    change.old.stream,
                    change.old.id,
                    ", ".join(b for b in due if b in change.old.replicas),
                    self._delay,
                    list(change.old.reassign_to or change.old.replicas),
                    list(change.new.reassign_to),
                )

    def _retargets(
        self, snap: MetadataSnapshot, due: Sequence[str], onto: Sequence[str], load: dict[str, int]
    ) -> list[PartitionChange]:
        """Reassignments in progress whose target names a broker of ``due``, re-targeted to live brokers (the
        path of a new plan: ``reassign_from`` kept, never below min-ISR); one that cannot be now is logged and
        planned again on the next change."""
        retargets, stuck = plans.plan_retargets(snap, due, onto, load)
        changes = []
        for record, target in retargets:
            try:
                new = self._started(record, target, record.throttle_bps)
            except InvalidArgumentError as refused:
                stuck.append((record, str(refused)))
                continue
            changes.append(PartitionChange(record, new, ChangeReason.REASSIGN))
        for record, why in stuck:
            log.warning(
                "controller %s: %s/%d is being reassigned to %s, which names a broker gone past the replacement "
                "delay, and cannot be re-targeted now: %s",
                self._controller.broker_id,
                record.stream,
                record.id,
                list(record.reassign_to),
                why,
            )
        return changes

    async def _on_change(self, old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        self._latest = new
        if old.brokers != new.brokers or old.partitions != new.partitions:
            self._dirty.set()
