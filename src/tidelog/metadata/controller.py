"""The controller: the one broker (elected through etcd) that fails over, balances and changes partitions.

While this broker's :class:`~tidelog.metadata.controller_election.ControllerElection` holds a term, the
:class:`Controller` runs two tasks:

- **reconcile**: on election and after every mirror change to brokers or partitions, it runs
  :func:`~tidelog.metadata.controller_plans.plan_failover` (dead leaders replaced from the ISR, dead followers
  out of the ISR) and writes the result. Changes arrive in bursts (a stream's creation is one watch event per
  partition), so the task only gathers the changed partitions and plans once per wake-up, on the newest
  snapshot: over those partitions only, or over all of them when a broker came or went (or on election).
- **balance**: every ``balance_interval`` seconds, after an initial delay that lets a returning broker catch up
  and rejoin the ISR first, it runs :func:`~tidelog.metadata.controller_plans.plan_balance`.

and answers the broker's requests (each raises :class:`NotControllerError` unless this broker is the
controller, so that the caller forwards them): :meth:`Controller.alter_isr`,
:meth:`Controller.controlled_shutdown`, :meth:`Controller.report_unreachable`, the fail-to-safety pair
:meth:`Controller.suspend_partition` and :meth:`Controller.reset_head`, and the stream writes
:meth:`Controller.create_stream`, :meth:`Controller.delete_stream`, :meth:`Controller.update_partition`,
:meth:`Controller.add_partitions` and :meth:`Controller.alter_stream`; :meth:`Controller.balance_now` runs the
balance at once (``tidelog cluster rebalance``).

**Every write is fenced and a compare-and-swap.** Partitions are written in
:class:`~tidelog.metadata.fenced_writer.FencedWriter` transactions that also compare each partition key with the
exact record the plan started from (many partitions to a transaction: a failover of hundreds is a few). The fence
makes etcd refuse a deposed controller's writes, whatever it believes (a write refused that way ends the term: the
election steps down and calls :meth:`on_deposed`); the compare makes a plan made from a stale view (the mirror lags
etcd) fail instead of overwriting a newer record — the mirror then delivers the newer record and the plan is made
again from it. Nothing here trusts timing. Those writes are
:class:`~tidelog.metadata.partition_writes.PartitionWrites`; a broker reported unreachable is checked by
:func:`~tidelog.metadata.broker_probe.probe_and_revoke`.

**Errors.** A fenced write ends the task that made it quietly. Any other etcd error is logged and the work is
tried again after a backoff that doubles up to ``retry_max`` (or at the next tick, for balancing): no busy loop.

**Shutting-down brokers** (see :meth:`Controller.controlled_shutdown`) are kept in memory only: the set is
emptied when the term ends, and a broker leaves it when its registration key disappears or is rewritten (it
exited, or came back). A broker in controlled shutdown that meets a new controller simply asks it again.

**Wiring.** The constructor registers the controller as a listener of the mirror. The election and the
controller refer to each other (the election calls the controller back; the controller's writers report
refusals to the election), so the broker builds the controller first, passes :meth:`Controller.on_elected` and
:meth:`Controller.on_deposed` to the election's constructor, then calls :meth:`Controller.attach` with the
election before starting it; on shutdown it stops the election (which calls ``on_deposed``), then
:meth:`Controller.stop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from tidelog.clock import Clock, SystemClock
from tidelog.metadata.broker_probe import ProbeOutcome, probe_and_revoke
from tidelog.metadata.controller_election import ControllerElection, DeposedReason
from tidelog.metadata.controller_plans import (
    AlterIsrError,
    AlterIsrRejection,
    AlterIsrRequest,
    ChangeReason,
    PartitionChange,
    decide_alter_isr,
    plan_balance,
    plan_controlled_shutdown,
    plan_failover,
)
from tidelog.metadata.fenced_writer import (
    ControllerFencedError,
    ControllerTerm,
    FencedWriter,
    NotControllerError,
)
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.partition_writes import PartitionWrites
from tidelog.metadata.records import (
    Keys,
    PartitionRecord,
    StreamRecord,
)
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey, changed_partitions
from tidelog.metadata.stream_changes import ChangeOutcome, StreamChanges
from tidelog.metadata.stream_creation import CHUNK_PARTITIONS, CreateOutcome, StreamCreation
from tidelog.metadata.suspension import (
    HeadRejection,
    LeaderBounds,
    SuspendRequest,
    SuspensionError,
    check_leader,
    decide_reset_head,
    decide_suspend,
)

log = logging.getLogger(__name__)

TermTask = Callable[[FencedWriter], Coroutine[Any, Any, None]]
"""Work done while this broker is the controller, with the term's fenced writer."""


