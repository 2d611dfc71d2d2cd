"""Fail to safety (seed 002): a leader that finds evidence of a greater offset than its own log end refuses appends
until an operator confirms the head with ``tidelog partition reset-head``.

Consistency is lost when a partition's committed records are missing from the log of its leader: a disk lost
files, a bug or a bad deploy cut a log, every replica crashed under flush ``never``. A leader that went on
appending would hand out the lost offsets again, to different records, and its followers would cut their own
copies of the lost records to match it (epoch truncation trusts the leader). Gazette's answer, taken here: first
and foremost lose nothing more. The leader *suspends* appends — every produce, NATS-ingested write and
transactional append is refused with PARTITION_SUSPENDED naming the evidence — while reads of what is committed
go on, and followers keep what they hold. The operator diagnoses, then confirms a head; appends resume there.

The evidence, and why each is conclusive (no race produces it):

- **A follower fetches beyond the log end** (:meth:`LeaderSafety.fetched_beyond_end`). A REPLICA_FETCH names
  the follower's log end. The fetch is fenced to this leadership (leader epoch) before it gets here, and a
  follower only fetches after epoch truncation on the same connection (``ReplicaFetcher``: truncating, then
  fetching). Every branch of that truncation leaves the follower at or below where the leader said its epoch
  ends, which is at or below the leader's log end (:mod:`tidelog.replication.follower.truncation`) — except the fallback
  when the leader knows no matching epoch, where the follower keeps what *it* knew committed: that being above
  the leader's end is exactly the evidence. A follower still in truncation has not fetched; one that truncated
  against an earlier leadership is fenced by the epoch. The leader's log end is read from the log itself,
  updated as a write lands (not from the write listener, which runs after), and it never shrinks while it
  leads: a confirmed head (below) is cut before the leadership starts, and a transactional append reaches the
  log whole, at its commit. So a fetch beyond the end means the follower holds offsets the leader lacks. A
  follower whose log *starts* beyond the leader's end (retention, far-horizon catch-up) held such offsets too.
  So does a follower sent a write that then failed on the leader with an I/O error (a write into zero-filled
  room goes to the followers just before the leader's own ``pwritev``: :mod:`tidelog.storage.write_observer`); those
  offsets were never committed, but the leader must not hand them out again either.
- **The log ends below the checkpointed high watermark** (:func:`start_evidence`). A leader starts from the HW
  it knew — the checkpoint of a log opened now, what a promoted follower knew
  (:attr:`~tidelog.broker.partitions.followed.FollowedPartition.known_committed`, which starts from its own
  checkpoint), or the previous leadership's on a re-election — and the HW is only ever below what every ISR
  member had made durable (with flush ``always``). A log ending below it lost committed records: files lost or
  cut, or (flush ``interval``/``never``) a crash of more than the replication could cover. A follower learns
  its HW from its leader, bounded by its own log end, and lowers it when its leader has it cut its log (an
  unclean election, or a head an operator confirmed): its leader's word, not evidence. Single-replica
  partitions keep no checkpoint (their log end is their HW): nothing to compare with.
- **A confirmed head that could not be applied** (:func:`start_evidence`): see below.

While suspended the leader also refuses EPOCH_END_OFFSET (a follower would cut its log to the leader's end,
losing the copies of what the leader lost) and answers a fetch beyond its end with PARTITION_SUSPENDED instead
of OFFSET_OUT_OF_RANGE (on which a follower cuts its log to the leader's end). Followers retry with backoff and
keep their data; those that cannot truncate stop fetching and leave the ISR after ``replica_lag_time_max``,
and rejoin after the reset. Fetches within the log go on.

The suspension is recorded in the partition's metadata (``PartitionRecord.suspended``) through the controller,
fenced by the controller epoch and the leader epoch (a deposed leader's report is refused): it survives
restarts and failover — every leader of the partition refuses appends while it is set — and shows in
``tidelog cluster status`` and ``stream describe``. Until the controller has it, the leader's own finding
suspends it; the evidence of a short log also stays on disk (the HW checkpoint is not rewritten meanwhile).

**Reset-head.** The operator confirms the head: the leader's log end, or a lower offset ``N`` not below its
high watermark (a committed offset is never reused: consumers may have read it). The controller clears the
suspension, bumps the leader epoch and records the head for the new epoch (``head_epoch``, ``head_offset``).
The leader's broker starts the new leadership on its open log and first cuts it to ``N``
(:func:`apply_confirmed_head`, before any append of the new epoch), unless its HW moved above ``N``
meanwhile: then it suspends again (the third evidence). The epoch bump restarts every follower's fetcher, so
each truncates again against the confirmed log: where the leader knows no matching epoch (its epoch file was
lost with its data) it answers with its log start (:func:`epoch_end_after_reset`), so a follower's divergent
tail is never kept, and a follower beyond the head is told OFFSET_OUT_OF_RANGE and cuts to it
(:meth:`LeaderSafety.tolerates_beyond_end`): the operator gave those offsets up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidelog.clock import Clock
from tidelog.metadata.records import PartitionRecord
from tidelog.protocol.errors import FencedLeaderEpochError, PartitionSuspendedError, TidelogError
from tidelog.replication.hw_checkpoint import write_hw_checkpoint
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import after_truncation
from tidelog.storage.epoch_cache import UNDEFINED_EPOCH, EpochEndOffset
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

ReportSuspension = Callable[[PartitionRecord, str], Awaitable[None]]
"""Asks the controller to record a suspension: (the record the leader acts on, the evidence)."""

MAX_REASON_CHARS = 400  # the evidence is one line in the record, the error and the CLI
REPORT_RETRY_MAX = 5.0  # seconds between attempts to reach the controller, at most


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why a leader stopped taking appends: one line, naming the replicas and offsets involved."""

    reason: str


