"""Transactional appends on a leader: expectations, the write turn, and the commit (Gazette, seed 002).

An append streams in chunks into an :class:`~tidelog.broker.appends.spool.AppendSpool` (owned by the connection
that sends it, :mod:`tidelog.api.wire.append`), then commits here:

1. **The write turn.** Commits of one partition take turns (a FIFO lock), so the registers one commit checks
   cannot change before it is written: only commits change registers. Plain produces do not take the turn —
   they never touch registers, and the expected offset is checked by the log itself where offsets are
   assigned. The turn is held from the check until the log has *placed* the batch (offsets taken, under the
   log's lock), not through the fsync and the replicas' acknowledgement: the next commit checks against a
   log end and registers that already include this one, so pipelined appends share fsyncs and replication
   round trips like produced batches do.
2. **Expectations**, checked under the turn: ``check_registers`` against the current registers (empty
   registers match any selector, as in Gazette) → REGISTER_MISMATCH; the expected offset against the log end,
   where the log assigns offsets → INCORRECT_OFFSET (Liftbridge's name for Gazette's wrong-append-offset).
   Both carry the actual log end and registers back to the client, and nothing is appended.
3. **The batch.** The spool is sealed as one batch; when the append changes the registers (``subtract`` then
   ``union``, only if it has records) the new set rides in the batch's registers block. It is written like a
   produce and acknowledged per the ack policy.

An expected offset the log has already passed is refused at the start (:meth:`AppendCommitter.precheck`),
so a client that lost a race learns it before streaming megabytes; the commit decides everything in its turn.

The commit writes through the leader's write path (:mod:`tidelog.broker.partitions.write_path`), as every
producer does, and, like it, returns routable outcomes as values: an :class:`AppendRefused` (an expectation
that failed, registers that cannot be applied) or the write path's own
:class:`~tidelog.broker.partitions.write_path.WriteRefused`. Exceptions are real failures.

Why a spool rather than writing chunks to the log as they arrive (the plan in
``docs/design/transactional-appends.md``): the write turn is taken only at commit, so a slow client never holds
up a partition's other writers, an abort or a dropped connection has nothing to undo in the log, and readers,
followers and recovery need no rules for half-written appends. The price is one extra copy of the records
through the page cache.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field

from tidelog.broker.appends.registers import PartitionRegisters
from tidelog.broker.appends.spool import AppendSpool
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.write_path import TransactionalWrite, WriteRefused
from tidelog.protocol.errors import ErrorCode, TidelogError
from tidelog.protocol.labels import (
    EMPTY,
    LabelSelector,
    LabelSet,
    RegisterError,
    apply,
    encode_labels,
    matches,
)
from tidelog.protocol.messages import Acks
from tidelog.storage.errors import DiskFullError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Expectations:
    """What an append requires of the partition, and how it changes the registers."""

    expected_offset: int | None = None
    check_registers: LabelSelector | None = None
    union_registers: LabelSet = EMPTY
    subtract_registers: LabelSet = EMPTY


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed append: its offsets (-1 when it had no records), the log end after it, the registers."""

    base_offset: int
    last_offset: int
    log_end: int
    registers: LabelSet


@dataclass(frozen=True, slots=True)
class AppendRefused:
    """An append's outcome when nothing was appended (an expectation failed, the records were refused, the append
    was aborted or too slow...): a status value, answered by the protocol edges. Carries what the client needs to
    decide again."""

    code: ErrorCode
    message: str
    log_end: int
    registers: LabelSet = field(default=EMPTY)

    def __str__(self) -> str:
        return self.message