class Controller:
    """This broker's controller duties, active only while its election holds a term."""

    def __init__(
        self,
        broker_id: str,
        client: Any,
        keys: Keys,
        mirror: MetadataMirror,
        election: ControllerElection | None = None,
        *,
        unclean_default: bool = False,
        balance_interval: float = 30.0,
        balance_initial_delay: float | None = None,
        retry_initial: float = 0.1,
        retry_max: float = 5.0,
        probe_timeout: float = 0.5,
        write_concurrency: int = 32,
        create_chunk: int = CHUNK_PARTITIONS,
        clock: Clock | None = None,
    ) -> None:
        """``election`` may be given later through :meth:`attach` (see the module docstring);
        ``unclean_default`` is the broker default for streams that do not set ``unclean_leader_election``;
        ``balance_initial_delay`` defaults to ``balance_interval``; ``write_concurrency`` bounds the partition
        transactions in flight at once (a failover of many partitions should not take one round trip each);
        ``create_chunk`` the partitions a stream creation writes per transaction."""
        self.broker_id = broker_id
        self._client = client
        self._keys = keys
        self._election = election
        self._unclean_default = unclean_default
        self._balance_interval = balance_interval
        self._balance_delay = balance_interval if balance_initial_delay is None else balance_initial_delay
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._probe_timeout = probe_timeout
        self._writes = PartitionWrites(client, keys, broker_id, concurrency=write_concurrency)
        self._create_chunk = create_chunk
        self._clock = clock or SystemClock()
        self._latest = mirror.snapshot  # the newest snapshot the mirror has announced (ahead of mirror.snapshot)
        self._shutting_down: set[str] = set()
        self._term: ControllerTerm | None = None  # from on_elected to on_deposed
        self._writer: FencedWriter | None = None  # the writer of _term
        self._dirty = asyncio.Event()  # the reconcile task has something new to look at
        self._replan: set[PartitionKey] = set()  # ... these partitions changed since its last plan
        self._replan_all = True  # ... or everything may have (a broker came or went, a whole read, a new term)
        self._tasks: list[asyncio.Task[None]] = []
        self._probes: dict[str, asyncio.Task[ProbeOutcome]] = {}  # in flight, so reports of one death share one
        self._changed = asyncio.Event()  # replaced whenever `active` may have changed; see wait_for
        self._term_tasks: list[tuple[str, TermTask]] = []
        mirror.add_listener(self._on_change)

    def attach(self, election: ControllerElection) -> None:
        """Bind the election whose terms this controller serves (when it was not given to the constructor)."""
        if self._election is not None and self._election is not election:
            raise RuntimeError(f"the controller of {self.broker_id} already serves another election")
        self._election = election

    def add_term_task(self, name: str, task: TermTask) -> None:
        """Run ``task(writer)`` through every term from the next election on, beside the controller's own tasks
        (the activity feed, :mod:`tidelog.metadata.activity_feed`); it is cancelled when the term ends."""
        self._term_tasks.append((name, task))

    # ---- views ----

    @property
    def active(self) -> bool:
        """Whether this broker is the controller now (its writes are fenced whatever this says)."""
        election = self._election
        return self._term is not None and election is not None and election.term_is_current(self._term)

    @property
    def shutting_down(self) -> frozenset[str]:
        """Brokers in controlled shutdown, as far as this controller knows."""
        return frozenset(self._shutting_down)

    async def wait_for(self, predicate: Callable[[Controller], bool], timeout: float | None = None) -> Controller:
        """Wait until ``predicate(self)`` holds, e.g. ``lambda c: c.active``: the election's ``is_controller``
        turns true before :meth:`on_elected` has run, this only after."""
        async with asyncio.timeout(timeout):
            while not predicate(self):
                await self._changed.wait()
        return self

    # ---- the election's callbacks ----

    async def on_elected(self, term: ControllerTerm) -> None:
        """Start the controller's tasks for ``term``. Pass to the election as ``on_elected``."""
        if self._election is None:
            raise RuntimeError(f"the controller of {self.broker_id} was elected before attach()")
        await self._stop_tasks()
        self._term = term
        writer = FencedWriter(self._client, self._keys, term, owner=self._election)
        self._writer = writer
        self._shutting_down.clear()
        self._replan_all = True
        self._dirty.set()
        self._tasks = [
            asyncio.create_task(self._reconcile_loop(writer), name=f"controller-reconcile-{term.epoch}"),
            asyncio.create_task(self._balance_loop(writer), name=f"controller-balance-{term.epoch}"),
            asyncio.create_task(self._clean_creations(writer), name=f"controller-creations-{term.epoch}"),
            *(
                asyncio.create_task(task(writer), name=f"controller-{name}-{term.epoch}")
                for name, task in self._term_tasks
            ),
        ]
        self._notify()
        log.info("controller %s: active for epoch %d", self.broker_id, term.epoch)

    async def on_deposed(self, term: ControllerTerm, reason: DeposedReason) -> None:
        """Stop the controller's tasks. Pass to the election as ``on_deposed``."""
        if self._term != term:
            return
        await self.stop()
        log.info("controller %s: inactive, epoch %d ended (%s)", self.broker_id, term.epoch, reason.value)

    async def stop(self) -> None:
        """Stop all work and forget the term (for broker shutdown; :meth:`on_deposed` does the same)."""
        self._term, self._writer = None, None
        self._shutting_down.clear()
        self._notify()
        await self._stop_tasks()

    # ---- requests from brokers ----

    async def alter_isr(
        self, stream: str, partition: int, leader_id: str, leader_epoch: int, isr: Sequence[str]
    ) -> PartitionRecord:
        """Set a partition's ISR at its leader's request; returns the record as written.

        Raises :class:`~tidelog.metadata.controller_plans.AlterIsrError` with the precise reason (see
        :func:`~tidelog.metadata.controller_plans.decide_alter_isr`). A rejection is only final once checked
        against etcd itself: the mirror may lag the sender's view (a leader elected a moment ago).
        """
        writer = self._current_writer()
        request = AlterIsrRequest(stream, partition, leader_id, leader_epoch, tuple(isr))

        async def decide(record: PartitionRecord | None) -> PartitionRecord:
            return decide_alter_isr(record, request, self._latest.brokers.keys(), self._shutting_down)

        def conflict(record: PartitionRecord | None) -> AlterIsrError:
            return AlterIsrError(AlterIsrRejection.CONFLICT, f"{stream}/{partition} kept changing", record)

        old, new = await self._writes.write_decided(
            writer, stream, partition, self._latest.partition(stream, partition), decide, AlterIsrError, conflict
        )
        if new != old:
            self._writes.log_change(PartitionChange(old, new, ChangeReason.ALTER_ISR))
        return new

    async def suspend_partition(
        self, stream: str, partition: int, leader_id: str, leader_epoch: int, reason: str
    ) -> PartitionRecord:
        """Record that the leader of ``leader_epoch`` suspended appends on ``reason`` (fail to safety); returns
        the record as written. Raises :class:`~tidelog.metadata.suspension.SuspensionError` (see
        :func:`~tidelog.metadata.suspension.decide_suspend`)."""
        writer = self._current_writer()
        request = SuspendRequest(stream, partition, leader_id, leader_epoch, reason)

        async def decide(record: PartitionRecord | None) -> PartitionRecord:
            return decide_suspend(record, request, self._clock.now_ns())

        conflict = _head_conflict(stream, partition)
        old, new = await self._writes.write_decided(
            writer, stream, partition, self._latest.partition(stream, partition), decide, SuspensionError, conflict
        )
        if new != old:
            log.warning("controller %s: %s/%d suspended: %s", self.broker_id, stream, partition, new.suspended)
        return new

    async def reset_head(
        self,
        stream: str,
        partition: int,
        offset: int | None,
        bounds_of: Callable[[PartitionRecord], Awaitable[LeaderBounds]],
    ) -> tuple[PartitionRecord, PartitionRecord, LeaderBounds]:
        """Confirm the head of a suspended partition: ``offset``, or the leader's log end when None. Returns the
        record before and after, and the bounds the leader reported (asked with ``bounds_of``, each attempt).

        The new record clears the suspension, bumps the leader epoch and names the head for it; the leader cuts
        its log there before taking appends (:mod:`tidelog.broker.partitions.safety`). Raises
        :class:`~tidelog.metadata.suspension.SuspensionError` (see
        :func:`~tidelog.metadata.suspension.decide_reset_head`).
        """
        writer = self._current_writer()
        name = f"{stream}/{partition}"
        seen: list[LeaderBounds] = []

        async def decide(record: PartitionRecord | None) -> PartitionRecord:
            current = check_leader(record, name, self._latest.brokers.keys())
            bounds = await bounds_of(current)
            seen.append(bounds)
            return decide_reset_head(current, bounds, offset)

        conflict = _head_conflict(stream, partition)
        old, new = await self._writes.write_decided(
            writer, stream, partition, self._latest.partition(stream, partition), decide, SuspensionError, conflict
        )
        log.warning(
            "controller %s: %s head confirmed at %d (leader %s, epoch %d→%d); it was suspended: %s",
            self.broker_id,
            name,
            new.head_offset,
            new.leader,
            old.leader_epoch,
            new.leader_epoch,
            old.suspended or seen[-1].suspended,
        )
        return old, new, seen[-1]

    async def controlled_shutdown(self, broker_id: str) -> int:
        """Hand off ``broker_id``'s leaderships and take it out of ISRs; return how many it still leads.

        The broker calls this on SIGTERM, again until it returns 0 (or its shutdown timeout runs out), then exits.
        From the first call on, the broker is not elected anywhere and cannot rejoin an ISR, until its
        registration key disappears or changes. A partition whose hand-off lost a race counts as still led: the
        next call retries it from fresher metadata.
        """
        writer = self._current_writer()
        self._shutting_down.add(broker_id)
        plan = plan_controlled_shutdown(self._latest, broker_id, self._shutting_down)
        landed = await self._writes.apply(writer, plan.changes)
        missed = sum(
            1
            for change, ok in zip(plan.changes, landed, strict=True)
            if not ok and change.reason is ChangeReason.SHUTDOWN_MOVE
        )
        return plan.still_leading + missed

    async def create_stream(self, stream: StreamRecord, partitions: Sequence[PartitionRecord]) -> CreateOutcome:
        """Create ``stream`` and its partitions, fenced, unless the name is taken: in transactions of at most
        ``create_chunk`` partitions, visible whole at once (:mod:`tidelog.metadata.stream_creation`).

        Creating a stream that exists on the same subject is idempotent (``SAME_EXISTS``), on another subject a
        conflict; ``IN_PROGRESS`` while another creation of the name is under way.
        """
        return await self._creation(self._current_writer()).create(stream, partitions)

    async def delete_stream(self, name: str) -> bool:
        """Delete a stream and its partitions in one fenced transaction (two operations, a key and a range, however
        many partitions); False when there was no such stream."""
        writer = self._current_writer()
        tx = self._client.transactions
        key = self._keys.stream(name)
        prefix = self._keys.partitions_of(name)
        result = await writer.transaction(
            compare=[tx.version(key) > 0],
            success=[tx.delete(key), tx.delete(prefix, range_end=_prefix_end(prefix))],
        )
        return result.committed

    async def update_partition(self, old: PartitionRecord, new: PartitionRecord) -> bool:
        """Replace ``old`` with ``new`` (pause, resume, read-only) only if etcd still holds ``old``."""
        written, _ = await self._writes.cas(self._current_writer(), self._keys.partition(old.stream, old.id), old, new)
        return written

    async def add_partitions(
        self, old: StreamRecord, new: StreamRecord, partitions: Sequence[PartitionRecord]
    ) -> ChangeOutcome:
        """Give stream ``old`` the new ``partitions`` and its record ``new``, fenced, while etcd holds ``old``
        (:mod:`tidelog.metadata.stream_changes`: the new partitions show all at once)."""
        return await self._changes(self._current_writer()).add_partitions(old, new, partitions)

    async def alter_stream(self, old: StreamRecord, new: StreamRecord) -> ChangeOutcome:
        """Replace stream record ``old`` with ``new`` (other settings), fenced, while etcd holds ``old``."""
        return await self._changes(self._current_writer()).alter(old, new)

    async def report_unreachable(self, reporter_id: str, broker_id: str) -> ProbeOutcome:
        """A follower could not connect to ``broker_id`` (its leader): check, and if it is gone, say so at once.

        The controller connects to the broker's advertised wire port itself. Only a *refused* connection counts:
        it means no process listens on that port, so the broker that registered it is not running (a crashed or
        killed broker; its lease would otherwise stay until its TTL runs out). A timeout proves nothing — a
        paused (SIGSTOPped) process still has its socket and the kernel still completes connects to it; neither
        does one follower's view, which is why the reporter is not believed. Revoking the lease deletes the
        registration key, which starts failover exactly as the lease's expiry would, only sooner. It is safe
        even if the judgement were wrong: a broker that is in fact alive notices its lease is gone and registers
        again with a new one (``MetadataStore._keep_alive``), and failover only ever elects ISR members. The
        lease revoked is the one the probed registration holds (read back and compared first), so a broker that
        re-registered meanwhile keeps its new lease. Concurrent reports about one broker share one probe.
        """
        self._current_writer()
        probe = self._probes.get(broker_id)
        if probe is None:
            record = self._latest.brokers.get(broker_id)
            probe = asyncio.create_task(
                probe_and_revoke(self._client, self._keys, broker_id, record, self._probe_timeout, self.broker_id),
                name=f"controller-probe-{broker_id}",
            )
            self._probes[broker_id] = probe
            probe.add_done_callback(lambda _: self._probes.pop(broker_id, None))
        outcome = await asyncio.shield(probe)
        log.info("controller %s: %s reported %s unreachable: %s", self.broker_id, reporter_id, broker_id, outcome.value)
        return outcome

    async def balance_now(self) -> int:
        """Run the leadership balance once, now (preferred-leader election, ``tidelog cluster rebalance``);
        returns how many leaderships moved."""
        writer = self._current_writer()
        changes = plan_balance(self._latest, self._shutting_down)
        return sum(await self._writes.apply(writer, changes))

    # ---- tasks ----

    async def _on_change(self, old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        """Mirror listener: remember the snapshot, wake the reconcile task. Must not block the mirror."""
        self._latest = new
        for broker in list(self._shutting_down):
            if old.brokers.get(broker) != new.brokers.get(broker):
                self._shutting_down.discard(broker)  # it exited, or it is back: either way no longer leaving
        if self._term is None:
            return  # not the controller: an election plans over everything anyway
        keys = changed_partitions(old, new)
        if keys is None:
            self._replan_all = True
            self._dirty.set()
        elif keys:
            self._replan.update(keys)
            self._dirty.set()

    async def _reconcile_loop(self, writer: FencedWriter) -> None:
        backoff = self._retry_initial
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            keys = None if self._replan_all else self._replan
            self._replan_all, self._replan = False, set()
            changes = plan_failover(self._latest, self._shutting_down, self._unclean_default, keys)
            try:
                await self._writes.apply(writer, changes)
            except ControllerFencedError:
                return  # the election has seen it and will call on_deposed
            except Exception as error:
                log.warning(
                    "controller %s: failover writes failed (%s); retrying in %.1fs", self.broker_id, error, backoff
                )
                self._replan_all = True  # the keys of this round are gone: look at everything again
                self._dirty.set()
                await self._clock.sleep(backoff)
                backoff = min(backoff * 2, self._retry_max)
                continue
            backoff = self._retry_initial

    async def _balance_loop(self, writer: FencedWriter) -> None:
        await self._clock.sleep(self._balance_delay)
        while True:
            try:
                await self._writes.apply(writer, plan_balance(self._latest, self._shutting_down))
            except ControllerFencedError:
                return
            except Exception as error:
                log.warning(
                    "controller %s: leadership balancing failed (%s); next try in %.1fs",
                    self.broker_id,
                    error,
                    self._balance_interval,
                )
            await self._clock.sleep(self._balance_interval)

    async def _clean_creations(self, writer: FencedWriter) -> None:
        """Undo the stream creations earlier controllers left unfinished (their partition keys and markers)."""
        backoff = self._retry_initial
        while True:
            try:
                await self._creation(writer).clean_abandoned(self._client)
                return
            except ControllerFencedError:
                return
            except Exception as error:
                log.warning(
                    "controller %s: cleaning abandoned stream creations failed (%s); retrying in %.1fs",
                    self.broker_id,
                    error,
                    backoff,
                )
                await self._clock.sleep(backoff)
                backoff = min(backoff * 2, self._retry_max)

    async def _stop_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # not gather: a cancellation of the caller itself must still propagate

    # ---- writing ----

    def _creation(self, writer: FencedWriter) -> StreamCreation:
        return StreamCreation(self._client, self._keys, writer.transaction, writer.term.epoch, chunk=self._create_chunk)

    def _changes(self, writer: FencedWriter) -> StreamChanges:
        return StreamChanges(self._client, self._keys, writer.transaction, chunk=self._create_chunk)

    def current_writer(self) -> FencedWriter:
        """The writer of the current term (:class:`NotControllerError` when there is none), for the modules that
        write beside the controller (:mod:`tidelog.metadata.reassignment`)."""
        return self._current_writer()

    def _current_writer(self) -> FencedWriter:
        """The writer of the current term, or :class:`NotControllerError` naming the controller to forward to."""
        if self._writer is None or not self.active:
            election = self._election
            if election is None:
                raise NotControllerError(self.broker_id, None, 0)
            raise NotControllerError(self.broker_id, election.controller_id, election.epoch)
        return self._writer

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def _prefix_end(prefix: bytes) -> bytes:
    """The etcd range end that covers every key starting with ``prefix``."""
    end = bytearray(prefix)
    end[-1] += 1
    return bytes(end)


def _head_conflict(stream: str, partition: int) -> Callable[[PartitionRecord | None], SuspensionError]:
    """The error of a suspension or reset-head whose partition record kept changing under it."""

    def conflict(record: PartitionRecord | None) -> SuspensionError:
        return SuspensionError(HeadRejection.CONFLICT, f"{stream}/{partition} kept changing", record)

    return conflict
