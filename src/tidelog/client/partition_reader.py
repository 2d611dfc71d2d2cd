"""Reading one partition assigned to a group member, through a failover that outlasts the consumer's own retries.

A :class:`PartitionReader` is a :class:`~tidelog.client.consumer.Consumer` of one partition (the client's fetch
machinery: its own connection, one fetch in flight, NOT_LEADER and lost connections handled) plus what a group
member needs around it: the member's **position** (the next offset it hands out, kept here by the group
consumer), and a restart from that position when the consumer gives up on a retriable failure (no leader for
longer than its few quick retries, the stream's metadata briefly unknown) instead of raising it to the
application: a member keeps following its partition, as a Kafka consumer does. Errors that are not retriable (the
stream was deleted, damaged offsets) are raised to the group consumer, which hands them to its caller.

Fetches carry the member's group context (group, consumer id, the epoch it holds now), so a broker refuses them
once the partition is no longer this member's at the group's epoch; the reader then has the membership heartbeat
(learning the new epoch, or that the partition moved: the group consumer then stops this reader) and reads on.

One fetch answer is awaited at a time: :attr:`PartitionReader.poll` is the task of the next batches, started again
with :meth:`PartitionReader.next_batches` once the group consumer took them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from tidelog.client.cluster import Cluster
from tidelog.client.consumer import Consumer, StartPosition
from tidelog.client.group_membership import StreamPartition
from tidelog.client.records import FetchedBatch
from tidelog.protocol.errors import StaleGroupEpochError, TidelogError, UnknownGroupError, UnknownMemberError
from tidelog.protocol.messages import GroupContext

log = logging.getLogger(__name__)

RESTART_BACKOFF = 0.5
"""Seconds between restarts of a partition's consumer after a retriable failure."""
FENCED_BACKOFF = 0.05
"""Seconds before reading again after a fetch was fenced and the membership learned a new epoch (the partition
was not moved, or the group consumer stops this reader before long); :data:`RESTART_BACKOFF` if it learned none."""
FENCED = (StaleGroupEpochError, UnknownMemberError, UnknownGroupError)
"""Refusals of a fetch made at a group epoch that is no longer the group's (:mod:`tidelog.broker.groups.fencing`)."""
READONLY_RECHECK = 5.0
"""Seconds between looks at a partition read to its end while read-only (it may be made writable again)."""


class PartitionReader:
    """One assigned partition being read; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        tp: StreamPartition,
        start: StartPosition,
        generation: int,
        *,
        reset: Literal["earliest", "latest"],
        max_bytes: int,
        max_wait_ms: int,
        member: Callable[[], GroupContext] | None = None,
        on_fenced: Callable[[GroupContext], Awaitable[None]] | None = None,
    ) -> None:
        """``member``: the group context fetches carry now (its epoch changes with the group's); ``on_fenced``:
        what to do when the broker refuses a fetch for it (learn the group's new epoch from the coordinator)."""
        self.tp = tp
        self._member = member
        self._on_fenced = on_fenced
        self._context: GroupContext | None = None  # the context of the current consumer's fetches
        self.generation = generation  # records of an older reading of the partition (before a seek) are dropped
        self.position = start if isinstance(start, int) else -1  # the next offset handed out; -1: not resolved yet
        self._start = start
        self._cluster = cluster
        self._reset: Literal["earliest", "latest"] = reset
        self._max_bytes = max_bytes
        self._max_wait_ms = max_wait_ms
        self._consumer: Consumer | None = None
        self.poll: asyncio.Task[list[FetchedBatch]] | None = None

    async def open(self) -> None:
        """Resolve the start and send the first fetch; a retriable failure is left to the reading task, which
        tries again (the position then stays -1 until it is resolved)."""
        try:
            await self._open()
        except TidelogError as exc:
            if not exc.retriable:
                raise
            log.info("%s/%d: cannot start reading yet (%s); trying again", self.tp.stream, self.tp.partition, exc)
        self.next_batches()

    def next_batches(self) -> None:
        """Start waiting for the next batches (:attr:`poll`)."""
        self.poll = asyncio.create_task(self._next(), name=f"read-{self.tp.stream}-{self.tp.partition}")

    async def close(self) -> None:
        if self.poll is not None:
            self.poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.poll
            self.poll = None
        await self._drop()

    async def _next(self) -> list[FetchedBatch]:
        """The next batches (maybe none, after a long-poll); restarts the consumer from :attr:`position` after a
        retriable failure, until it reads again or is cancelled."""
        while True:
            try:
                if self._consumer is None:
                    await self._open()
                assert self._consumer is not None
                batches = await self._consumer.poll()
                if batches is not None:
                    return batches
                if self._consumer.at_readonly_end(self.tp.partition):  # nothing more unless made writable again
                    await self._drop()
                    await asyncio.sleep(READONLY_RECHECK)
                    continue
                failure = "no fetch in flight after an error"
            except FENCED as exc:  # the group moved on: learn where it stands, then read at its epoch (or stop)
                log.info("%s/%d: fetch fenced (%s)", self.tp.stream, self.tp.partition, exc)
                await self._drop()
                fenced = self._context
                if self._on_fenced is not None and fenced is not None:
                    await self._on_fenced(fenced)
                moved_on = self._member is not None and self._member() != fenced  # a new epoch to read at
                await asyncio.sleep(FENCED_BACKOFF if moved_on else RESTART_BACKOFF)
                continue
            except TidelogError as exc:
                if not exc.retriable:
                    raise  # the consumer went on (past damaged offsets) or has no fetch left (restarted next call)
                failure = str(exc)
            log.info("%s/%d: %s; reading again from offset %d", self.tp.stream, self.tp.partition, failure,
                     self.position)  # fmt: skip
            await self._drop()
            await asyncio.sleep(RESTART_BACKOFF)

    async def _open(self) -> None:
        self._context = None if self._member is None else self._member()
        consumer = Consumer(
            stream=self.tp.stream,
            partitions=[self.tp.partition],
            start=self.position if self.position >= 0 else self._start,
            cluster=self._cluster,
            auto_offset_reset=self._reset,
            max_bytes=self._max_bytes,
            max_wait_ms=self._max_wait_ms,
            group=self._context,
        )
        try:
            await consumer.start()
        except BaseException:
            await consumer.close()
            raise
        self._consumer = consumer
        if self.position < 0:
            self.position = consumer.position(self.tp.partition)

    async def _drop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await consumer.close()