def start_evidence(record: PartitionRecord, broker_id: str, log_: Log, initial_hw: int | None) -> Evidence | None:
    """What a new leadership finds before its first append (module docstring), or None.

    ``initial_hw`` is what this replica knew committed, unclamped: the raw HW checkpoint of a log opened now, a
    promoted follower's HW, or the previous leadership's (None: a single replica, which keeps no checkpoint).
    """
    end = log_.end_offset
    who = f"leader {broker_id} (epoch {record.leader_epoch})"
    if record.head_epoch == record.leader_epoch and log_.latest_epoch < record.head_epoch and end > record.head_offset:
        hw = end if initial_hw is None else min(initial_hw, end)
        return Evidence(
            f"{who}: the head {record.head_offset} confirmed by reset-head was not applied: the log still ends at "
            f"{end}, its high watermark is {hw} (committed offsets are never cut); confirm the head again"
        )
    if initial_hw is not None and initial_hw > end:
        return Evidence(
            f"{who}: its log ends at {end}, below its checkpointed high watermark {initial_hw}: "
            f"records known committed ({end}..{initial_hw - 1}) are missing from it"
        )
    return None


async def apply_confirmed_head(
    record: PartitionRecord,
    log_: Log,
    high_watermark: int | None,
    producers: ProducerStateTable,
    *,
    rewrite_checkpoint: bool,
) -> None:
    """Before a leadership starts: cut the log to the head an operator confirmed for it, once.

    Only for the leadership the head was confirmed for (``head_epoch``) and only before its first append (an
    append of that epoch records it in the epoch cache: from then on the head is applied and the log grew past
    it legitimately). Never below ``high_watermark`` (None: a single replica, whose whole log is committed):
    then nothing is cut, and :func:`start_evidence` suspends the partition again. A cut falls on a batch
    boundary at or below the head (batches go whole), which is at or above the HW, a batch boundary itself.

    ``rewrite_checkpoint``: the leadership restarts on a log this broker held open (the HW is exact): write it
    now, replacing a checkpoint kept as evidence during the suspension, so that a restart right after the reset
    does not find the old evidence again. A log opened just now keeps its checkpoint: it may be new evidence.
    """
    if record.head_epoch != record.leader_epoch or log_.latest_epoch >= record.head_epoch:
        return
    end = log_.end_offset
    committed = end if high_watermark is None else min(high_watermark, end)
    head = record.head_offset
    name = f"{record.stream}/{record.id}"
    if head < end:
        if committed > head:
            log.error("%s: the confirmed head %d is below the high watermark %d: not truncating", name, head, committed)
            return
        log.warning("%s: truncating from %d to the head %d confirmed by reset-head", name, end, head)
        try:
            await log_.truncate_to(head)
        except Exception:  # the leadership starts on the uncut log, suspended (start_evidence)
            log.exception("%s: could not truncate to the confirmed head %d", name, head)
            return
        after_truncation(producers, log_, ProducerSnapshots(log_.directory))
    if rewrite_checkpoint and high_watermark is not None:
        await write_hw_checkpoint(log_.directory, min(high_watermark, log_.end_offset))


def epoch_end_after_reset(
    record: PartitionRecord, asked_epoch: int, answer: EpochEndOffset, log_start: int
) -> EpochEndOffset:
    """The EPOCH_END_OFFSET answer of a leader whose head was confirmed for its current leadership.

    A leader that lost its data may know no epoch at or below the follower's (``answer`` undefined); the
    follower would then keep its log up to the HW it knew, and, should the leader have written that range again
    in the new epoch, keep records that differ from the leader's at the same offsets. Answering "your epoch ends
    at my log start" makes it cut everything it cannot match and copy the confirmed log instead. Any other
    answer, and any leadership whose head was not confirmed, is unchanged.
    """
    if answer.epoch != UNDEFINED_EPOCH or asked_epoch < 0 or record.head_epoch != record.leader_epoch:
        return answer
    return EpochEndOffset(asked_epoch, log_start)


