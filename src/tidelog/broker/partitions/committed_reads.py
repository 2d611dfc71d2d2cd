"""What a reader sees of a replica: committed batches only, whichever replica serves them.

A subscription or a fetch reads a :class:`~tidelog.broker.partitions.partition.Partition` (the leader) or, with
``readISRReplica``, a :class:`~tidelog.broker.partitions.followed.FollowedPartition`. Both serve the same way —
whole batches from the one holding the offset, never reaching the replica's high watermark — and differ only
in where that high watermark comes from (the ISR's log ends at the leader, the leader's word at a follower). So
the rules live here once, and each class supplies ``high_watermark``.

Readers waiting at the tail also wait for the replica's metadata to change (:meth:`CommittedReads.next_change`):
a partition set read-only ends its subscriptions at its end (Liftbridge's "End of readonly partition").
Tiered storage: when the partition's sealed segments are offloaded (:mod:`tidelog.broker.tiering`), its history
starts in the object store. ``log_start`` is then the first remote offset, and
:meth:`CommittedReads.read_committed_async` reads offsets below the local log start from the store (``tier``,
the broker's :class:`~tidelog.broker.tier_catalog.TierCatalog`); replication keeps using ``local_log_start``.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import EncryptionError, UnavailableError
from tidelog.storage.encryption import open_batches
from tidelog.storage.log import Log


class RemoteTier(Protocol):
    """Where a partition's offloaded history is (:class:`~tidelog.broker.tier_catalog.TierCatalog`)."""

    def remote_start(self, stream: str, partition: int) -> int | None: ...

    def remote_end(self, stream: str, partition: int) -> int | None: ...

    def remote_offset_for_timestamp(self, stream: str, partition: int, timestamp_ns: int) -> int | None: ...

    async def read(self, stream: str, partition: int, offset: int, max_bytes: int, max_offset: int) -> bytes: ...


class CommittedReads:
    """Reads bounded by ``high_watermark``; subclasses set ``stream``, ``record`` and ``log``."""

    stream: StreamRecord
    record: PartitionRecord
    log: Log
    bytes_out: int = 0  # record bytes served to consumers' fetches (for the metrics, read at scrape time)
    records_out: int = 0  # offsets served to consumers' fetches sent from the file (plain TCP)
    _changes: asyncio.Event | None = None

    def next_change(self) -> asyncio.Event:
        """An event set when this replica's metadata record next changes (for readers waiting at the tail)."""
        if self._changes is None:
            self._changes = asyncio.Event()
        return self._changes

    def record_changed(self) -> None:
        """Wake the readers waiting on :meth:`next_change`."""
        changes, self._changes = self._changes, None
        if changes is not None:
            changes.set()

    @property
    def at_readonly_end(self) -> bool:
        """Read-only, and everything in the log is committed: a reader at the high watermark has read it all."""
        return self.record.readonly and self.high_watermark >= self.log.end_offset

    tier: RemoteTier | None = None  # set by the manager on a broker with a tiered store

    @property
    def high_watermark(self) -> int:
        """The offset after the last record this replica knows is committed (Kafka's meaning)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return f"{self.stream.name}/{self.record.id}"

    @property
    def log_context(self) -> dict[str, object]:
        """The ``extra=`` of a log line about this replica: its stream and partition as fields of a JSON line."""
        return {"stream": self.stream.name, "partition": self.record.id}

    @property
    def subject(self) -> str:
        return self.stream.partition_subject(self.record.id)

    @property
    def log_start(self) -> int:
        """The oldest offset a reader may ask for: in the tiered store when segments were offloaded."""
        local = self.log.start_offset
        remote = None if self.tier is None else self.tier.remote_start(self.stream.name, self.record.id)
        return local if remote is None else min(remote, local)

    @property
    def local_log_start(self) -> int:
        """The oldest offset on this broker's disk (what replication copies from)."""
        return self.log.start_offset

    @property
    def remote_range(self) -> tuple[int, int] | None:
        """``[start, end)`` of the offsets in the tiered store; None when it holds none of this partition's."""
        if self.tier is None:
            return None
        start = self.tier.remote_start(self.stream.name, self.record.id)
        end = self.tier.remote_end(self.stream.name, self.record.id)
        return None if start is None or end is None else (start, end)

    @property
    def log_end(self) -> int:
        return self.log.end_offset

    def read_committed(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, never reaching the high watermark; an encrypted
        stream's opened (:mod:`tidelog.storage.encryption`), as a consumer reads them."""
        hw = min(self.high_watermark, self.log.end_offset)  # a follower's HW may briefly run ahead of its log
        if offset >= hw:
            return b""
        return self.readable(self.log.read(offset, max_bytes, max_offset=hw))

    def is_remote(self, offset: int) -> bool:
        """Whether a read at ``offset`` goes to the tiered store (it is below the local log start)."""
        return self.tier is not None and offset < self.log.start_offset

    async def read_committed_async(self, offset: int, max_bytes: int) -> bytes:
        """:meth:`read_committed`, falling through to the tiered store below the local log start. A gap between
        the store's end and the local start (nothing there) reads on from the local start."""
        if self.tier is None or offset >= self.log.start_offset:
            return self.read_committed(offset, max_bytes)
        hw = min(self.high_watermark, self.log.end_offset)
        data = await self.tier.read(self.stream.name, self.record.id, offset, max_bytes, hw)
        if not data:
            start, end = (
                self.tier.remote_start(self.stream.name, self.record.id),
                self.tier.remote_end(self.stream.name, self.record.id),
            )
            if start is not None and end is not None and start <= offset < end:  # listed, yet nothing: never skip it
                raise UnavailableError(f"{self.name}: offset {offset} is in the tiered store but was not read; retry")
            return self.read_committed(max(offset, self.log.start_offset), max_bytes)
        return self.readable(data)

    def readable(self, data: bytes) -> bytes:
        """Batches read from this replica's log as a consumer gets them: opened when the stream is encrypted
        (ENCRYPTION when this broker holds no keyring for it; the stored bytes are untouched)."""
        if not self.stream.config.encryption or not data:
            return data
        if self.log.keyring is None:
            raise EncryptionError(self.keyless_reason())
        return open_batches(data, self.log.keyring)

    def keyless_reason(self) -> str:
        """Why this broker cannot encrypt or decrypt the partition (its stream is encrypted, it has no keyring)."""
        if not self.record.data_keys:
            return f"{self.name} is encrypted but its metadata holds no data keys"
        return (
            f"{self.name} is encrypted and this broker cannot unwrap its data keys: it has no master key "
            "(encryption_key, encryption_key_file or TIDELOG_ENCRYPTION_KEY), or another one than wrapped them; "
            "nothing is lost, a broker with the right key serves it"
        )

    def offset_for_timestamp(self, timestamp_ns: int) -> int:
        """First offset whose timestamp is at or after ``timestamp_ns`` (the high watermark when none). In the
        tiered store's range, the first offset of the remote segment holding such a record (a reader starting
        there skips nothing; the records before it in that segment are older)."""
        if self.tier is not None:
            remote = self.tier.remote_offset_for_timestamp(self.stream.name, self.record.id, timestamp_ns)
            if remote is not None and remote < self.log.start_offset:
                return remote
        found = self.log.offset_for_timestamp(timestamp_ns)
        hw = self.high_watermark
        return hw if found is None or found > hw else found
