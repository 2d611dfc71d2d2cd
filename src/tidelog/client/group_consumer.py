"""The group consumer: members of a consumer group share its streams' partitions and keep their place.

::

    async with GroupConsumer("127.0.0.1:9293", ["orders"], group_id="billing") as consumer:
        async for record in consumer:       # ConsumerRecord, from the partitions assigned to this member
            handle(record)                  # committed every auto_commit_interval_ms (at least once)

In the manner of Kafka's consumer (``aiokafka.AIOKafkaConsumer``). Membership is
:class:`~tidelog.client.group_membership.GroupMembership` (join, heartbeat, coordinator failover, leave);
committed offsets are :class:`~tidelog.client.group_commits.GroupCommits` (cursors whose id is the group id,
holding the **next offset to read**); each assigned partition is read by a
:class:`~tidelog.client.partition_reader.PartitionReader`: a :class:`~tidelog.client.consumer.Consumer` of that
partition alone (the client's fetch machinery), restarted from the member's position after a retriable failure.

Positions. :meth:`GroupConsumer.position` is the offset of the next record this member hands out: a record
counts as consumed once it has been handed out. A newly assigned partition starts at its committed offset, or,
without one, at ``auto_offset_reset`` (``"latest"``: only new records, Kafka's default; ``"earliest"``).

Commits. With ``enable_auto_commit`` (the default) the positions are committed every ``auto_commit_interval_ms``
from inside the iteration, while it waits for or asks for the next record, never while the caller holds one: so
every committed record was handed out *and* the caller came back for more (at least once; what was handed out
since the last commit comes again after a crash). :meth:`commit` commits now (every position, or the offsets
given). :meth:`close` commits (with auto-commit), calls ``on_revoked`` with every partition, and leaves.

Rebalances. The coordinator moves partitions in one step (a new group epoch), and the member learns of it at its
next heartbeat; it applies the change inside the iteration: ``on_revoked`` with the partitions it lost, then
``on_assigned`` with those it gained (callbacks may be plain functions or coroutines). A partition it lost
already belongs to another member, so it is not committed: that could set back the new owner's offset (see
:mod:`tidelog.client.group_commits`); the records handed out from it since the last commit are read again by
the new owner. Commit more often (or call :meth:`commit`) to bound that.

Silence and fencing. A member whose heartbeats go unanswered for the consumer timeout gives every partition up
the same way (``on_revoked``, nothing committed), as it has been removed by then; it takes them back once the
coordinator answers (:mod:`tidelog.client.group_membership`). Its fetches and commits carry its group epoch, and
brokers refuse them once the group moved on (:mod:`tidelog.broker.groups.fencing`), so a member that missed a
rebalance neither reads nor commits a partition that is no longer its own.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl as ssl_
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Literal

from tidelog.client.admin import Admin
from tidelog.client.cluster import DEFAULT_BOOTSTRAP, Cluster
from tidelog.client.consumer import StartPosition
from tidelog.client.group_commits import GroupCommits
from tidelog.client.group_membership import GroupMembership, StreamPartition
from tidelog.client.partition_reader import PartitionReader
from tidelog.client.records import FetchedBatch
from tidelog.protocol.errors import StaleGroupEpochError, TidelogError
from tidelog.protocol.records.rows import ConsumerRecord

log = logging.getLogger(__name__)

Rebalanced = Callable[[frozenset[StreamPartition]], Awaitable[None] | None]
"""A rebalance callback: called with the partitions assigned (or revoked)."""


class GroupConsumer:
    """A member of consumer group ``group_id`` consuming ``streams``; see the module docstring."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        streams: str | Sequence[str] = (),
        *,
        group_id: str,
        consumer_id: str | None = None,
        cluster: Cluster | None = None,
        ssl: ssl_.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        auto_offset_reset: Literal["earliest", "latest"] = "latest",
        on_assigned: Rebalanced | None = None,
        on_revoked: Rebalanced | None = None,
        heartbeat_interval_ms: int | None = None,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 500,
    ) -> None:
        """``consumer_id`` defaults to a new random id; ``heartbeat_interval_ms`` to a third of the brokers'
        group consumer timeout (the join answers it; an interval not below it is refused)."""
        names = (streams,) if isinstance(streams, str) else tuple(streams)
        if not names:
            raise ValueError("a group consumer consumes one or more streams: name them")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}")
        if auto_commit_interval_ms <= 0:
            raise ValueError(f"auto_commit_interval_ms must be positive, not {auto_commit_interval_ms}")
        if heartbeat_interval_ms is not None and heartbeat_interval_ms <= 0:
            raise ValueError(f"heartbeat_interval_ms must be positive, not {heartbeat_interval_ms}")
        self.streams = names
        self.group_id = group_id
        self.consumer_id = consumer_id if consumer_id is not None else f"tidelog-{uuid.uuid4().hex}"
        self._owns_cluster = cluster is None
        self._cluster = Cluster(bootstrap, ssl=ssl, credentials=credentials) if cluster is None else cluster
        self._membership = GroupMembership(
            self._cluster, group_id, self.consumer_id, names, heartbeat_interval_ms=heartbeat_interval_ms
        )
        self._commits = GroupCommits(Admin(cluster=self._cluster), self._membership)
        self._auto_commit = enable_auto_commit
        self._commit_every = auto_commit_interval_ms / 1000
        self._next_commit = 0.0
        self._reset: Literal["earliest", "latest"] = auto_offset_reset
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._max_bytes = max_bytes
        self._max_wait_ms = max_wait_ms
        self._readers: dict[StreamPartition, PartitionReader] = {}
        self._ready: deque[tuple[StreamPartition, int, ConsumerRecord]] = deque()
        self._seeks: dict[StreamPartition, int] = {}
        self._generation = 0
        self._wake = asyncio.Event()
        self._started = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group and start reading the partitions assigned to this member."""
        if self._started:
            return
        if self._closed:
            raise RuntimeError("this group consumer is closed")
        await self._membership.join()
        self._started = True
        self._next_commit = time.monotonic() + self._commit_every
        await self._maintain()

    async def close(self) -> None:
        """Commit (with auto-commit), call ``on_revoked`` with every partition, stop reading and leave the group."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        try:
            if self._started and self._readers:
                if self._auto_commit:
                    await self._final_commit()
                await self._call(self._on_revoked, frozenset(self._readers))
        finally:
            for tp in list(self._readers):
                await self._stop_reader(tp)
            try:
                await self._membership.leave()
            finally:
                if self._owns_cluster:
                    await self._cluster.close()

    async def _final_commit(self) -> None:
        """Commit every position before leaving; after a rebalance this member has not applied yet, only the
        partitions it still owns (the others are another member's already)."""
        positions = self._positions()
        try:
            try:
                await self._commits.commit(positions)
            except StaleGroupEpochError:
                owned = self._membership.assigned
                await self._commits.commit({tp: p for tp, p in positions.items() if tp in owned})
        except TidelogError as exc:
            log.warning("group %s: final commit of %s failed: %s", self.group_id, self.consumer_id, exc)

    async def __aenter__(self) -> GroupConsumer:
        try:
            await self.start()
        except BaseException:
            await self.close()  # no __aexit__ follows a failed __aenter__
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- what this member holds ----------------------------------------------------------------------------------

    def assignment(self) -> frozenset[StreamPartition]:
        """The partitions this member reads now."""
        return frozenset(self._readers)

    @property
    def epoch(self) -> int:
        """The group epoch this member last heard of (-1 before joining and after leaving)."""
        return self._membership.epoch

    @property
    def coordinator(self) -> str:
        """The broker id this member heartbeats to (the group's coordinator as it last learned)."""
        return self._membership.coordinator

    def position(self, tp: StreamPartition) -> int:
        """The offset of the next record handed out from ``tp`` (an assigned partition); -1 while its start is
        not resolved yet (no leader to ask, for a moment)."""
        self._check_assigned(tp)
        return self._readers[tp].position

    def seek(self, tp: StreamPartition, offset: int) -> None:
        """Read ``tp`` (an assigned partition) from ``offset`` on; committed offsets change only with a commit."""
        self._check_assigned(tp)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"seek to an offset >= 0, not {offset!r}")
        self._readers[tp].position = offset
        self._seeks[tp] = offset
        self._wake.set()

    async def committed(self, tp: StreamPartition) -> int | None:
        """The group's committed offset of ``tp`` (the next offset to read), as stored now; None if none."""
        found = await self._commits.fetch([tp])
        return found.get(tp)

    async def commit(self, offsets: Mapping[StreamPartition, int] | None = None) -> None:
        """Commit ``offsets`` (next offsets to read), or every assigned partition's position. Refused with
        ``StaleGroupEpochError``, nothing stored, for a partition this member no longer owns."""
        await self.start()
        await self._commits.commit(self._positions() if offsets is None else offsets)

    # -- reading -------------------------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self.records()

    async def records(self) -> AsyncIterator[ConsumerRecord]:
        """Every record of the assigned partitions, following rebalances, until the consumer is closed."""
        while not self._closed:
            record = await self.getone()
            if record is not None:
                yield record

    async def getone(self, timeout: float | None = None) -> ConsumerRecord | None:
        """The next record, or None when none came within ``timeout`` seconds (or the consumer was closed)."""
        await self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            await self._maintain()
            record = self._take_ready()
            if record is not None:
                return record
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            await self._wait(remaining)
        return None

    def _take_ready(self) -> ConsumerRecord | None:
        while self._ready:
            tp, generation, record = self._ready.popleft()
            reader = self._readers.get(tp)
            if reader is None or reader.generation != generation or record.offset < reader.position:
                continue  # revoked, sought elsewhere, or before the position (read again after a restart)
            reader.position = record.offset + 1
            return record
        return None

    async def _wait(self, timeout: float | None) -> None:
        """Wait for a fetch answer, a rebalance, a seek or the next auto-commit, then take in what answered."""
        if self._auto_commit:
            until_commit = max(self._next_commit - time.monotonic(), 0.0)
            timeout = until_commit if timeout is None else min(timeout, until_commit)
        polls = {reader.poll: tp for tp, reader in self._readers.items() if reader.poll is not None}
        self._wake.clear()
        signals = [
            asyncio.create_task(self._membership.changed.wait()),
            asyncio.create_task(self._wake.wait()),
        ]
        try:
            await asyncio.wait([*polls, *signals], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for signal in signals:
                signal.cancel()
        for poll, tp in polls.items():
            if poll.done():
                self._collect(tp, poll)

    def _collect(self, tp: StreamPartition, task: asyncio.Task[list[FetchedBatch]]) -> None:
        reader = self._readers.get(tp)
        if reader is None or reader.poll is not task:
            return
        reader.next_batches()
        batches = task.result()  # an error that is not retriable (a deleted stream, damaged offsets) is raised
        for batch in batches:
            self._ready.extend((tp, reader.generation, record) for record in batch.records())

    # -- rebalances, seeks and auto-commit, applied from the iteration -------------------------------------------

    async def _maintain(self) -> None:
        if self._membership.changed.is_set():
            self._membership.changed.clear()
            try:
                await self._rebalance()
            except BaseException:
                self._membership.changed.set()  # applied again on the next call
                raise
        for tp, offset in list(self._seeks.items()):
            del self._seeks[tp]
            if tp in self._readers:
                await self._stop_reader(tp)
                await self._start_reader(tp, offset)
        if self._auto_commit and time.monotonic() >= self._next_commit:
            self._next_commit = time.monotonic() + self._commit_every
            await self._commit_moved()

    async def _rebalance(self) -> None:
        assigned = self._membership.assigned
        revoked = frozenset(tp for tp in self._readers if tp not in assigned)
        added = frozenset(tp for tp in assigned if tp not in self._readers)
        if revoked:
            log.info("group %s: %s gives up %s (epoch %d)", self.group_id, self.consumer_id, _names(revoked),
                     self.epoch)  # fmt: skip
            await self._call(self._on_revoked, revoked)
            for tp in revoked:
                await self._stop_reader(tp)
                self._seeks.pop(tp, None)
            self._commits.forget(revoked)
        if added:
            log.info("group %s: %s takes %s (epoch %d)", self.group_id, self.consumer_id, _names(added), self.epoch)
            committed = await self._commits.fetch(added)
            for tp in sorted(added):
                await self._start_reader(tp, committed.get(tp, self._reset))
            await self._call(self._on_assigned, added)

    async def _commit_moved(self) -> None:
        """Auto-commit: the positions that moved since they were last committed; a failure is logged, not raised."""
        moved = {tp: p for tp, p in self._positions().items() if self._commits.committed.get(tp) != p}
        if not moved:
            return
        try:
            await self._commits.commit(moved)
        except StaleGroupEpochError as exc:
            log.warning("group %s: not committed (a rebalance took partitions): %s", self.group_id, exc)
        except TidelogError as exc:
            log.warning("group %s: auto-commit failed (tried again in %.1fs): %s", self.group_id,
                        self._commit_every, exc)  # fmt: skip

    async def _start_reader(self, tp: StreamPartition, start: StartPosition) -> None:
        self._generation += 1
        reader = PartitionReader(
            self._cluster,
            tp,
            start,
            self._generation,
            reset=self._reset,
            max_bytes=self._max_bytes,
            max_wait_ms=self._max_wait_ms,
            member=self._membership.context,
            on_fenced=self._membership.refresh,
        )
        await reader.open()
        self._readers[tp] = reader

    async def _stop_reader(self, tp: StreamPartition) -> None:
        reader = self._readers.pop(tp, None)
        if reader is not None:
            await reader.close()

    def _positions(self) -> dict[StreamPartition, int]:
        """Every assigned partition's position, where it is resolved."""
        return {tp: reader.position for tp, reader in self._readers.items() if reader.position >= 0}

    async def _call(self, callback: Rebalanced | None, partitions: frozenset[StreamPartition]) -> None:
        if callback is None:
            return
        result = callback(partitions)
        if inspect.isawaitable(result):
            await result

    def _check_assigned(self, tp: StreamPartition) -> None:
        if tp not in self._readers:
            raise ValueError(
                f"{tp.stream}/{tp.partition} is not assigned to this member (it has {_names(self._readers)})"
            )


def _names(partitions: Iterable[StreamPartition]) -> str:
    return ", ".join(f"{tp.stream}/{tp.partition}" for tp in sorted(partitions)) or "none"
