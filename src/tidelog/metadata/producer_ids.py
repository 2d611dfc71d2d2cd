"""Idempotent-producer ids and epochs, handed out by any broker straight from etcd (the INIT_PRODUCER request).

Partitions dedupe a producer's retries by ``(producer id, epoch, sequence)``
(:mod:`tidelog.replication.idempotence.producer_state`), so two producers must never share an id, and a named producer's
new instance must get an epoch above every older instance's. Both are etcd compare-and-swap loops, so any broker can
answer without asking the controller, and two brokers answering at once cannot hand out the same id:

- ``{prefix}/producer-ids`` holds the next id. Taking one is a transaction guarded by the key's
  ``mod_revision`` (0: absent) that writes the value + 1; a broker that loses the race reads again and retries.
  The counter only grows and is never reset, so an id is never reissued, not even after every broker restarted.
- ``{prefix}/producers/{name}`` holds a named producer's :class:`~tidelog.metadata.records.ProducerRecord`.
  The first INIT_PRODUCER of a name takes a fresh id with epoch 0, creating the record and bumping the counter
  in one transaction; each later one writes epoch + 1, guarded by the record's ``mod_revision``. Past
  :data:`~tidelog.protocol.records.producers.MAX_PRODUCER_EPOCH` the name moves to a fresh id at epoch 0
  (the header's epoch is an int16), as Kafka does.

An anonymous producer (empty name) gets a fresh id with epoch 0 and no record.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from tidelog.metadata.records import (
    Keys,
    ProducerRecord,
    decode_counter,
    decode_producer,
    encode_counter,
    encode_producer,
)
from tidelog.protocol.errors import InvalidArgumentError, UnavailableError
from tidelog.protocol.records.producers import MAX_PRODUCER_EPOCH

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = 255
MAX_ATTEMPTS = 64  # compare-and-swap rounds before giving up: only lost races cost a round


class ProducerIdAllocator:
    """Allocates producer ids and epochs in etcd; see the module docstring. Safe to share between requests."""

    def __init__(self, client: Any, keys: Keys, *, max_attempts: int = MAX_ATTEMPTS) -> None:
        self._client = client  # aetcd.Client
        self._keys = keys
        self._max_attempts = max_attempts

    async def init_producer(self, name: str = "") -> tuple[int, int]:
        """``(producer id, epoch)`` for a new producer instance: fresh for ``""``, the name's next otherwise."""
        if len(name) > MAX_NAME_LENGTH:
            raise InvalidArgumentError(f"producer names are at most {MAX_NAME_LENGTH} characters, got {len(name)}")
        for attempt in range(self._max_attempts):
            result = await (self._try_fresh() if not name else self._try_named(name))
            if result is not None:
                return result
            await asyncio.sleep(random.uniform(0, 0.002 * (attempt + 1)))  # lost a race: let the winner finish
        raise UnavailableError(f"producer id allocation kept losing races in etcd ({self._max_attempts} attempts)")

    async def _read_counter(self) -> tuple[int, int]:
        """The next id and the counter key's ``mod_revision`` (0: the key does not exist yet)."""
        found = await self._client.get(self._keys.producer_ids())
        if found is None:
            return 0, 0
        return decode_counter(bytes(found.value)), int(found.mod_revision)

    async def _try_fresh(self) -> tuple[int, int] | None:
        """One CAS round taking the next id; None when another broker took it first."""
        tx = self._client.transactions
        key = self._keys.producer_ids()
        next_id, revision = await self._read_counter()
        ok, _ = await self._client.transaction(
            compare=[tx.mod(key) == revision], success=[tx.put(key, encode_counter(next_id + 1))], failure=[]
        )
        return (next_id, 0) if ok else None

    async def _try_named(self, name: str) -> tuple[int, int] | None:
        """One CAS round for a named producer: its next epoch, or a fresh id (first use, or epochs exhausted)."""
        tx = self._client.transactions
        key = self._keys.producer(name)
        found = await self._client.get(key)
        if found is not None:
            current = decode_producer(bytes(found.value))
            if current.epoch < MAX_PRODUCER_EPOCH:
                bumped = ProducerRecord(current.producer_id, current.epoch + 1)
                ok, _ = await self._client.transaction(
                    compare=[tx.mod(key) == int(found.mod_revision)],
                    success=[tx.put(key, encode_producer(bumped))],
                    failure=[],
                )
                return (bumped.producer_id, bumped.epoch) if ok else None
        # A fresh id and the name's record in one transaction: both guards hold, or neither key changes.
        counter = self._keys.producer_ids()
        next_id, revision = await self._read_counter()
        fresh = ProducerRecord(next_id, 0)
        ok, _ = await self._client.transaction(
            compare=[tx.mod(counter) == revision, tx.mod(key) == (int(found.mod_revision) if found else 0)],
            success=[tx.put(counter, encode_counter(next_id + 1)), tx.put(key, encode_producer(fresh))],
            failure=[],
        )
        if ok and found is not None:
            log.info("producer %r exhausted its epochs: moved to id %d", name, next_id)
        return (fresh.producer_id, fresh.epoch) if ok else None
