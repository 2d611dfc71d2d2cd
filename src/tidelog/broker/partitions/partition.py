"""One partition led by this broker: its log, its high watermark, and the rules of writing to it.

Every way in (NATS ingest, gRPC Publish, the wire protocol's produce) ends in :meth:`Partition.write` with
whole record batches, run state by state by :mod:`tidelog.broker.partitions.write_path`; every way out (gRPC Subscribe,
wire fetch) reads committed batches with :meth:`Partition.read_committed` and long-polls with
:meth:`Partition.wait_for_data`. Keeping those two doors
in one type is what keeps the guarantees the same whichever protocol a client speaks:

- nothing is acknowledged before the ack policy is met (``ALL``: below the high watermark; with flush
  ``always`` that also means fsynced);
- readers never see an offset at or above the high watermark;
- a read-only partition refuses writes and stores nothing (and its readers end at its end); a paused one is not
  open at all (:mod:`tidelog.broker.pausing`), so no write reaches it.

Replication, leader side: followers fetch with :meth:`Partition.replica_fetched` (their fetch offset is their
acknowledgement and feeds the high watermark) and wait at the log end, not the HW, with
:meth:`Partition.park_at_log_end`, so they copy a batch while the leader is still fsyncing it. The partition
keeps the ISR honest: a follower that stops keeping up is proposed for removal, a caught-up one for re-entry,
both through the controller (``alter_isr``); the HW tracker only takes a new ISR once it is in the metadata,
so the HW never passes data a departing follower lacks before it has left (Rama's ordering).

Idempotent producers: batches carrying a producer id are checked against the partition's
:class:`~tidelog.replication.idempotence.producer_state.ProducerStateTable` before anything is written. A retry is
answered with its original offsets (waiting, for ``ALL``, until they are committed) and writes nothing; a gap, an older
epoch, an unknown producer or a batch still being written is refused with its own error. New batches are
*reserved* before the append and recorded (or released) when the log answers, by a callback on the append's own
task: a caller cancelled meanwhile (connection dropped, server stopping) cannot leave a written batch
unrecorded, which would let its retry be written twice. The table is handed on across role changes by the
partition manager; :meth:`Partition.close` waits for those appends first, so it is complete when handed on.

Compare-and-append (Liftbridge's ``expectedOffset``): :meth:`Partition.write` passes the expected offset to
:meth:`Log.append`, which compares it with the log end where it assigns offsets, under its lock and with no
await before the write. Checking here and then appending would not be atomic: the log's lock may be held by
retention or compaction, and another append could take the offset while this one waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, cast

from tidelog import telemetry
from tidelog.broker.partitions.committed_reads import CommittedReads
from tidelog.broker.partitions.maintenance import LeaderMaintenance
from tidelog.broker.partitions.safety import LeaderSafety, ReportSuspension, start_evidence
from tidelog.broker.partitions.write_path import Appended, LeaderWrite, TransactionalWrite, WriteRefused, WriteState
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import (
    RequestTimeoutError,
    TidelogError,
    UnavailableError,
)
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import BatchHeader
from tidelog.replication.hw_checkpoint import write_hw_checkpoint
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import SNAPSHOT_INTERVAL_NS, take_snapshot, take_snapshot_off_loop
from tidelog.replication.leader.ack_poll import poller_for
from tidelog.replication.leader.fencing import fence_follower
from tidelog.replication.leader.follower_progress import FollowerProgress
from tidelog.replication.leader.highwater import HighWatermark
from tidelog.storage.file_writes import Buffer, FileSlice
from tidelog.storage.flush import FlushMode
from tidelog.storage.log import Log
from tidelog.storage.log_append import AppendResult

log = logging.getLogger(__name__)

TAIL_VISIBLE_WAIT = 1.0  # seconds a reader of a new leader waits for its committed tail (see tail_visible)
_WRITTEN = WriteState.DONE  # a global: read on every write, faster than the enum's attribute
APPEND_SETTLE_TIMEOUT = 10.0  # seconds close() waits for idempotent appends to land in the producer table


class TailWaiter(Protocol):
    """A replica fetch waiting at the log end (:meth:`Partition.park_at_log_end`): told of the write that starts
    there, or of the partition closing, exactly once, unless it leaves first (:meth:`Partition.unpark`)."""

    def written(self, batches: Sequence[Buffer] | None, size: int, log_end: int) -> None:
        """The write starting where it waits, just before or just after it reaches the file
        (:class:`_TailPush`): its batches as stored (``None`` when they are not in memory: copied
        from a spool file), their size, and the log end once the write is in. Must not raise."""

    def closed(self, error: TidelogError) -> None:
        """The partition stops serving (closing, or its leadership changing): answer with ``error``."""


AlterIsr = Callable[[PartitionRecord, tuple[str, ...]], Awaitable[None]]
"""Asks the controller to set a partition's ISR: (the record the leader acts on, the ISR it wants)."""