class AppendCommitter:
    """Commits the transactional appends of one partition this broker leads: the write turn, the expectations,
    the registers. One per leadership (:func:`committer_of`); an append being streamed is
    :class:`~tidelog.broker.appends.streamed.OpenAppend`."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.registers = PartitionRegisters(partition.log)
        self._turn = asyncio.Lock()
        self._checkpointing: asyncio.Task[None] | None = None

    def precheck(self, expectations: Expectations) -> AppendRefused | None:
        """Refuse early an append whose expected offset the log has already passed: a leader's log end only
        grows, so that one can never succeed. Nothing else is decided early — appends ahead of this one (from
        this client's pipeline or others) may still move the log end to the expected offset or change the
        registers to match — so the commit checks everything again, in its turn."""
        expected = expectations.expected_offset
        end = self.partition.log.end_offset
        if expected is not None and expected < end:
            return AppendRefused(
                ErrorCode.INCORRECT_OFFSET,
                f"{self.partition.name}: expected the log to end at offset {expected}, it ends at {end}",
                end,
                self.registers.latest_known(),
            )
        return None

    def _check(self, expectations: Expectations, registers: LabelSet, end: int) -> AppendRefused | None:
        selector = expectations.check_registers
        if selector is not None and not matches(registers, selector):
            return AppendRefused(
                ErrorCode.REGISTER_MISMATCH,
                f"{self.partition.name}: registers [{_show(registers)}] do not match the selector {selector}",
                end,
                registers,
            )
        expected = expectations.expected_offset
        if expected is not None and expected != end:
            return AppendRefused(
                ErrorCode.INCORRECT_OFFSET,
                f"{self.partition.name}: expected the log to end at offset {expected}, it ends at {end}",
                end,
                registers,
            )
        return None

    async def commit(
        self, spool: AppendSpool, expectations: Expectations, acks: Acks, timeout: float, max_bytes: int
    ) -> Committed | AppendRefused | WriteRefused:
        """Write the spooled append if its expectations hold; see the module docstring. A refusal is returned:
        an :class:`AppendRefused` decided here, or the write path's :class:`WriteRefused` as it is."""
        partition = self.partition
        await self._turn.acquire()
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._turn.release()

        try:
            registers = await self.registers.current()
            failed = self._check(expectations, registers, partition.log.end_offset)
            if failed is not None:
                return failed
            if not spool.count:  # nothing to write, and registers change only with records
                return Committed(-1, -1, partition.log.end_offset, registers)
            try:
                updated = apply(registers, expectations.union_registers, expectations.subtract_registers)
            except RegisterError as exc:  # e.g. the union would hold more labels than registers may
                return AppendRefused(
                    ErrorCode.INVALID_ARGUMENT, f"{partition.name}: {exc}", partition.log.end_offset, registers
                )
            batch = spool.seal(registers=encode_labels(updated) if updated != registers else None)
            count = spool.count

            def placed(base_offset: int) -> None:
                self.registers.committed(base_offset + count, updated)
                release()  # the next commit may check: this one's offsets and registers are settled

            try:
                appended = await partition.write(
                    batch,
                    acks,
                    timeout,
                    expected_offset=expectations.expected_offset,
                    transactional=TransactionalWrite(max_bytes, placed, spool.file_slice()),
                )
            except DiskFullError:  # refused and undone after ``placed`` recorded its registers: forget them too
                self.registers.forget_after(partition.log.end_offset)
                raise
            finally:
                del batch  # the spool's memory map may close only once no view of it is left
            if isinstance(appended, WriteRefused):
                if appended.code is ErrorCode.INCORRECT_OFFSET:  # an expectation: the client decides again
                    return AppendRefused(appended.code, appended.message, partition.log.end_offset, registers)
                return appended
            if updated != registers:
                self._schedule_checkpoint()
            return Committed(appended.base_offset, appended.last_offset, appended.last_offset + 1, updated)
        finally:
            release()

    async def confirm(self, refused: AppendRefused, timeout: float) -> AppendRefused:
        """The refusal to send, once what it was based on is committed.

        A leader checks expectations against its log end and registers, which may include records not yet
        committed — after a failover, records the previous leader wrote that may yet be truncated away. A
        refusal based on such a state is not linearizable: if the tail is truncated, the log may really end at
        the expected offset. So an expectation failure is answered only once the state it saw is committed
        (the high watermark reached the log end it saw; committed records are never lost, so the log never
        ends below it again: :meth:`Partition.confirm_end`). If that does not happen in time, the answer is
        UNAVAILABLE — nothing was written, and the client may retry — rather than a claim the log may not bear
        out. Found by :mod:`tidelog.testing.cas_faults`.
        """
        if refused.code not in (ErrorCode.INCORRECT_OFFSET, ErrorCode.REGISTER_MISMATCH):
            return refused
        try:
            await self.partition.confirm_end(refused.log_end, timeout)
        except TidelogError as exc:
            return AppendRefused(exc.code, exc.message, refused.log_end, refused.registers)
        return refused

    def _schedule_checkpoint(self) -> None:
        """Checkpoint the committed registers in the background, one write at a time: it only shortens the
        scan a later leader makes, so it never delays an acknowledgement."""
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())

    async def _checkpoint(self) -> None:
        try:
            await self.registers.checkpoint(self.partition.high_watermark)
        except Exception:
            log.warning("%s: could not checkpoint the registers", self.partition.name, exc_info=True)


_BY_PARTITION: weakref.WeakKeyDictionary[Partition, AppendCommitter] = weakref.WeakKeyDictionary()


def committer_of(partition: Partition) -> AppendCommitter:
    """The committer of a leader's appends, made on first use: one per leadership, since a new leadership is
    a new :class:`Partition` (and recovers the registers from its log)."""
    committer = _BY_PARTITION.get(partition)
    if committer is None:
        committer = _BY_PARTITION[partition] = AppendCommitter(partition)
    return committer


def _show(registers: LabelSet) -> str:
    return ", ".join(str(label) for label in registers) or "none"
