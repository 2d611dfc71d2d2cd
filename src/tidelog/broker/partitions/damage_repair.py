"""Restoring damaged ranges from replicas: bit rot in a replicated partition heals itself.

When a partition's log records a damaged range (:mod:`tidelog.storage.damage`), this broker asks the replicas
that hold a sound copy for it: a leader asks its in-sync followers, a follower asks its leader. The request is an
ordinary FETCH from the range's first offset, marked ``verify`` (the replica CRC-checks the bytes it sends) and
``replica`` (an in-sync follower answers from its own copy). The first copy that fits replaces the damaged span
in place (:mod:`tidelog.storage.damage_repair`): replication copies batches byte for byte, so nothing after
the range is truncated, no leadership changes hands, and the offsets stay where they were.

While a restore runs, readers of the range are told to retry (UNAVAILABLE) rather than to skip it. When no
replica can help — the partition has one replica, no other is in sync, or every copy is refused — the range stays
recorded and reported (OFFSET_DAMAGED, ``tidelog partition skip-damaged``), and the log says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tidelog.broker.peers import Peers
from tidelog.protocol.messages import FetchRequest, FetchResponse
from tidelog.storage.damage import DamagedRange
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

REPAIR_FETCH_BYTES = 64 * 1024 * 1024
"""How much one replica's answer may hold (a damaged range is one batch, or a few up to the next index entry)."""

Sources = Callable[[str, int], list[str]]
"""``(stream, partition) -> broker ids`` that hold a sound copy, in the order to ask them; empty when alone."""

_NO_REPLICA = (
    "%s/%d: %s restore offsets %d..%d: reads skip them (OFFSET_DAMAGED) until an operator confirms it with "
    "`tidelog partition skip-damaged`"
)


class DamageRepairs:
    """Starts a restore for each damaged range a watched log finds; :meth:`stop` cancels those still running."""

    def __init__(self, peers: Peers | None, sources: Sources, *, timeout: float = 10.0) -> None:
        self._peers = peers
        self._sources = sources
        self._timeout = timeout
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, log_: Log, stream: str, partition: int) -> None:
        """Restore what ``log_`` finds damaged from now on (replacing any earlier watcher of it), and what it
        found before (in an earlier role, or before a restart) and nobody confirmed skipping."""

        def found(damaged: DamagedRange) -> None:
            self._start(log_, stream, partition, damaged)

        log_.damage.on_found = found
        for damaged in log_.damage.ranges:
            if not damaged.confirmed:
                self._start(log_, stream, partition, damaged)

    def _start(self, log_: Log, stream: str, partition: int, damaged: DamagedRange) -> None:
        if log_.damage.is_repairing(damaged):
            return
        sources = self._sources(stream, partition)
        if self._peers is None or not sources:
            log.error(_NO_REPLICA, stream, partition, "no in-sync replica can", damaged.first, damaged.last)
            return
        log_.damage.repairing(damaged, True)
        task = asyncio.get_running_loop().create_task(self._restore(self._peers, log_, stream, partition, damaged))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restore(self, peers: Peers, log_: Log, stream: str, partition: int, damaged: DamagedRange) -> None:
        request = FetchRequest(
            stream, partition, damaged.first, REPAIR_FETCH_BYTES, max_wait_ms=0, verify=True, replica=True
        )
        try:
            for source in self._sources(stream, partition):
                try:
                    response = await peers.request(source, request, timeout=self._timeout)
                    header = response.header
                    if not isinstance(header, FetchResponse):
                        raise ValueError(f"it answered FETCH with a {type(header).__name__}")
                    if header.error is not None:
                        raise ValueError(f"it answered {header.error.message}")
                    await log_.repair_damaged(damaged, bytes(response.payload))
                except Exception as exc:  # one replica failing must not stop the next from being asked
                    log.warning(
                        "%s/%d: cannot restore offsets %d..%d from %s: %s",
                        stream,
                        partition,
                        damaged.first,
                        damaged.last,
                        source,
                        exc,
                    )
                    continue
                log.warning(
                    "%s/%d: restored damaged offsets %d..%d from replica %s",
                    stream,
                    partition,
                    damaged.first,
                    damaged.last,
                    source,
                )
                return
            log.error(_NO_REPLICA, stream, partition, "no replica could", damaged.first, damaged.last)
        finally:
            log_.damage.repairing(damaged, False)

    async def stop(self) -> None:
        """Cancel the restores still running (the broker is stopping)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