class LeaderSafety:
    """One leadership's suspension: the record's (from etcd) and its own finding (until etcd has it).

    Owned by a :class:`~tidelog.broker.partitions.partition.Partition`; its report task goes to the partition's task
    list (``spawn``) so that closing the partition cancels it.
    """

    def __init__(
        self,
        name: str,
        record: PartitionRecord,
        report: ReportSuspension | None,
        spawn: Callable[[asyncio.Task[None]], None],
        clock: Clock,
    ) -> None:
        self._name = name
        self._clock = clock
        self._record = record
        self._report = report
        self._spawn = spawn
        self._found: Evidence | None = None  # this leadership's own evidence, until the record shows a suspension

    @property
    def reason(self) -> str:
        """Why appends are refused; empty when they are not."""
        if self._record.suspended:
            return self._record.suspended
        return self._found.reason if self._found is not None else ""

    def refusal(self) -> PartitionSuspendedError | None:
        """The error a write (or a follower's truncation) gets while suspended, else None."""
        reason = self.reason
        if not reason:
            return None
        record = self._record
        return PartitionSuspendedError(
            f"{self._name}: appends suspended (fail to safety): {reason}. Check the replicas, then confirm the "
            f"head with `tidelog partition reset-head {record.stream} {record.id}`"
        )

    def check_appendable(self) -> None:
        """Raise the refusal while suspended (on every append: two attribute reads when not)."""
        if self._record.suspended or self._found is not None:
            refusal = self.refusal()
            assert refusal is not None
            raise refusal

    def tolerates_beyond_end(self) -> bool:
        """Whether a follower beyond the log end is expected: the head was confirmed for this leadership, and the
        operator gave up what lay beyond it (the follower is told OFFSET_OUT_OF_RANGE and cuts its log)."""
        return self._record.head_epoch == self._record.leader_epoch

    def update(self, record: PartitionRecord) -> None:
        """A newer record of the same leadership. Once it shows a suspension, the metadata holds it: this
        leadership's own finding is no longer needed (and a suspension cleared in etcd is cleared here)."""
        self._record = record
        if record.suspended:
            self._found = None

    def fetched_beyond_end(self, replica: str, offset: int, log_end: int, broker_id: str) -> None:
        """Evidence (a) of the module docstring, unless the head was confirmed for this leadership."""
        if self.tolerates_beyond_end():
            log.info(
                "%s: replica %s fetches at %d, beyond the confirmed head (log end %d): it will cut its log",
                self._name,
                replica,
                offset,
                log_end,
            )
            return
        self.found(
            Evidence(
                f"replica {replica} fetched from offset {offset}, beyond the log end {log_end} of leader "
                f"{broker_id} (epoch {self._record.leader_epoch}): it holds offsets this leader lacks"
            )
        )

    def found(self, evidence: Evidence | None) -> None:
        """Suspend appends on ``evidence`` (the first finding counts; later ones are logged) and have the
        controller record it."""
        if evidence is None:
            return
        reason = evidence.reason[:MAX_REASON_CHARS]
        if self.reason:
            if reason != self.reason:
                log.error("%s: more evidence of lost consistency (suspended already): %s", self._name, reason)
            return
        log.error("%s: consistency lost, appends suspended until reset-head: %s", self._name, reason)
        self._found = Evidence(reason)
        if self._report is not None:
            self._spawn(asyncio.create_task(self._record_suspension(reason), name=f"suspend-{self._name}"))

    async def _record_suspension(self, reason: str) -> None:
        """Report to the controller until it has it (then the metadata update reaches :meth:`update`); give up
        only when the controller refuses for good (this leadership was deposed: its successor decides)."""
        assert self._report is not None
        delay = 0.1
        while self._found is not None:
            try:
                await self._report(self._record, reason)
                return
            except TidelogError as exc:
                # Fenced: this leadership was deposed (a newer epoch or another leader), which no retry changes.
                if isinstance(exc, FencedLeaderEpochError) or not exc.retriable:
                    log.warning("%s: the controller refused the suspension: %s", self._name, exc)
                    return
                failure: Exception = exc
            except (OSError, ConnectionError) as exc:
                failure = exc
            log.warning("%s: could not record the suspension (%s); retrying in %.1fs", self._name, failure, delay)
            await self._clock.sleep(delay)
            delay = min(delay * 2, REPORT_RETRY_MAX)
