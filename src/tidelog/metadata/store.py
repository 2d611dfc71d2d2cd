"""Writes to the etcd keyspace, each one a guarded transaction.

Reads go through the :class:`~tidelog.metadata.mirror.MetadataMirror`; this module only writes. Every write
compares what it expects to find (nothing, or the exact previous record) so two brokers racing on the same key
cannot both win, and a writer acting on a stale view fails instead of overwriting newer state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from tidelog.launch.reachability import ReachabilityLog, describe_failure, etcd_address
from tidelog.metadata.lease_session import RenewalSchedule
from tidelog.metadata.records import (
    BrokerRecord,
    Keys,
    PartitionRecord,
    StreamRecord,
    encode,
)
from tidelog.metadata.stream_changes import ChangeOutcome, StreamChanges
from tidelog.metadata.stream_creation import CreateOutcome, StreamCreation, plain_transact, prefix_end

__all__ = ["CreateOutcome", "MetadataStore"]

log = logging.getLogger(__name__)


class MetadataStore:
    """Guarded writes of stream, partition and broker records."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._lease: Any = None
        self._keepalive: asyncio.Task[None] | None = None

    async def create_stream(self, stream: StreamRecord, partitions: Sequence[PartitionRecord]) -> CreateOutcome:
        """Create ``stream`` and its partitions unless the name is taken: in several transactions, visible at once
        (:mod:`tidelog.metadata.stream_creation`). Unfenced: a creation marker in the way is taken over."""
        creation = StreamCreation(
            self._client, self._keys, plain_transact(self._client), 0, abandoned=lambda _marker: True
        )
        return await creation.create(stream, partitions)

    async def delete_stream(self, name: str) -> bool:
        """Delete a stream and its partitions; False when there was no such stream."""
        tx = self._client.transactions
        key = self._keys.stream(name)
        prefix = self._keys.partitions_of(name)
        ok, _ = await self._client.transaction(
            compare=[tx.version(key) > 0],
            success=[tx.delete(key), tx.delete(prefix, range_end=prefix_end(prefix))],
            failure=[],
        )
        return bool(ok)

    async def update_partition(self, old: PartitionRecord, new: PartitionRecord) -> bool:
        """Replace ``old`` with ``new`` only if etcd still holds exactly ``old``."""
        tx = self._client.transactions
        key = self._keys.partition(old.stream, old.id)
        ok, _ = await self._client.transaction(
            compare=[tx.value(key) == encode(old)],
            success=[tx.put(key, encode(new))],
            failure=[],
        )
        return bool(ok)

    async def add_partitions(
        self, old: StreamRecord, new: StreamRecord, partitions: Sequence[PartitionRecord]
    ) -> ChangeOutcome:
        """Give stream ``old`` the new ``partitions`` and its record ``new`` while etcd holds ``old``
        (:mod:`tidelog.metadata.stream_changes`)."""
        return await StreamChanges(self._client, self._keys, plain_transact(self._client)).add_partitions(
            old, new, partitions
        )

    async def alter_stream(self, old: StreamRecord, new: StreamRecord) -> ChangeOutcome:
        """Replace stream record ``old`` with ``new`` while etcd holds ``old``."""
        return await StreamChanges(self._client, self._keys, plain_transact(self._client)).alter(old, new)

    async def register_broker(self, record: BrokerRecord, ttl_seconds: int) -> None:
        """Publish this broker under a lease that a background task keeps alive.

        When the broker dies the lease expires and its key disappears: that is how the cluster learns of it.
        """
        self._lease = await self._client.lease(ttl_seconds)
        await self._client.put(self._keys.broker(record.id), encode(record), lease=self._lease)
        self._keepalive = asyncio.create_task(self._keep_alive(record, ttl_seconds), name="broker-lease")

    async def deregister_broker(self) -> None:
        """Revoke the lease (removing the broker's key at once) and stop keeping it alive."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
            self._keepalive = None
        if self._lease is not None:
            with contextlib.suppress(Exception):
                await self._lease.revoke()
            self._lease = None

    async def _keep_alive(self, record: BrokerRecord, ttl_seconds: int) -> None:
        """Refresh the lease on the :class:`RenewalSchedule` (early, retried soon after a failure)."""
        loop = asyncio.get_running_loop()
        schedule = RenewalSchedule(ttl_seconds, loop.time())
        reach = ReachabilityLog(log, "etcd", etcd_address(self._client))
        while True:
            await asyncio.sleep(schedule.delay(loop.time()))
            sent = loop.time()
            if schedule.late_by(sent) > ttl_seconds / 6:
                log.warning("broker lease refreshed %.1f s late (the event loop was busy)", schedule.late_by(sent))
            try:
                async with asyncio.timeout(schedule.timeout):
                    reply = await self._lease.refresh()
                schedule.confirmed(sent)
                if reply is not None and getattr(reply, "TTL", 1) <= 0:
                    # The lease lapsed (this broker was paused or cut off longer than its TTL) and etcd removed
                    # the registration with it; register again under a new lease rather than stay invisible.
                    log.warning("broker lease expired; registering %s again", record.id)
                    self._lease = await self._client.lease(ttl_seconds)
                    await self._client.put(self._keys.broker(record.id), encode(record), lease=self._lease)
            except Exception as exc:  # etcd briefly unreachable: keep trying until the lease is really gone
                log.debug("could not refresh the broker lease", exc_info=True)
                reach.unreachable(describe_failure(exc), "refreshing the broker lease again soon")
                schedule.failed()
            else:
                reach.reachable("broker lease refreshed")