class _TailPush:
    """The leader's write observer (:mod:`tidelog.storage.write_observer`): hands each write to the replica
    fetches parked at the log end. Told just before a write into preallocated room, so the followers' copies
    start while the leader's own ``pwritev`` runs; if that write then fails, the log is poisoned and the leader steps
    down (:mod:`tidelog.broker.partitions.failed_logs`); the followers' fetches beyond its end are told to retry and
    keep those offsets (never acknowledged: the next leader may commit them)."""

    before_write = True

    def __init__(self, tell: Callable[[int, int, Sequence[Buffer | FileSlice]], None]) -> None:
        self.on_write = tell


class Partition(CommittedReads):
    """A partition this broker leads."""

    def __init__(
        self,
        stream: StreamRecord,
        record: PartitionRecord,
        log_: Log,
        broker_id: str,
        *,
        min_isr: int,
        initial_hw: int | None = None,
        alter_isr: AlterIsr | None = None,
        replica_lag_time_max: float = 15.0,
        producers: ProducerStateTable | None = None,
        report_suspension: ReportSuspension | None = None,
        ack_poll_us: int = 0,
        clock: Clock | None = None,
        maintenance: LeaderMaintenance | None = None,
        on_log_failed: Callable[[Partition], None] | None = None,
    ) -> None:
        """``producers``: the replica's producer state, loaded with its log (an empty table when not given).
        ``ack_poll_us``: how long a write waiting for its commit keeps the loop polling (:mod:`ack_poll`; 0, or a
        single replica: not). ``clock``: follower lag, ISR shrink, producer snapshots and record timestamps
        read it (a :class:`~tidelog.clock.SystemClock` when not given). ``maintenance``: the broker's one timer
        for its partitions' periodic work (:mod:`~tidelog.broker.partitions.maintenance`; one of its own when not
        given). ``on_log_failed``: told (from a write, or the maintenance tick) while this leader's log has failed a
        write or an fsync (:mod:`~tidelog.broker.partitions.failed_logs`: the leader steps down).
        ``initial_hw`` is not clamped by the caller: above the log end it suspends appends (fail to safety,
        :mod:`tidelog.broker.partitions.safety`), and ``report_suspension`` has the controller record that."""
        self.stream = stream
        self.record = record
        self.log = log_
        self.broker_id = broker_id
        self.min_isr = min_isr
        self.clock: Clock = clock or SystemClock()
        self._alter_isr = alter_isr
        self._lag_max_ns = int(replica_lag_time_max * 1e9)
        self._ack_poll_ns = ack_poll_us * 1000
        self._committing = 0  # writes waiting for their commit (wait_committed)
        self._poller = poller_for(asyncio.get_running_loop()) if ack_poll_us and self.replicated else None  # ack_poll
        # With no followers everything written is committed. A leader with followers starts from the HW it
        # knew (checkpointed as a follower or an earlier leader): what lies above was never known committed,
        # and becomes visible only once the ISR has it again.
        start_hw = log_.end_offset if initial_hw is None else min(initial_hw, log_.end_offset)
        self._hw = HighWatermark(broker_id, record.isr or (broker_id,), start_hw, min_isr=min_isr)
        self._hw.replica_caught_up_to(broker_id, log_.end_offset)
        self.followers = FollowerProgress(broker_id, record.replicas, self.clock.monotonic_ns())
        self._epoch_start = log_.end_offset  # the first offset of this leadership (Kafka's ISR-join rule)
        self._isr_change: asyncio.Task[None] | None = None
        evidence = start_evidence(record, broker_id, log_, initial_hw)
        self._checkpointed = -1 if evidence is None else start_hw  # evidence stays on disk while suspended
        self._tasks: list[asyncio.Task[None]] = []
        self.safety = LeaderSafety(self.name, record, report_suspension, self._tasks.append, self.clock)
        self.safety.found(evidence)
        self.producers = ProducerStateTable() if producers is None else producers
        self._snapshots = ProducerSnapshots(log_.directory)
        self._snapshot_offset = -1  # the offset of the last producer snapshot written
        self._snapshot_due_ns = self.clock.monotonic_ns() + SNAPSHOT_INTERVAL_NS
        self._appending: set[asyncio.Task[AppendResult]] = set()  # idempotent appends the table awaits
        self._tail_waiters: dict[int, list[TailWaiter]] = {}  # log end -> fetches parked there (park_at_log_end)
        self._tail_push = _TailPush(self._tell_waiters)
        log_.add_write_observer(self._tail_push)
        log_.set_flush_mode(FlushMode.WORKER if self.replicated else FlushMode.ADAPTIVE)
        self._closed = False
        self.first_received_ns = 0
        self.latest_received_ns = 0
        self.records_in = 0  # records and bytes written in this leadership (for the metrics, read at scrape time)
        self.bytes_in = 0
        self.led_since_ns = self.clock.now_ns()  # auto-pause counts idleness from here when nothing was received
        self._on_log_failed = on_log_failed
        self._maintenance = LeaderMaintenance(self.clock) if maintenance is None else maintenance
        self._maintenance.add(self)

    @property
    def replicated(self) -> bool:
        return len(self.record.replicas) > 1

    # ------------------------------------------------------------------------------------------ identity

    @property
    def high_watermark(self) -> int:
        """The offset after the last committed record (Kafka's meaning)."""
        return self._hw.value

    def update_record(self, record: PartitionRecord) -> None:
        """Take a newer metadata record (paused/readonly flags, ISR, suspension)."""
        telemetry.isr_changed(len(self.record.isr), len(record.isr))
        self.record = record
        self.record_changed()
        self._maintenance.wake(self)  # replicas added: periodic work again
        self.safety.update(record)
        self.followers.set_replicas(record.replicas, self.clock.monotonic_ns())
        fetched = {r: s.log_end for r in record.isr if (s := self.followers.state(r)) is not None}
        self._hw.set_isr(record.isr or (self.broker_id,), fetched)
        self._hw.stop_counting(r for r in self._hw.joining if r not in record.replicas)

    def update_stream(self, stream: StreamRecord, min_isr: int) -> None:
        """Take a newer stream record (settings changed at run time: ``tidelog stream alter``)."""
        self.stream = stream
        self.min_isr = min_isr
        self._hw.set_min_isr(min_isr)

    # ------------------------------------------------------------------------------------------ replication

    def replica_fetched(self, replica: str, offset: int) -> bool:
        """A follower fetches at ``offset``: it holds everything below. False when it is no replica of ours.

        Beyond the log end, it holds offsets this leader lacks: evidence that consistency is lost, which
        suspends appends (:mod:`tidelog.broker.partitions.safety` says why no race leads here); nothing is recorded.
        Not when this leader's log failed: a write into zero-filled room failed after its followers had it, and the
        log never appends again, so those offsets are never handed out twice (it steps down: ``failed_logs``)."""
        if offset > self.log.end_offset:
            if self.followers.state(replica) is None:
                return False
            if self.log.flusher.failed is None:
                self.safety.fetched_beyond_end(replica, offset, self.log.end_offset, self.broker_id)
            return True
        end = self.log.end_offset
        if offset == end and self.latest_received_ns and (s := self.followers.state(replica)) and s.log_end < end:
            telemetry.follower_replicated((self.clock.now_ns() - self.latest_received_ns) / 1e9)  # Rama's metric
        if not self.followers.fetched(replica, offset, end, self.clock.monotonic_ns()):
            return False
        self._hw.replica_caught_up_to(replica, offset)
        if (
            replica not in self.record.isr
            and self._alter_isr is not None
            and self._isr_change is None
            and not self._closed
        ):
            ready = self.followers.ready_to_join(self.record.isr, self._hw.value, self._epoch_start)
            if replica in ready:
                self._hw.count_joining(replica, offset)  # from the ask on, not from the answer (highwater)
                self._propose_isr((*self.record.isr, replica))
        return True

    def fence_follower(self, replica: str, leader_epoch: int) -> TidelogError | None:
        """Why ``replica``, following at ``leader_epoch``, may not be served by this leadership; None when it may
        (:mod:`tidelog.replication.leader.fencing`)."""
        record = self.record
        return fence_follower(self.name, record.leader_epoch, record.replicas, self.followers, replica, leader_epoch)

    def park_at_log_end(self, offset: int, waiter: TailWaiter) -> None:
        """Have ``waiter`` told of the write that starts at ``offset`` (the log end), from inside that write,
        or of the partition closing. No future and no task: a follower's fetch waits here between two writes,
        and the write answers it with the batches it is writing. Its timeout and its session's winding down
        are the waiter's own; it leaves with :meth:`unpark`. UNAVAILABLE if the partition is closed."""
        if self._closed:
            raise UnavailableError(f"partition {self.name} is closing or changing leader")
        self._tail_waiters.setdefault(offset, []).append(waiter)

    def unpark(self, offset: int, waiter: TailWaiter) -> None:
        """``waiter`` stops waiting at ``offset`` (it timed out, or its connection went): a no-op once told."""
        waiting = self._tail_waiters.get(offset)
        if waiting is not None and waiter in waiting:
            waiting.remove(waiter)
            if not waiting:
                del self._tail_waiters[offset]

    def _tell_waiters(self, first: int, end: int, parts: Sequence[Buffer | FileSlice]) -> None:
        """The log's write observer (:class:`_TailPush`): hand a write to the fetches parked where it starts."""
        self._maintenance.wake(self)  # a write: producer state to snapshot, producers to expire
        waiters = self._tail_waiters.pop(first, None)
        if not waiters:
            return
        in_memory = [part for part in parts if not isinstance(part, FileSlice)]
        batches = in_memory if len(in_memory) == len(parts) else None  # None: read back from the log (a spool)
        size = 0 if batches is None else sum(len(batch) for batch in batches)
        for waiter in waiters:
            try:
                waiter.written(batches, size, end)
            except Exception:  # never into the append: its bytes are in the file, or about to be
                log.exception(
                    "%s: handing a write to a waiting replica fetch failed; the append goes on and that follower "
                    "fetches it again",
                    self.name,
                    extra=self.log_context,
                )
        if self._poller is not None:
            self._poller.stop()  # the followers it just woke need the CPUs now (ack_poll)

    def _propose_isr(self, isr: tuple[str, ...]) -> None:
        """Ask the controller for a new ISR, one request at a time; the change applies when it reaches the
        metadata (:meth:`update_record`), not when asked."""
        if self._alter_isr is None or self._isr_change is not None:
            return
        record = self.record

        async def run() -> None:
            try:
                await self._alter_isr(record, isr)  # type: ignore[misc]
                self._hw.stop_counting(r for r in self._hw.joining if r not in isr)  # written without them
            except Exception as exc:  # the controller refused (stale epoch) or was unreachable: retry later
                if isinstance(exc, TidelogError) and not exc.retriable:  # refused: nothing was written
                    self._hw.stop_counting(r for r in isr if r not in record.isr)  # (a broker shutting down)
                log.warning(
                    "%s: the controller did not change the ISR to %s (%s); the leader asks again at its next check",
                    self.name,
                    ",".join(isr),
                    exc,
                    extra=self.log_context,
                )
            finally:
                self._isr_change = None

        log.info(
            "%s: proposing ISR %s (was %s)", self.name, ",".join(isr), ",".join(record.isr), extra=self.log_context
        )
        self._isr_change = asyncio.create_task(run(), name=f"alter-isr-{self.name}")

    @property
    def maintenance_period(self) -> float:
        """Seconds between two visits of the broker's maintenance (:meth:`maintain`)."""
        return min(1.0, self._lag_max_ns / 2e9)

    async def maintain(self) -> bool:
        """Periodic work, from the broker's one maintenance timer (:mod:`~tidelog.broker.partitions.maintenance`):
        shrink the ISR of lagging followers and checkpoint the HW (replicated partitions), expire idle producers
        and snapshot the producer state (every partition). False when nothing can be due until a write or a new
        record wakes the partition (:meth:`_tell_waiters`, :meth:`update_record`)."""
        if self._closed:
            return False
        if self.log.flusher.failed is not None:
            self.log_failed()  # an idle leader too (a failed seal): it steps down
        if self.replicated or not self.producers.empty or self.log.end_offset != self._snapshot_offset:
            await self._maintain_producers()
        if not self.replicated:
            return not self.producers.empty or self.log.end_offset != self._snapshot_offset
        counted = (*self.record.isr, *self._hw.joining)  # a joining follower that stopped fetching leaves too
        lagging = self.followers.lagging(counted, self.clock.monotonic_ns(), self._lag_max_ns)
        if lagging and self._isr_change is None:
            log.warning(
                "%s: followers %s have not caught up for %.1fs (replica_lag_time_max_ms); asking the controller to "
                "remove them from the ISR",
                self.name,
                ",".join(lagging),
                self._lag_max_ns / 1e9,
                extra={**self.log_context, "follower": ",".join(lagging)},
            )
            self._propose_isr(tuple(r for r in self.record.isr if r not in lagging))
        try:
            await self.checkpoint_hw()
        except OSError as exc:  # a full disk: the checkpoint lags (a restart serves less), the next tick retries
            log.warning(
                "%s: cannot write the high-watermark checkpoint (%s); retried at the next tick (a restart until "
                "then serves from the older checkpoint)",
                self.name,
                exc,
                extra=self.log_context,
            )
        return True

    async def _maintain_producers(self) -> None:
        self.producers.remove_expired()
        now = self.clock.monotonic_ns()
        if now < self._snapshot_due_ns:
            return
        end = self.log.end_offset
        if end == self._snapshot_offset or self.log.closed:
            self._snapshot_due_ns = now + SNAPSHOT_INTERVAL_NS
        elif not self.producers.has_reservations and await take_snapshot_off_loop(
            self.producers, self._snapshots, end
        ):  # the file is written in a thread: a pass over thousands of partitions never stalls the loop
            self._snapshot_offset = end
            self._snapshot_due_ns = now + SNAPSHOT_INTERVAL_NS

    def snapshot_producers(self) -> bool:
        """Snapshot the producer state at the log end, when that is exact (no reserved append in flight) and the
        log grew since the last one; True when there was nothing to do or it was written."""
        end = self.log.end_offset
        if end == self._snapshot_offset or self.log.closed:
            return True
        if self.producers.has_reservations:
            return False  # a reserved batch may be in the log but not yet in the table: try again next tick
        if take_snapshot(self.producers, self._snapshots, end):
            self._snapshot_offset = end
            return True
        return False

    async def checkpoint_hw(self) -> None:
        """Persist the HW when it moved (a restarted replica must not serve above what was known committed)."""
        hw = self._hw.value
        if hw != self._checkpointed:
            await write_hw_checkpoint(self.log.directory, hw)
            self._checkpointed = hw

    # ------------------------------------------------------------------------------------------ writes

    def log_failed(self, error: BaseException | None = None) -> None:
        """This leader's log failed a write or an fsync (``error``, when a write just met it): make sure it is
        poisoned (no append, no retried fsync: a failed write was undone, but the disk cannot be trusted), and
        have the broker hand the leadership on (:mod:`~tidelog.broker.partitions.failed_logs`)."""
        if error is not None:
            self.log.flusher.poison(error)
        if self._on_log_failed is not None and not self._closed:
            self._on_log_failed(self)

    def check_appendable(self) -> None:
        """Raise PARTITION_SUSPENDED while appends are suspended (fail to safety,
        :mod:`tidelog.broker.partitions.safety`): the first check of every write, whichever way it came in; reads are
        not affected."""
        self.safety.check_appendable()

    def write(
        self,
        data: bytes | bytearray | memoryview,
        acks: Acks,
        timeout: float,
        *,
        expected_offset: int | None = None,
        transactional: TransactionalWrite | None = None,
        on_committed: Callable[[int, int], None] | None = None,
    ) -> Coroutine[Any, Any, Appended | WriteRefused]:
        """Append whole batches and wait for ``acks``: :class:`Appended` once the policy is met, or the
        :class:`WriteRefused` status of a write routed back (nothing stored); raise on failures
        (:mod:`tidelog.broker.partitions.write_path` runs it, state by state, once the returned coroutine is awaited).

        ``timeout`` bounds the wait for the ack policy only: once the log has the bytes a timeout does not undo
        the write (the client gets a TIMEOUT error and may retry; an idempotent producer dedupes the retry).
        Batches with a producer id are checked first (see the module docstring): a retry returns its original
        offsets with ``duplicate`` set. ``expected_offset``: only if the log ends there (INCORRECT_OFFSET).
        ``transactional``: the single batch of a transactional append (:mod:`tidelog.broker.appends.commit`).
        ``on_committed(base_offset, last_offset)``: with acks ``ALL``, called from inside the acknowledgement that
        commits the batches, before this returns (not when they were committed without waiting): the wire
        produce answers from there (:func:`tidelog.api.wire.handlers.produce`).
        """
        write = LeaderWrite(self, data, acks, timeout, expected_offset, transactional, on_committed)
        # The driver's own coroutine, not one wrapped in another: run to DONE, a write always has its status.
        return cast("Coroutine[Any, Any, Appended | WriteRefused]", write.run_to(_WRITTEN))

    async def append(
        self,
        data: bytes | bytearray | memoryview,
        acks: Acks,
        timeout: float,
        *,
        expected_offset: int | None = None,
        transactional: TransactionalWrite | None = None,
        on_committed: Callable[[int, int], None] | None = None,
    ) -> Appended:
        """:meth:`write`, raising a refusal as the error of its code: for callers that answer every refusal as
        an error (an acks-``NONE`` produce, whose failures are only logged; tests)."""
        write = LeaderWrite(self, data, acks, timeout, expected_offset, transactional, on_committed)
        status = await write.run_to(_WRITTEN)
        if isinstance(status, WriteRefused):
            raise status.error()
        assert status is not None
        return status

    async def confirm_end(self, end: int, timeout: float) -> None:
        """Before refusing a write whose expected offset is not the log end ``end``: wait until ``end`` is
        committed, so the refusal never rests on records a failover may still truncate (it would not be
        linearizable: the log might really end at the expected offset). UNAVAILABLE (nothing written, retry)
        if that does not happen in time. See :meth:`AppendCommitter.confirm`."""
        if end <= 0:
            return
        try:
            await self.wait_committed(end - 1, timeout)
        except TidelogError as exc:
            raise UnavailableError(
                f"{self.name}: nothing was written; the log end {end} the expected offset was checked against is "
                f"not known to be committed yet ({exc.message}); retry"
            ) from None

    def _settle_after_cancel(self) -> None:
        """The caller was cancelled (client gone, server stopping) while its append was being written or
        fsynced. Its batch may be in the log, and this leader's own entry in the HW tracker was waiting for the
        append to return: without this the HW would stay behind the log end until the next write, and an idle
        partition would never show those records. Flush, then count what was written before the flush began."""
        end = self.log.end_offset

        async def settle() -> None:
            try:
                await self.log.flush()
            except Exception:  # closed or poisoned: nothing to count
                return
            self._hw.replica_caught_up_to(self.broker_id, end)

        task = asyncio.ensure_future(settle())
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    def _append_reserved(
        self,
        data: bytes | bytearray | memoryview,
        headers: Sequence[BatchHeader],
        expected_offset: int | None,
        max_batch_bytes: int | None = None,
    ) -> asyncio.Future[AppendResult]:
        """Append batches reserved in the producer table, in a task of their own whose completion records them
        (or releases them when nothing was written); the caller awaits it through a shield, so cancelling the
        caller never separates the write from its record. ``max_batch_bytes``: as :meth:`Log.append`'s."""
        task = asyncio.ensure_future(
            self.log.append(
                data, self.record.leader_epoch, expected_offset=expected_offset, max_batch_bytes=max_batch_bytes
            )
        )
        self._appending.add(task)
        task.add_done_callback(functools.partial(self._settle_reserved, headers))
        return asyncio.shield(task)

    def _settle_reserved(self, headers: Sequence[BatchHeader], task: asyncio.Task[AppendResult]) -> None:
        self._appending.discard(task)
        if task.cancelled() or task.exception() is not None:
            # WriteRefused before the write (bad batch, wrong expected offset, closed log). A failure after the write
            # (the fsync) poisons the log: nothing more is appended here, and a reopen rebuilds the state.
            for header in headers:
                self.producers.release(header)
        else:
            self.producers.record_appended(headers, task.result().base_offset)

    # ------------------------------------------------------------------------------------------ reads

    async def wait_committed(self, offset: int, timeout: float, then: Callable[[], None] | None = None) -> None:
        """Wait until ``offset`` is committed; TIMEOUT error otherwise. ``then``: see
        :meth:`HighWatermark.wait_committed`."""
        if offset < self._hw.value:
            return  # already committed (always, with one replica): no timer, no future
        if self._poller is not None and not self._committing:  # a lone write: see ack_poll
            self._poller.poll_for(self._ack_poll_ns)
        self._committing += 1
        try:
            async with asyncio.timeout(timeout):  # not wait_for: that wraps the wait in a task of its own
                await self._hw.wait_committed(offset, then)
        except TimeoutError:
            raise RequestTimeoutError(
                f"offset {offset} of {self.name} was not committed within {timeout:.3f}s"
            ) from None
        finally:
            self._committing -= 1

    async def wait_for_data(self, offset: int, timeout: float | None) -> bool:
        """Long-poll: wait until a record at ``offset`` is committed; False on timeout."""
        return await self._hw.wait_beyond(offset, timeout)

    async def tail_visible(self, timeout: float = TAIL_VISIBLE_WAIT) -> None:
        """Before serving a reader: wait (briefly) until what this leader held when elected is committed.

        A follower learns the HW one fetch late, so a new leader starts with an HW that may lag what its
        predecessor had already shown consumers; answering them at once would show the HW going back (Rama: a
        new leader makes its committed tail visible before serving). The ISR's first fetches settle it within
        milliseconds. Bounded, so that a min-ISR stall does not block reading what is committed.
        """
        if self._hw.value < self._epoch_start:
            await self._hw.wait_beyond(self._epoch_start - 1, timeout)

    # ------------------------------------------------------------------------------------------ lifecycle

    async def close(self, *, close_log: bool = True) -> None:
        """Stop serving: wake waiters with UNAVAILABLE; flush and close the log unless it stays open for the
        partition's next role (a leader becoming a follower keeps its log)."""
        if self._closed:
            return
        self._closed = True
        await self._maintenance.remove(self)  # a visit under way (a checkpoint) ends first
        self.log.remove_write_observer(self._tail_push)
        self.log.set_flush_mode(FlushMode.ADAPTIVE)  # the log's next role (a follower) starts from the default
        tasks = [t for t in (*self._tasks, self._isr_change) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        error = UnavailableError(f"partition {self.name} is closing or changing leader")
        self._hw.fail_waiters(error)
        waiters, self._tail_waiters = self._tail_waiters, {}
        for parked in waiters.values():
            for waiter in parked:
                waiter.closed(error)
        if self._appending:  # the producer table must hold every batch written before it is handed on
            _, late = await asyncio.wait(set(self._appending), timeout=APPEND_SETTLE_TIMEOUT)
            if late:  # a wedged disk: they still record into the same table object when they finish
                log.warning("%s: %d append(s) still unfinished while closing", self.name, len(late))
        self.producers.release_all()
        self.snapshot_producers()  # a restart then scans only what follows
        if self.replicated:
            try:
                await self.checkpoint_hw()
            except Exception:
                log.warning("could not checkpoint the HW of %s", self.name, exc_info=True)
        if close_log:
            await self.log.close()
