"""One partition led by this broker: its log, its high watermark, and the rules of writing to it.

Every way in (NATS ingest, gRPC Publish, the wire protocol's produce) ends in :meth:`Partition.append` with
whole record batches; every way out (gRPC Subscribe, wire fetch) reads committed batches with
:meth:`Partition.read_committed` and long-polls with :meth:`Partition.wait_for_data`. Keeping those two doors
in one type is what keeps the guarantees the same whichever protocol a client speaks:

- nothing is acknowledged before the ack policy is met (``ALL``: below the high watermark; with flush
  ``always`` that also means fsynced);
- readers never see an offset at or above the high watermark;
- a read-only partition refuses writes and stores nothing; a paused one resumes on the first write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tidelog.api.errors import (
    NotEnoughReplicasError,
    ReadonlyError,
    RequestTimeoutError,
    UnavailableError,
)
from tidelog.api.wire.messages import Acks
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.replication.highwater import HighWatermark
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
    ) -> None:
        self.stream = stream
        self.record = record
        self.log = log_
        self.broker_id = broker_id
        self.min_isr = min_isr
        self._on_resume = on_resume
        self._hw = HighWatermark(broker_id, record.isr or (broker_id,), log_.end_offset)
        self._closed = False
        self.first_received_ns = 0
        self.latest_received_ns = 0

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
        self._hw.set_isr(record.isr or (self.broker_id,))

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

    async def close(self) -> None:
        """Stop serving: wake waiters with UNAVAILABLE, flush and close the log."""
        if self._closed:
            return
        self._closed = True
        self._hw.fail_waiters(UnavailableError(f"partition {self.name} is closing"))
        await self.log.close()
