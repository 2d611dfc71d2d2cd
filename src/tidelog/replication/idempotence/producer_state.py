"""Idempotent producers: per partition, which batches each producer already wrote (KIP-98's producer state).

A producer that retries a batch after a timeout or a leader failover must not have it written twice. Each
batch carries, in its header (:mod:`tidelog.protocol.records`), the producer's id, its epoch and the sequence
number of its first record; the records of one producer on one partition are numbered 0, 1, 2, … without gaps.
The partition remembers, per producer id, the sequence ranges and offsets of the last :data:`WINDOW` batches
it wrote, and checks each new batch against them before appending (:meth:`ProducerStateTable.check`):

==========================  =================================================================================
verdict                     when, and what the partition answers
==========================  =================================================================================
:class:`New`                the next batch in sequence (or not an idempotent batch at all): append it.
:class:`Duplicate`          a retry of a batch in the window: acknowledge its original offsets, write nothing.
:class:`OutOfOrder`         a gap, or a retry too old for the window: refused (Kafka's OUT_OF_ORDER_SEQUENCE);
                            carries the sequence the partition expects.
:class:`Fenced`             an epoch below the newest this id has written with: a zombie (PRODUCER_FENCED).
:class:`UnknownProducer`    an id with no state here, not starting at sequence 0 (its state was never here,
                            or is gone): the producer re-initializes (new epoch, sequence 0).
:class:`InFlight`           a retry of a batch being appended right now: retriable, after a backoff.
:class:`Invalid`            producer fields no producer can send (a negative sequence, an epoch out of range).
==========================  =================================================================================

The state is derived from the log alone: :meth:`ProducerStateTable.record` is called for every batch written —
by the leader after its append, by followers for every batch they replicate, and by recovery for every batch it
scans — and gives the same state whichever of the three wrote it. That is why a retry is recognized after a
leader failover: the new leader rebuilt the window from the batches it replicated. A restart loads a snapshot
(:mod:`tidelog.replication.idempotence.producer_snapshot`) and scans only the log after it; a truncated log either keeps
an exact state (:meth:`ProducerStateTable.truncate_to` returns ``True``) or is rebuilt from a snapshot at or below
the truncation point and the log between.

Sequences are int32 and wrap from 2**31-1 to 0, as in Kafka. Each epoch starts again at sequence 0, and the
window only holds batches of the producer's current epoch. Idle producers are forgotten after
``producer_expiry_ms`` (Kafka's ``producer.id.expiration.ms``, default one day), measured from the newest batch's
timestamp to the injected clock's wall time — the timestamp, not the arrival time, because it is in the log and
so the same on every replica and after a restart (a producer with a clock far behind expires early, as in
Kafka). An expired producer leaves a small tombstone (its id and epoch) for another expiry period, so that it may
resume at any sequence with its epoch — where an id never seen must start at 0 — and older epochs stay fenced.

Producer ids and epochs (the ``INIT_PRODUCER`` request, answered by any broker from etcd:
:mod:`tidelog.metadata.producer_ids`, not by this module): a producer asks once, before its first idempotent
batch. An *anonymous* producer gets a fresh id, unique in the cluster (a counter in etcd that only grows, taken
by compare-and-swap, so no id is ever reissued), with epoch 0. A *named* producer (a stable client-chosen name,
like Kafka's ``transactional.id``) gets the id its name already maps to and the stored epoch + 1; every
partition then fences batches from the older instance as soon as the new one writes (and the old one gets
:class:`Fenced` for good). When the epoch would pass :data:`MAX_PRODUCER_EPOCH` the name moves to a new id with
epoch 0 instead. A producer that gets :class:`UnknownProducer` or :class:`OutOfOrder` re-initializes; both mean
its sequence state and the broker's disagree, and guessing would risk a duplicate.

Concurrency. Appends to one partition are pipelined, so a producer's next batch is often checked while its
previous one is still being written. The leader therefore :meth:`~ProducerStateTable.reserve`\\ s each new batch
(the next check counts it) and :meth:`~ProducerStateTable.record`\\ s or :meth:`~ProducerStateTable.release`\\ s it
once the log answered. Everything here is synchronous and runs on the partition's event loop; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import NamedTuple, TypeAlias

from tidelog.clock import Clock, SystemClock
from tidelog.protocol.records import BatchHeader
from tidelog.protocol.records.producers import MAX_PRODUCER_EPOCH, MAX_SEQUENCE, NO_PRODUCER_ID, WINDOW

DEFAULT_PRODUCER_EXPIRY_MS = 24 * 60 * 60 * 1000


def next_sequence(sequence: int) -> int:
    """The sequence after ``sequence``, wrapping to 0 after :data:`MAX_SEQUENCE`."""
    return 0 if sequence == MAX_SEQUENCE else sequence + 1


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record (the batch spans ``last_offset_delta + 1`` sequences)."""
    return (base_sequence + last_offset_delta) % (MAX_SEQUENCE + 1)


