"""Writing partition records for the controller: fenced compare-and-swaps, many at once, or decided and retried.

Every write is a :class:`~tidelog.metadata.fenced_writer.FencedWriter` transaction that also compares each
partition key with the exact record the decision started from: the fence makes etcd refuse a deposed
controller's writes, the compare makes a decision made from a stale view (the mirror lags etcd) fail instead of
overwriting a newer record.

**Batches.** :meth:`PartitionWrites.apply` writes many partitions per transaction (a failover that moves the
leaders of hundreds of partitions is a few transactions, not hundreds): up to :data:`BATCH_PARTITIONS` of them,
and at most :data:`BATCH_BYTES` of records, under etcd's default ``--max-txn-ops`` of 128 (the compare list
holds the two fence comparisons and one per partition; the failure branch one read per partition and two for the
fence) and far under its 1.5 MiB request limit. A transaction is all or nothing, so each partition's compare
still guards only its own record: when one fails, the failure branch reads every key of the batch, the
partitions that lost (etcd holds another record) are dropped as not written, and the rest are sent again, in a
transaction of their own. Each round drops at least one partition, so a batch takes at most as many rounds as it
has partitions that lost, plus one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tidelog import telemetry
from tidelog.metadata.controller_plans import PartitionChange
from tidelog.metadata.fenced_writer import ControllerError, ControllerFencedError, FencedWriter
from tidelog.metadata.records import Keys, PartitionRecord, decode_partition, encode

log = logging.getLogger(__name__)

_ALTER_ATTEMPTS = 8  # compare-and-swap rounds before a partition change (AlterIsr, suspension) gives up: CONFLICT

BATCH_PARTITIONS = 100
"""Partitions per transaction of :meth:`PartitionWrites.apply`: 102 comparisons and 102 reads, under etcd's
default limit of 128 operations per list with room to spare (as :mod:`~tidelog.metadata.stream_creation`)."""

BATCH_BYTES = 512 * 1024
"""Bytes of partition records per transaction (each is sent twice: compared and put), under etcd's default
request limit of 1.5 MiB."""


class PartitionWrites:
    """The controller's writes of partition records, with the writer of the current term passed to each."""

    def __init__(self, client: Any, keys: Keys, broker_id: str, *, concurrency: int) -> None:
        """``concurrency`` bounds the transactions :meth:`apply` has in flight at once; ``broker_id`` (the
        controller's) names it in logs."""
        self._client = client
        self._keys = keys
        self.broker_id = broker_id
        self._concurrency = concurrency

    async def apply(self, writer: FencedWriter, changes: Sequence[PartitionChange]) -> list[bool]:
        """Write ``changes`` in batches (see the module docstring), at most ``concurrency`` transactions in flight;
        whether each landed, in order."""
        if not changes:
            return []
        landed = [False] * len(changes)
        limit = asyncio.Semaphore(self._concurrency)

        async def write(batch: list[int]) -> None:
            async with limit:
                for i in await self._write_batch(writer, [changes[i] for i in batch]):
                    landed[batch[i]] = True
                    self.log_change(changes[batch[i]])

        outcomes = await asyncio.gather(*(write(b) for b in self._batches(changes)), return_exceptions=True)
        errors = [e for e in outcomes if isinstance(e, BaseException)]
        if errors:  # one error for the caller, not a group: a fenced write (the term is over) outranks the rest
            raise min(errors, key=lambda e: not isinstance(e, ControllerFencedError))
        return landed

    def _batches(self, changes: Sequence[PartitionChange]) -> list[list[int]]:
        """Indexes of ``changes`` in batches of at most :data:`BATCH_PARTITIONS` and :data:`BATCH_BYTES`, in
        order, a key at most once in each (etcd refuses a transaction that puts one key twice)."""
        batches: list[list[int]] = []
        keys: set[tuple[str, int]] = set()
        used = 0
        for i, change in enumerate(changes):
            key = (change.old.stream, change.old.id)
            size = 2 * (len(encode(change.old)) + len(encode(change.new)))
            if not batches or key in keys or len(batches[-1]) >= BATCH_PARTITIONS or used + size > BATCH_BYTES:
                batches.append([])
                keys, used = set(), 0
            batches[-1].append(i)
            keys.add(key)
            used += size
        return batches

    async def _write_batch(self, writer: FencedWriter, batch: Sequence[PartitionChange]) -> list[int]:
        """Write ``batch`` in one transaction, again without those that lost until the rest lands or none is left;
        the positions in ``batch`` that were written."""
        tx = self._client.transactions
        pending = {i: encode(change.old) for i, change in enumerate(batch)}  # position → the bytes expected
        retried: set[int] = set()  # positions already retried with etcd's bytes for the same record
        while pending:
            keys = {i: self._keys.partition(batch[i].old.stream, batch[i].old.id) for i in pending}
            result = await writer.transaction(
                compare=[tx.value(keys[i]) == expected for i, expected in pending.items()],
                success=[tx.put(keys[i], encode(batch[i].new)) for i in pending],
                failure=[tx.get(keys[i]) for i in pending],
            )
            if result.committed:
                return sorted(pending)
            still: dict[int, bytes] = {}
            for (i, expected), found in zip(pending.items(), result.responses, strict=True):
                raw = _value_of(found)
                if raw == expected:
                    still[i] = expected  # not the one that lost: send it again
                elif raw is not None and i not in retried and decode_partition(raw) == batch[i].old:
                    still[i] = raw  # the same record in other bytes (written by a version with fewer fields)
                    retried.add(i)
            pending = still
        return []

    async def cas(
        self, writer: FencedWriter, key: bytes, old: PartitionRecord, new: PartitionRecord
    ) -> tuple[bool, PartitionRecord | None]:
        """Replace ``old`` by ``new`` if etcd holds ``old``: (True, new), else (False, what etcd holds).

        The comparison is on bytes, so it is made with ``encode(old)`` first; should etcd hold the same record
        in other bytes (written by a version with fewer fields), it is retried once with those bytes.
        """
        tx = self._client.transactions
        expected = encode(old)
        for _ in range(2):
            result = await writer.transaction(
                compare=[tx.value(key) == expected], success=[tx.put(key, encode(new))], failure=[tx.get(key)]
            )
            if result.committed:
                return True, new
            found = _value_of(result.responses[0])
            current = decode_partition(found) if found is not None else None
            if current != old or found is None:
                return False, current
            expected = found
        return False, old

    async def write_decided(
        self,
        writer: FencedWriter,
        stream: str,
        partition: int,
        record: PartitionRecord | None,
        decide: Callable[[PartitionRecord | None], Awaitable[PartitionRecord]],
        refused: type[ControllerError],
        conflict: Callable[[PartitionRecord | None], ControllerError],
    ) -> tuple[PartitionRecord, PartitionRecord]:
        """Decide on a partition's record and write the decision with a compare-and-swap: (old, new).

        ``record`` is the partition's record in the controller's view. A failed swap decides again on what etcd
        holds; a refusal (``refused``, raised by ``decide``) decided on the mirror's record is only final once
        decided again on etcd's own: the mirror may lag the requester (a leader elected a moment ago).
        ``conflict`` makes the error raised when the record kept changing.
        """
        key = self._keys.partition(stream, partition)
        fresh = False
        for _ in range(_ALTER_ATTEMPTS):
            try:
                new = await decide(record)
            except refused:
                if fresh:
                    raise
                record, fresh = await self.read_partition(key), True
                continue
            assert record is not None
            if new == record:
                if fresh:
                    return record, new
                # Nothing to write by the mirror, which may lag etcd: only etcd's record says so for certain (a
                # leader takes "the ISR is now X" as written, and stops counting a joining follower on it).
                record, fresh = await self.read_partition(key), True
                continue
            written, current = await self.cas(writer, key, record, new)
            if written:
                return record, new
            record, fresh = current, True
        raise conflict(record)

    async def read_partition(self, key: bytes) -> PartitionRecord | None:
        found = await self._client.get(key)
        return decode_partition(bytes(found.value)) if found is not None else None

    def log_change(self, change: PartitionChange) -> None:
        old, new = change.old, change.new
        if new.leader != old.leader and new.leader:
            telemetry.leader_elected(change.reason.value)
        log.info(
            "controller %s: %s/%d %s: leader %s→%s epoch %d→%d isr %s→%s",
            self.broker_id,
            old.stream,
            old.id,
            change.reason.value,
            old.leader or "-",
            new.leader or "-",
            old.leader_epoch,
            new.leader_epoch,
            list(old.isr),
            list(new.isr),
        )


def _value_of(range_response: Any) -> bytes | None:
    """The value a transaction's ``get`` of one key found, or None for no key."""
    return bytes(range_response[0][0]) if range_response else None
