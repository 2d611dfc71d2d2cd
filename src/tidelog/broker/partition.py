"""One partition led by this broker: its log, its high watermark, and the rules of writing to it.

Every way in (NATS ingest, gRPC Publish, the wire protocol's produce) ends in :meth:`Partition.append` with
whole record batches; every way out (gRPC Subscribe, wire fetch) reads committed batches with
:meth:`Partition.read_committed` and long-polls with :meth:`Partition.wait_for_data`. Keeping those two doors
in one type is what keeps the guarantees the same whichever protocol a client speaks:

- nothing is acknowledged before the ack policy is met (``ALL``: below the high watermark; with flush
  ``always`` that also means fsynced);
- readers never see an offset at or above the high watermark;
- a read-only partition refuses writes and stores nothing; a paused one resumes on the first write.

Replication, leader side: followers fetch with :meth:`Partition.replica_fetched` (their fetch offset is their
acknowledgement and feeds the high watermark) and long-poll on the log end, not the HW, with
:meth:`Partition.wait_for_log_end`, so they copy a batch while the leader is still fsyncing it. The partition
keeps the ISR honest: a follower that stops keeping up is proposed for removal, a caught-up one for re-entry,
both through the controller (``alter_isr``); the HW tracker only takes a new ISR once it is in the metadata,
so the HW never passes data a departing follower lacks before it has left (Rama's ordering).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tidelog.api.errors import (
    NotEnoughReplicasError,
    ReadonlyError,
    RequestTimeoutError,
    UnavailableError,
)
from tidelog.api.wire.messages import Acks
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.replication.followers import Followers
from tidelog.replication.highwater import HighWatermark
from tidelog.replication.hw_checkpoint import write_hw_checkpoint
from tidelog.replication.offset_waiters import OffsetWaiters
from tidelog.storage.log import Log

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an append landed."""

    base_offset: int
    last_offset: int
    received_ns: int
    committed_ns: int


ResumeHook = Callable[["Partition"], Awaitable[None]]
AlterIsr = Callable[[PartitionRecord, tuple[str, ...]], Awaitable[None]]
"""Asks the controller to set a partition's ISR: (the record the leader acts on, the ISR it wants)."""


