"""Changing an existing stream's record: more partitions, or other settings, each a compare-and-swap in etcd.

Both changes compare the stream key with the exact record the caller decided from, so a change decided on a
stale view (the mirror lags etcd, or another change landed first) writes nothing and the caller decides again.
The ``transact`` callable is the controller's :class:`~tidelog.metadata.fenced_writer.FencedWriter`'s (fenced by
the controller epoch) or :func:`~tidelog.metadata.stream_creation.plain_transact` outside a controller.

**Adding partitions** writes the new partition records first, in transactions of at most ``chunk`` records
(etcd's ``--max-txn-ops``), then the stream record with its new partition count. The mirror holds back a
partition whose id is at or above its stream's partition count (:class:`~tidelog.metadata.mirror.MetadataMirror`),
so brokers and clients see the new partitions all at once, when the stream record lands, or never. Partition
records left behind by an attempt that failed midway stay invisible; the next attempt writes over them, and
deleting the stream deletes them with the rest.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from tidelog.metadata.records import Keys, PartitionRecord, StreamRecord, decode_stream, encode
from tidelog.metadata.stream_creation import CHUNK_PARTITIONS, Transact, value_of


class ChangeOutcome(enum.Enum):
    """What a stream change found."""

    CHANGED = "changed"
    """etcd held the record the change was decided from; the new one is written."""
    STALE = "stale"
    """etcd holds another record of the stream (or none): nothing was written; decide again."""


class StreamChanges:
    """Compare-and-swap changes to stream records through ``transact``."""

    def __init__(self, client: Any, keys: Keys, transact: Transact, *, chunk: int = CHUNK_PARTITIONS) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be at least 1, not {chunk}")
        self._tx = client.transactions
        self._keys = keys
        self._transact = transact
        self._chunk = chunk

    async def alter(self, old: StreamRecord, new: StreamRecord) -> ChangeOutcome:
        """Replace stream record ``old`` with ``new`` (other settings) if etcd still holds ``old``."""
        if old.name != new.name:
            raise ValueError(f"a stream change cannot rename {old.name!r} to {new.name!r}")
        return await self._swap(old, new, ())

    async def add_partitions(
        self, old: StreamRecord, new: StreamRecord, partitions: Sequence[PartitionRecord]
    ) -> ChangeOutcome:
        """Write ``partitions`` (ids ``old.partitions`` up to ``new.partitions - 1``, in order) and then ``new``,
        each transaction only while etcd still holds ``old`` (the module docstring)."""
        ids = [p.id for p in partitions]
        if ids != list(range(old.partitions, new.partitions)) or any(p.stream != old.name for p in partitions):
            raise ValueError(f"partitions {ids} are not {old.name!r}'s {old.partitions}..{new.partitions - 1}")
        last = len(partitions) - self._chunk  # the last chunk goes with the stream record, in one transaction
        start = 0
        while start < max(last, 0):
            chunk = partitions[start : start + self._chunk]
            if await self._swap(old, old, chunk) is ChangeOutcome.STALE:
                return ChangeOutcome.STALE
            start += self._chunk
        return await self._swap(old, new, partitions[start:])

    async def _swap(self, old: StreamRecord, new: StreamRecord, partitions: Sequence[PartitionRecord]) -> ChangeOutcome:
        """Put ``partitions`` (and ``new`` when it differs from ``old``) if the stream key holds ``old``.

        The comparison is on bytes, so it is made with ``encode(old)`` first; should etcd hold the same record in
        other bytes (written by a version with fewer fields), it is made once more with those bytes."""
        tx, key = self._tx, self._keys.stream(old.name)
        puts = [tx.put(self._keys.partition(p.stream, p.id), encode(p)) for p in partitions]
        if new != old:
            puts.append(tx.put(key, encode(new)))
        expected = encode(old)
        for _ in range(2):
            result = await self._transact(compare=[tx.value(key) == expected], success=puts, failure=[tx.get(key)])
            if result.committed:
                return ChangeOutcome.CHANGED
            found = value_of(result.responses[0])
            if found is None or found == expected or decode_stream(found) != old:
                return ChangeOutcome.STALE
            expected = found
        return ChangeOutcome.STALE
