"""The NATS ingests of the partitions a broker leads: started, retried until they subscribe, looked up, stopped.

The :class:`~tidelog.broker.manager.PartitionManager` starts one ingest per partition it leads and stops it when
it stops leading. A leader without its ingest would take gRPC publishes and lose every NATS message, so an
ingest that fails to start is an error in the log and is retried in the background with backoff (0.5 s,
doubling, at most 30 s) until it subscribes; :meth:`IngestRuns.subscribed` answers False until then.

The ingests share the broker's few NATS connections (:class:`~tidelog.broker.ingest.nats_pool.IngestPool`, at most
``connections`` of them): starting one is a SUB on a connection already open, and ingests started together (new
leaders after a failover) share one round trip to the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from tidelog.broker.ingest.nats_connection import supports
from tidelog.broker.ingest.nats_ingest import NatsIngest
from tidelog.broker.ingest.nats_pool import DEFAULT_CONNECTIONS, IngestPool
from tidelog.broker.partitions.partition import Partition
from tidelog.clock import Clock
from tidelog.metadata.namespace import queue_group
from tidelog.metadata.snapshot import PartitionKey

COUNTERS = ("appended", "failed", "duplicates", "refused", "acks_published", "ack_failures")
"""The counters each :class:`~tidelog.broker.ingest.nats_ingest.NatsIngest` keeps (read by the metrics)."""

__all__ = ["IngestRuns"]

log = logging.getLogger(__name__)

_INGEST_RETRY_FIRST = 0.5  # seconds before the first retry of an ingest that failed to start; doubles each time
_INGEST_RETRY_MAX = 30.0


class IngestRuns:
    """One :class:`~tidelog.broker.ingest.nats_ingest.NatsIngest` per partition led here, and the retries of those
    that failed to start."""

    def __init__(
        self,
        nc: Any,
        *,
        urls: Sequence[str],
        ack_timeout: float,
        duplicate_window_ms: int,
        max_msg_ids: int,
        namespace: str,
        clock: Clock,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        self._nc = nc
        # The NATS connections every ingest here shares (None: the URLs need nats-py, see broker.ingest).
        self.pool = IngestPool(urls, size=connections, clock=clock) if supports(urls) else None
        self._ack_timeout = ack_timeout
        self._duplicate_window_ms = duplicate_window_ms
        self._max_msg_ids = max_msg_ids
        self._namespace = namespace  # names the NATS queue groups of stream groups (metadata.namespace)
        self._clock = clock
        self._ingests: dict[PartitionKey, NatsIngest] = {}
        self._retries: dict[PartitionKey, asyncio.Task[None]] = {}  # ingests that failed to start
        self._retired = dict.fromkeys(COUNTERS, 0)  # the counters of every ingest stopped so far

    def of(self, key: PartitionKey) -> NatsIngest | None:
        """The partition's ingest, if it runs."""
        return self._ingests.get(key)

    def running(self) -> list[NatsIngest]:
        """The ingests running now."""
        return list(self._ingests.values())

    def totals(self) -> dict[str, int]:
        """Each of :data:`COUNTERS` summed over every ingest this broker has run, stopped ones included: what the
        metrics export, so a count never goes back when a partition's ingest is replaced or moves away."""
        totals = dict(self._retired)
        for ingest in self._ingests.values():
            for name in COUNTERS:
                totals[name] += getattr(ingest, name)
        return totals

    def _retire(self, ingest: NatsIngest) -> None:
        for name in COUNTERS:
            self._retired[name] += getattr(ingest, name)

    def subscribed(self, key: PartitionKey) -> bool:
        """Whether the partition's ingest is subscribed (it is led here and its start succeeded)."""
        return key in self._ingests

    async def start(self, partition: Partition) -> None:
        """Subscribe the partition to its subject; when that fails, log it and keep trying in the background."""
        key = (partition.stream.name, partition.record.id)
        try:
            self._ingests[key] = await self._new_ingest(partition)
        except Exception as exc:
            log.exception(
                "cannot subscribe %s to NATS subject %r; NATS messages on it are not stored until a retry "
                "succeeds (next in %.1f s)",
                partition.name,
                partition.subject,
                _INGEST_RETRY_FIRST,
            )
            task = asyncio.create_task(self._retry(partition, repr(exc)), name=f"ingest-{partition.name}")
            self._retries[key] = task

    async def stop(self, key: PartitionKey) -> None:
        """Stop the partition's retries, then its ingest (NATS UNSUB)."""
        retry = self._retries.pop(key, None)
        if retry is not None:
            retry.cancel()
            await asyncio.gather(retry, return_exceptions=True)
        ingest = self._ingests.pop(key, None)
        if ingest is not None:
            await ingest.stop()
            self._retire(ingest)

    async def cancel_retries(self) -> None:
        """Stop every retry (closing the broker): no ingest starts after this."""
        retries, self._retries = self._retries, {}
        for task in retries.values():
            task.cancel()
        await asyncio.gather(*retries.values(), return_exceptions=True)

    async def stop_all(self) -> None:
        """Stop every ingest (closing the broker), failures ignored."""
        ingests, self._ingests = self._ingests, {}
        await asyncio.gather(*(i.stop() for i in ingests.values()), return_exceptions=True)
        for ingest in ingests.values():
            self._retire(ingest)
        if self.pool is not None:
            await self.pool.close()

    async def _new_ingest(self, partition: Partition) -> NatsIngest:
        ingest = NatsIngest(
            self._nc,
            partition,
            pool=self.pool,
            ack_timeout=self._ack_timeout,
            duplicate_window_ms=self._duplicate_window_ms,
            max_msg_ids=self._max_msg_ids,
            clock=self._clock,
            queue=queue_group(self._namespace, partition.stream.group),
        )
        try:
            await ingest.start()
        except BaseException:
            await ingest.stop()  # whatever part of it started (a cancelled retry, too)
            raise
        return ingest

    async def _retry(self, partition: Partition, said: str) -> None:
        """Start the ingest again and again, with backoff, until it works or the partition stops being led here.

        Each new kind of failure is logged as an error; a repeat of the last one only at debug level."""
        key = (partition.stream.name, partition.record.id)
        wait = _INGEST_RETRY_FIRST
        attempts = 1
        while True:
            await self._clock.sleep(wait)
            wait = min(wait * 2, _INGEST_RETRY_MAX)
            attempts += 1
            try:
                ingest = await self._new_ingest(partition)
            except Exception as exc:
                text = repr(exc)
                if text == said:
                    log.debug("NATS ingest of %s: attempt %d failed again: %s", partition.name, attempts, text)
                else:
                    log.error("cannot subscribe %s to NATS subject %r: %s", partition.name, partition.subject, text)
                said = text
                continue
            break
        self._retries.pop(key, None)
        self._ingests[key] = ingest
        log.warning("NATS ingest of %s subscribed to %r after %d attempts", partition.name, partition.subject, attempts)