# ------------------------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True, slots=True)
class New:
    """Append the batch."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Already written at ``base_offset..last_offset`` (inclusive): acknowledge those, write nothing."""

    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class OutOfOrder:
    """The batch does not start at ``expected_sequence``: a gap, or a retry older than the window."""

    expected_sequence: int


@dataclass(frozen=True, slots=True)
class Fenced:
    """The batch's epoch is below ``current_epoch``, the newest this producer id has written with."""

    current_epoch: int


@dataclass(frozen=True, slots=True)
class UnknownProducer:
    """No state for this producer id, and the batch does not start at sequence 0."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """The same batch is being appended right now; the retry should be repeated after a backoff."""


@dataclass(frozen=True, slots=True)
class Invalid:
    """Producer fields that no producer can send; ``reason`` says which."""

    reason: str


Verdict: TypeAlias = New | Duplicate | OutOfOrder | Fenced | UnknownProducer | InFlight | Invalid
NEW = New()
UNKNOWN_PRODUCER = UnknownProducer()
IN_FLIGHT = InFlight()


# ------------------------------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One remembered batch: its sequence range and where it was written. ``max_timestamp`` is in ns."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """What one producer id has written to the partition.

    ``batches`` are the newest batches of ``epoch``, oldest first, one to :data:`WINDOW` of them, in offset
    order. ``complete`` is true while they are every batch of this producer the table has seen (none dropped
    for the window or by an epoch change): only then does cutting some off by truncation leave an exact state.
    """

    producer_id: int
    epoch: int
    batches: tuple[BatchMetadata, ...]
    complete: bool

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset

    @property
    def last_timestamp(self) -> int:
        """The newest batch's timestamp: idle time is measured from it (as Kafka's ``lastTimestamp``)."""
        return self.batches[-1].max_timestamp


@dataclass(frozen=True, slots=True)
class ExpiredProducer:
    """A producer forgotten for idleness at ``expired_at_ns``: it may resume at any sequence of ``epoch``."""

    producer_id: int
    epoch: int
    expired_at_ns: int


class _Reservation(NamedTuple):
    epoch: int
    first_sequence: int
    last_sequence: int


def _invalid(header: BatchHeader) -> str | None:
    if header.producer_id < 0:
        return f"producer id {header.producer_id} is negative (only {NO_PRODUCER_ID} means none)"
    if not 0 <= header.producer_epoch <= MAX_PRODUCER_EPOCH:
        return f"producer epoch {header.producer_epoch} is outside [0, {MAX_PRODUCER_EPOCH}]"
    if not 0 <= header.base_sequence <= MAX_SEQUENCE:
        return f"base sequence {header.base_sequence} is outside [0, {MAX_SEQUENCE}]"
    return None


def _idempotent(header: BatchHeader) -> bool:
    """Whether a batch takes part: control batches are the broker's, not a producer's sequence."""
    return header.producer_id != NO_PRODUCER_ID and not header.is_control


class ProducerStateTable:
    """The producer state of one partition replica. Owned by the partition; not thread-safe.

    Invariants: every entry holds at least one batch; a producer is never both an entry and a tombstone;
    reservations exist only on a leader, between :meth:`reserve` and :meth:`record` / :meth:`release`.
    """

    __slots__ = ("_clock", "_entries", "_expired", "_expiry_ns", "_pending")

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
        entries: Iterable[ProducerEntry] = (),
        expired: Iterable[ExpiredProducer] = (),
    ) -> None:
        if producer_expiry_ms <= 0:
            raise ValueError(f"producer_expiry_ms must be positive, got {producer_expiry_ms}")
        self._clock: Clock = SystemClock() if clock is None else clock
        self._expiry_ns = producer_expiry_ms * 1_000_000
        self._entries: dict[int, ProducerEntry] = {e.producer_id: e for e in entries}
        self._expired: dict[int, ExpiredProducer] = {
            t.producer_id: t for t in expired if t.producer_id not in self._entries
        }
        self._pending: dict[int, list[_Reservation]] = {}

    # ------------------------------------------------------------------------------------- reading

    @property
    def producer_expiry_ms(self) -> int:
        return self._expiry_ns // 1_000_000

    @property
    def clock(self) -> Clock:
        return self._clock

    def entries(self) -> dict[int, ProducerEntry]:
        """A copy of the entries by producer id (the entries themselves are immutable)."""
        return dict(self._entries)

    def expired(self) -> dict[int, ExpiredProducer]:
        """A copy of the tombstones by producer id."""
        return dict(self._expired)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    @property
    def has_reservations(self) -> bool:
        """Whether batches are being appended: a snapshot at the log end is only exact when this is false."""
        return bool(self._pending)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def empty(self) -> bool:
        """No producer, tombstone or reservation: nothing for :meth:`remove_expired` to do."""
        return not (self._entries or self._expired or self._pending)

    def __repr__(self) -> str:
        return f"ProducerStateTable(producers={len(self._entries)}, expired={len(self._expired)})"

    # ------------------------------------------------------------------------------------- leader side

    def check(self, header: BatchHeader) -> Verdict:
        """Decide what to do with a batch a producer sent; changes nothing."""
        if not _idempotent(header):
            return NEW
        reason = _invalid(header)
        if reason is not None:
            return Invalid(reason)
        pid, epoch, first = header.producer_id, header.producer_epoch, header.base_sequence
        last = last_sequence(first, header.last_offset_delta)
        entry = self._entries.get(pid)
        pending = self._pending.get(pid, ())
        if entry is None and not pending:
            tombstone = self._expired.get(pid)
            if tombstone is None:
                return NEW if first == 0 else UNKNOWN_PRODUCER
            if epoch < tombstone.epoch:
                return Fenced(tombstone.epoch)
            return NEW if epoch == tombstone.epoch or first == 0 else OutOfOrder(0)
        # The newest state: the last reservation (they are checked in order) or else the last recorded batch.
        if pending:
            tail_epoch, tail_last = pending[-1].epoch, pending[-1].last_sequence
        else:
            assert entry is not None
            tail_epoch, tail_last = entry.epoch, entry.last_sequence
        current = max(tail_epoch, entry.epoch) if entry is not None else tail_epoch
        if epoch < current:
            return Fenced(current)
        if entry is not None and epoch == entry.epoch:
            for batch in entry.batches:
                if batch.first_sequence == first and batch.last_sequence == last:
                    return Duplicate(batch.base_offset, batch.last_offset)
        if _Reservation(epoch, first, last) in pending:
            return IN_FLIGHT
        if epoch > tail_epoch:
            return NEW if first == 0 else OutOfOrder(0)
        expected = next_sequence(tail_last)
        return NEW if first == expected else OutOfOrder(expected)

    def reserve(self, header: BatchHeader) -> Verdict:
        """:meth:`check`, and when the batch is new, count it as being appended until recorded or released."""
        verdict = self.check(header)
        if isinstance(verdict, New) and _idempotent(header):
            self._pending.setdefault(header.producer_id, []).append(_reservation(header))
        return verdict

    def reserve_all(self, headers: Sequence[BatchHeader]) -> Verdict:
        """Reserve every batch of one append, or none of them.

        :class:`New` when all are new (all reserved); :class:`Duplicate` spanning the whole append when every
        batch is a retry, in offset order; otherwise the first refusal (a mix of
        retried and new batches is :class:`Invalid`: no producer re-sends half an append).
        """
        verdicts: list[Verdict] = []
        for header in headers:
            verdicts.append(self.reserve(header))
            if not isinstance(verdicts[-1], New | Duplicate):
                break
        if len(verdicts) == len(headers) and all(isinstance(v, New) for v in verdicts):
            return NEW
        for header, verdict in zip(headers, verdicts, strict=False):
            if isinstance(verdict, New):
                self.release(header)
        if not isinstance(verdicts[-1], New | Duplicate):
            return verdicts[-1]
        duplicates = [v for v in verdicts if isinstance(v, Duplicate)]
        if len(duplicates) == len(headers) and all(a.last_offset < b.base_offset for a, b in pairwise(duplicates)):
            return Duplicate(duplicates[0].base_offset, duplicates[-1].last_offset)
        return Invalid("an append mixes retried and new batches")

    def release(self, header: BatchHeader) -> bool:
        """Forget the reservation of a batch that was not written (refused, cancelled, failed); True if held."""
        pending = self._pending.get(header.producer_id)
        if not pending:
            return False
        try:
            pending.remove(_reservation(header))
        except ValueError:
            return False
        if not pending:
            del self._pending[header.producer_id]
        return True

    def release_all(self) -> None:
        """Forget every reservation: the replica stops being leader, its appends in flight will fail."""
        self._pending.clear()

    # ------------------------------------------------------------------------------------- every replica

    def record(self, header: BatchHeader) -> None:
        """Remember a batch written at ``header.base_offset`` (its header as stored, offsets assigned).

        Called for every batch the log stores, in any role, so unconditional: whatever the log holds is the
        truth. Batches that cannot be a producer's (not idempotent, or invalid fields) are ignored. The leader
        may record a producer's batches out of offset order (pipelined appends finishing out of order): the
        result is the same as recording them in offset order.
        """
        if not _idempotent(header) or _invalid(header) is not None:
            return
        pid, epoch = header.producer_id, header.producer_epoch
        if self._pending.get(pid):
            self.release(header)
        self._expired.pop(pid, None)
        batch = BatchMetadata(
            header.base_sequence,
            last_sequence(header.base_sequence, header.last_offset_delta),
            header.base_offset,
            header.last_offset,
            header.max_timestamp,
        )
        entry = self._entries.get(pid)
        if entry is None:
            self._entries[pid] = ProducerEntry(pid, epoch, (batch,), complete=True)
        elif batch.base_offset > entry.last_offset:  # the usual case: the producer's newest batch
            if epoch != entry.epoch:
                self._entries[pid] = ProducerEntry(pid, epoch, (batch,), complete=False)
            else:
                self._entries[pid] = _trimmed(entry, (*entry.batches, batch))
        elif any(b.base_offset == batch.base_offset for b in entry.batches):
            return  # recorded already (a replay overlapping what a snapshot holds)
        elif epoch != entry.epoch:
            # An older batch of another epoch: in offset order it came before the epoch change that dropped it.
            self._entries[pid] = replace(entry, complete=False)
        else:
            ordered = tuple(sorted((*entry.batches, batch), key=lambda b: b.base_offset))
            self._entries[pid] = _trimmed(entry, ordered)

    def record_appended(self, headers: Sequence[BatchHeader], base_offset: int) -> None:
        """:meth:`record` the batches of one leader append, written contiguously from ``base_offset``."""
        offset = base_offset
        for header in headers:
            placed = header._replace(base_offset=offset)
            self.record(placed)
            offset = placed.next_offset

    def rebuild(self, headers: Iterable[BatchHeader]) -> int:
        """Replay stored batches, in offset order, on top of this state; return how many were read.

        Start from an empty table and the log start, or from a snapshot and the log after its offset.
        """
        count = 0
        for header in headers:
            self.record(header)
            count += 1
        return count

    def truncate_to(self, offset: int) -> bool:
        """The log lost every batch that reaches ``offset`` or beyond: forget them.

        Returns whether the state is still exactly what a rebuild of the shortened log would give. It is not
        when a producer lost batches and older ones of it had already left its window: the caller then
        rebuilds from a snapshot at or below the new log end and the log after it. Reservations are kept.
        """
        exact = True
        for pid, entry in list(self._entries.items()):
            kept = tuple(b for b in entry.batches if b.last_offset < offset)
            if len(kept) == len(entry.batches):
                continue
            exact = exact and entry.complete
            if kept:
                self._entries[pid] = replace(entry, batches=kept)
            else:
                del self._entries[pid]
        return exact

    def replace_with(self, other: ProducerStateTable) -> None:
        """Take ``other``'s entries and tombstones (a rebuild after an inexact truncation), keeping this table's
        reservations: the table object is shared by a replica's roles, so it is refilled rather than swapped."""
        self._entries = dict(other._entries)
        self._expired = {pid: t for pid, t in other._expired.items() if pid not in self._entries}

    def remove_expired(self) -> int:
        """Forget producers idle for ``producer_expiry_ms`` (by batch time), and older tombstones; return count.

        A producer with a batch being appended is kept. Run it periodically; expiry uses the injected clock.
        """
        now = self._clock.now_ns()
        removed = 0
        for pid, entry in list(self._entries.items()):
            if pid not in self._pending and now - entry.last_timestamp >= self._expiry_ns:
                del self._entries[pid]
                self._expired[pid] = ExpiredProducer(pid, entry.epoch, now)
                removed += 1
        for pid, tombstone in list(self._expired.items()):
            if now - tombstone.expired_at_ns >= self._expiry_ns:
                del self._expired[pid]
        return removed


def _reservation(header: BatchHeader) -> _Reservation:
    first = header.base_sequence
    return _Reservation(header.producer_epoch, first, last_sequence(first, header.last_offset_delta))


def _trimmed(entry: ProducerEntry, batches: tuple[BatchMetadata, ...]) -> ProducerEntry:
    """``entry`` with ``batches``, the oldest dropped beyond :data:`WINDOW` (then no longer complete)."""
    if len(batches) <= WINDOW:
        return replace(entry, batches=batches)
    return replace(entry, batches=batches[-WINDOW:], complete=False)


__all__ = [
    "DEFAULT_PRODUCER_EXPIRY_MS",
    "IN_FLIGHT",
    "MAX_PRODUCER_EPOCH",
    "MAX_SEQUENCE",
    "NEW",
    "NO_PRODUCER_ID",
    "UNKNOWN_PRODUCER",
    "WINDOW",
    "BatchMetadata",
    "Duplicate",
    "ExpiredProducer",
    "Fenced",
    "InFlight",
    "Invalid",
    "New",
    "OutOfOrder",
    "ProducerEntry",
    "ProducerStateTable",
    "UnknownProducer",
    "Verdict",
    "last_sequence",
    "next_sequence",
]
