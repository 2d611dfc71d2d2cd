"""A partition this broker follows: its log, its fetcher, and reads for ``readISRReplica`` subscribers.

Liftbridge lets a subscriber read from any ISR member (``readISRReplica``) to spread read load. A follower
serves such reads bounded by *its own* high watermark — the one its leader last told it — so a subscriber of a
follower never sees anything that is not committed, only sees it a little later than at the leader. The
follower's HW only grows while it is fetched from one leader (unless its leader has it cut its log below it);
it may be lower after a restart (the checkpoint is written once a second), never above what was committed.

What the replica *knows* committed (:attr:`FollowedPartition.known_committed`) is kept apart, unclamped: its own
checkpoint may say more than its log holds (a disk lost records), and that stays true until its leader's word
moves it. It is what the replica checkpoints and what a promotion starts from, so a follower that lost records
and is elected before it caught up suspends appends instead of leading without them (fail to safety,
:mod:`tidelog.broker.partitions.safety`).

A follower also owns the replica's producer state (``producers``): its fetcher keeps it in step with the log,
and a promotion hands the very same table to the new leader, so a producer's retry after a failover is
recognized (:mod:`tidelog.replication.idempotence.producer_state`).
"""

from __future__ import annotations

import logging

from tidelog.broker.partitions.committed_reads import CommittedReads
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.replication.follower.fetcher import ReplicaFetcher
from tidelog.replication.follower.offset_waiters import OffsetWaiters
from tidelog.replication.hw_checkpoint import checkpointed_hw, read_hw_checkpoint, write_hw_checkpoint
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import take_snapshot
from tidelog.storage.log import Log

log = logging.getLogger(__name__)


class FollowedPartition(CommittedReads):
    """One followed partition. ``fetcher`` is None while the partition has no live leader."""

    def __init__(
        self,
        stream: StreamRecord,
        record: PartitionRecord,
        log_: Log,
        producers: ProducerStateTable | None = None,
        *,
        high_watermark: int | None = None,
    ) -> None:
        """``high_watermark``: what is known committed (a demoted leader's); read from the checkpoint if None."""
        self.stream = stream
        self.record = record
        self.log = log_
        self.producers = ProducerStateTable() if producers is None else producers
        self.fetcher: ReplicaFetcher | None = None
        self.leader: tuple[str, int, str] | None = None  # (leader id, leader epoch, wire address) fetched from
        self.checkpointed = -1
        self._hw = OffsetWaiters(read_hw_checkpoint(log_) if high_watermark is None else high_watermark)
        self.known_committed = checkpointed_hw(log_) if high_watermark is None else high_watermark
        """What this replica knows is committed, not clamped to its log (module docstring)."""

    # -- what readers see (CommittedReads, as at the leader) --

    @property
    def high_watermark(self) -> int:
        return self._hw.position

    async def wait_for_data(self, offset: int, timeout: float | None) -> bool:
        return await self._hw.wait_beyond(offset, timeout)

    # -- fed by the fetcher --

    def high_watermark_moved(self, hw: int) -> None:
        """The fetcher learnt a new HW from the leader, or cut the log below the one it knew (lower)."""
        if hw < self._hw.position:
            self._hw.reset(hw)
            self.known_committed = hw
            return
        self._hw.advance(hw)
        self.known_committed = max(self.known_committed, hw)

    def starting_high_watermark(self) -> int:
        """What a new fetcher (or a promotion to leader) may assume is committed."""
        if self.fetcher is not None:
            return max(self.fetcher.high_watermark, self._hw.position)
        return self._hw.position

    def snapshot_producers(self) -> None:
        """Snapshot the producer state at the log end: call only with no fetcher running (it is exact then)."""
        if not self.log.closed:
            take_snapshot(self.producers, ProducerSnapshots(self.log.directory), self.log.end_offset)

    async def checkpoint(self) -> None:
        """Persist what this replica knows is committed, if it moved (the manager's once-a-second loop); a
        failure is logged and retried at the next one."""
        hw = self.known_committed  # the fetcher's HW, or more while the log lacks what it knew
        if hw == self.checkpointed:
            return
        try:
            await write_hw_checkpoint(self.log.directory, hw)
            self.checkpointed = hw
        except Exception:
            log.warning(
                "%s: cannot write the follower's high-watermark checkpoint in %s; retried at the next one",
                self.name,
                self.log.directory,
                exc_info=True,
                extra=self.log_context,
            )

    async def close(self) -> None:
        """Checkpoint what this replica knows is committed, then close its log (its fetcher is stopped)."""
        await write_hw_checkpoint(self.log.directory, self.known_committed)
        self.snapshot_producers()  # no fetcher runs: the state is exact at the log end
        await self.log.close()
