"""The follower's own replica as its fetcher changes it: the log's cuts, the producer state and the high watermark.

The fetcher (:mod:`tidelog.replication.follower.fetcher`) decides, from the leader's answers, what to copy and
where the log must be cut; :class:`LocalReplica` carries the changes out on this broker's copy and keeps what
derives from the log in step with it:

- a truncation or a reset of the log runs as one shielded unit with the producer state's
  (:func:`~tidelog.replication.idempotence.producer_sync.after_truncation`), so a fetcher stopped in the middle
  never leaves batches in the table that the log no longer holds;
- between two appends, idle producers expire and, when due and the log grew, the producer state is snapshotted;
- the follower's high watermark, ``min(leader HW seen, own log end)``, only grows, except when a cut goes below
  it: then it goes down with the log, and ``on_high_watermark`` is told either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tidelog.clock import Clock
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import SNAPSHOT_INTERVAL_NS, after_truncation, take_snapshot
from tidelog.storage.log import Log

log = logging.getLogger(__name__)


class LocalReplica:
    """One followed partition's log, its producer state (optional) and its high watermark."""

    def __init__(
        self,
        log_: Log,
        name: str,
        initial_hw: int,
        producers: ProducerStateTable | None,
        on_high_watermark: Callable[[int], None] | None,
        clock: Clock,
    ) -> None:
        self._log = log_
        self._name = name
        self.hw = max(0, min(initial_hw, log_.end_offset))  # owned by the fetcher's task once started
        self.producers = producers
        self._on_high_watermark = on_high_watermark
        self._clock = clock
        self._snapshots = ProducerSnapshots(log_.directory)
        self._snapshot_offset = -1
        self._snapshot_due_ns = clock.monotonic_ns() + SNAPSHOT_INTERVAL_NS

    async def truncate(self, offset: int, reason: str) -> None:
        """Cut the log back to ``offset`` (not below its start; nothing when it already ends there)."""
        log_ = self._log
        target = max(offset, log_.start_offset)
        if target >= log_.end_offset:
            return
        log.info("%s: truncating from %d to %d: %s", self._name, log_.end_offset, target, reason)
        if target < self.hw:
            log.warning("%s: truncating below the known high watermark %d (unclean election?)", self._name, self.hw)
            self._lower_hw(target)
        # One shielded unit: the log's truncation completes even if this task is stopped, and so must the
        # producer state's, or a promotion would find batches in the table that the log no longer holds.
        await asyncio.shield(self._truncate_with_state(target))

    async def reset(self, offset: int, reason: str) -> None:
        """Empty the log and start it at ``offset``, as :meth:`truncate` would if it could cut below the start."""
        log.warning(
            "%s: resetting the log from %d..%d to %d: %s",
            self._name,
            self._log.start_offset,
            self._log.end_offset,
            offset,
            reason,
        )
        if offset < self.hw:
            self._lower_hw(offset)
        await asyncio.shield(self._reset_with_state(offset))

    async def _reset_with_state(self, offset: int) -> None:
        await self._log.reset_to(offset)
        if self.producers is not None:
            after_truncation(self.producers, self._log, self._snapshots)
            self._snapshot_offset = -1

    async def _truncate_with_state(self, target: int) -> None:
        await self._log.truncate_to(target)
        if self.producers is not None:
            after_truncation(self.producers, self._log, self._snapshots)
            self._snapshot_offset = -1

    def maintain_producers(self) -> None:
        """Between two appends (the state is exact at the log end): expire idle producers and, when due and the
        log grew, snapshot the producer state."""
        assert self.producers is not None
        now = self._clock.monotonic_ns()
        if now < self._snapshot_due_ns:
            return
        self._snapshot_due_ns = now + SNAPSHOT_INTERVAL_NS
        self.producers.remove_expired()
        end = self._log.end_offset
        if end != self._snapshot_offset and take_snapshot(self.producers, self._snapshots, end):
            self._snapshot_offset = end

    def advance_hw(self, leader_hw: int) -> None:
        """The leader's high watermark, as far as this log reaches."""
        hw = min(leader_hw, self._log.end_offset)
        if hw <= self.hw:
            return
        self._report_hw(hw)

    def _lower_hw(self, hw: int) -> None:
        """The log is cut below the known HW, on the leader's word (its epoch answer, or a head an operator
        confirmed): what this replica knows committed goes down with it, or a promotion would take the records
        it no longer holds for lost ones (:mod:`tidelog.broker.partitions.safety`)."""
        self._report_hw(hw)

    def _report_hw(self, hw: int) -> None:
        self.hw = hw
        if self._on_high_watermark is not None:
            try:
                self._on_high_watermark(hw)
            except Exception:
                log.exception("%s: high-watermark callback failed", self._name)