class Partition:
    """A partition this broker leads."""

    def __init__(
        self,
        stream: StreamRecord,
        record: PartitionRecord,
        log_: Log,
        broker_id: str,
        *,
        min_isr: int,
        on_resume: ResumeHook | None = None,
        initial_hw: int | None = None,
        alter_isr: AlterIsr | None = None,
        replica_lag_time_max: float = 15.0,
    ) -> None:
        self.stream = stream
        self.record = record
        self.log = log_
        self.broker_id = broker_id
        self.min_isr = min_isr
        self._on_resume = on_resume
        self._alter_isr = alter_isr
        self._lag_max_ns = int(replica_lag_time_max * 1e9)
        # With no followers everything written is committed. A leader with followers starts from the HW it
        # knew (checkpointed as a follower or an earlier leader): what lies above was never known committed,
        # and becomes visible only once the ISR has it again.
        start_hw = log_.end_offset if initial_hw is None else min(initial_hw, log_.end_offset)
        self._hw = HighWatermark(broker_id, record.isr or (broker_id,), start_hw, min_isr=min_isr)
        self._hw.replica_caught_up_to(broker_id, log_.end_offset)
        self._log_end = OffsetWaiters(log_.end_offset)
        self.followers = Followers(broker_id, record.replicas, time.monotonic_ns())
        self._epoch_start = log_.end_offset  # the first offset of this leadership (Kafka's ISR-join rule)
        self._isr_change: asyncio.Task[None] | None = None
        self._checkpointed = -1
        self._tasks: list[asyncio.Task[None]] = []
        log_.add_write_listener(self._log_end.advance)
        log_.flusher.allow_inline = len(record.replicas) == 1  # see Flusher.allow_inline
        self._closed = False
        self.first_received_ns = 0
        self.latest_received_ns = 0
        if len(record.replicas) > 1:
            self._tasks.append(asyncio.create_task(self._maintain(), name=f"isr-{self.name}"))

    @property
    def replicated(self) -> bool:
        return len(self.record.replicas) > 1

    # ------------------------------------------------------------------------------------------ identity

    @property
    def name(self) -> str:
        return f"{self.stream.name}/{self.record.id}"

    @property
    def subject(self) -> str:
        return self.stream.partition_subject(self.record.id)

    @property
    def high_watermark(self) -> int:
        """The offset after the last committed record (Kafka's meaning)."""
        return self._hw.value

    @property
    def log_end(self) -> int:
        return self.log.end_offset

    @property
    def log_start(self) -> int:
        return self.log.start_offset

    def update_record(self, record: PartitionRecord) -> None:
        """Take a newer metadata record (paused/readonly flags, ISR)."""
        self.record = record
        self.followers.set_replicas(record.replicas, time.monotonic_ns())
        self._hw.set_isr(record.isr or (self.broker_id,))

    # ------------------------------------------------------------------------------------------ replication

    def replica_fetched(self, replica: str, offset: int) -> bool:
        """A follower fetches at ``offset``: it holds everything below. False when it is no replica of ours."""
        if not self.followers.fetched(replica, offset, self.log.end_offset, time.monotonic_ns()):
            return False
        self._hw.replica_caught_up_to(replica, offset)
        if replica not in self.record.isr and self._isr_change is None and not self._closed:
            ready = self.followers.ready_to_join(self.record.isr, self._hw.value, self._epoch_start)
            if replica in ready:
                self._propose_isr((*self.record.isr, replica))
        return True

    async def wait_for_log_end(self, offset: int, timeout: float, until: asyncio.Future[Any] | None = None) -> bool:
        """Long-poll for followers: wait until the log holds ``offset`` (written, maybe not yet fsynced), at most
        ``timeout`` seconds or until ``until`` resolves (the follower's session winds down); False if not."""
        return await self._log_end.wait_beyond(offset, timeout, until=until)

    def _propose_isr(self, isr: tuple[str, ...]) -> None:
        """Ask the controller for a new ISR, one request at a time; the change applies when it reaches the
        metadata (:meth:`update_record`), not when asked."""
        if self._alter_isr is None or self._isr_change is not None:
            return
        record = self.record

        async def run() -> None:
            try:
                await self._alter_isr(record, isr)  # type: ignore[misc]
            except Exception as exc:  # the controller refused (stale epoch) or was unreachable: retry later
                log.warning("ISR change of %s to %s failed: %s", self.name, ",".join(isr), exc)
            finally:
                self._isr_change = None

        log.info("%s: proposing ISR %s (was %s)", self.name, ",".join(isr), ",".join(record.isr))
        self._isr_change = asyncio.create_task(run(), name=f"alter-isr-{self.name}")

    async def _maintain(self) -> None:
        """Shrink the ISR of lagging followers and checkpoint the HW, on a timer."""
        period = min(1.0, self._lag_max_ns / 2e9)
        while not self._closed:
            await asyncio.sleep(period)
            lagging = self.followers.lagging(self.record.isr, time.monotonic_ns(), self._lag_max_ns)
            if lagging and self._isr_change is None:
                log.warning("%s: followers %s fell behind; removing them from the ISR", self.name, lagging)
                self._propose_isr(tuple(r for r in self.record.isr if r not in lagging))
            await self.checkpoint_hw()

    async def checkpoint_hw(self) -> None:
        """Persist the HW when it moved (a restarted replica must not serve above what was known committed)."""
        hw = self._hw.value
        if hw != self._checkpointed:
            await write_hw_checkpoint(self.log.directory, hw)
            self._checkpointed = hw

    # ------------------------------------------------------------------------------------------ writes

    async def append(self, data: bytes | bytearray | memoryview, acks: Acks, timeout: float) -> Appended:
        """Append whole batches and wait for ``acks``; raise instead of acknowledging what is not stored.

        ``timeout`` bounds the wait for the ack policy only: once the log has the bytes a timeout does not undo
        the write (the client gets a TIMEOUT error and may retry; an idempotent producer dedupes the retry).
        """
        if self._closed:
            raise UnavailableError(f"partition {self.name} is closing")
        if self.record.readonly:
            raise ReadonlyError(f"partition {self.name} is read-only")
        if acks is Acks.ALL and len(self.record.isr or (self.broker_id,)) < self.min_isr:
            raise NotEnoughReplicasError(
                f"partition {self.name} has {len(self.record.isr)} in-sync replicas, min_isr is {self.min_isr}"
            )
        if self.record.paused and self._on_resume is not None:
            await self._on_resume(self)
        received = time.time_ns()
        result = await self.log.append(data, leader_epoch=self.record.leader_epoch)
        # The append's own end, not the log's: a concurrent append may already be written but not yet fsynced.
        self._hw.replica_caught_up_to(self.broker_id, result.last_offset + 1)
        if not self.first_received_ns:
            self.first_received_ns = received
        self.latest_received_ns = received
        if acks is Acks.ALL:
            await self.wait_committed(result.last_offset, timeout)
        return Appended(result.base_offset, result.last_offset, received, time.time_ns())

    # ------------------------------------------------------------------------------------------ reads

    def read_committed(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, never reaching the high watermark."""
        hw = self._hw.value
        if offset >= hw:
            return b""
        return self.log.read(offset, max_bytes, max_offset=hw)

    async def wait_committed(self, offset: int, timeout: float) -> None:
        """Wait until ``offset`` is committed; TIMEOUT error otherwise."""
        if offset < self._hw.value:
            return  # already committed (always, with one replica): no timer, no future
        try:
            async with asyncio.timeout(timeout):  # not wait_for: that wraps the wait in a task of its own
                await self._hw.wait_committed(offset)
        except TimeoutError:
            raise RequestTimeoutError(
                f"offset {offset} of {self.name} was not committed within {timeout:.3f}s"
            ) from None

    async def wait_for_data(self, offset: int, timeout: float | None) -> bool:
        """Long-poll: wait until a record at ``offset`` is committed; False on timeout."""
        return await self._hw.wait_beyond(offset, timeout)

    def offset_for_timestamp(self, timestamp_ns: int) -> int:
        """First offset whose timestamp is at or after ``timestamp_ns`` (the high watermark when none)."""
        found = self.log.offset_for_timestamp(timestamp_ns)
        hw = self._hw.value
        return hw if found is None or found > hw else found

    # ------------------------------------------------------------------------------------------ lifecycle

    async def close(self, *, close_log: bool = True) -> None:
        """Stop serving: wake waiters with UNAVAILABLE; flush and close the log unless it stays open for the
        partition's next role (a leader becoming a follower keeps its log)."""
        if self._closed:
            return
        self._closed = True
        self.log.remove_write_listener(self._log_end.advance)
        self.log.flusher.allow_inline = True
        tasks = [t for t in (*self._tasks, self._isr_change) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        error = UnavailableError(f"partition {self.name} is closing or changing leader")
        self._hw.fail_waiters(error)
        self._log_end.fail_waiters(error)
        if self.replicated:
            try:
                await self.checkpoint_hw()
            except Exception:
                log.warning("could not checkpoint the HW of %s", self.name, exc_info=True)
        if close_log:
            await self.log.close()
