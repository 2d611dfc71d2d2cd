"""One fetch session per leader broker: every partition this broker follows from that leader, over one connection.

A :class:`FetchSession` belongs to one leader broker (its id and address) and carries the partitions whose
fetchers are in their fetching state (:class:`SessionMember`; the fetcher is
:class:`~tidelog.replication.follower.fetcher.ReplicaFetcher`, which joins when it has truncated and starts
fetching, and leaves when it stops, fails or has segment files to copy). It runs one task and one connection,
and keeps one SESSION_FETCH in flight (:mod:`tidelog.protocol.session_messages`): each round asks for every
member at its log end (its acknowledgement to the leader), the leader long-polls until any of them has
something to say (:mod:`tidelog.api.wire.session_fetch`), and the answer's partitions are handed to their
members, each appending its own batches with the same per-partition logic a fetcher has always used (epoch
checks, out-of-range handling, producer state, high watermark). Only then does the next round go out, so
each acknowledgement covers batches that are durable here. So a broker following a thousand partitions
from two leaders holds two fetch connections and wakes up once per answer, not once per partition.

Fairness: the order of the entries rotates by one each round; the leader fills the shared ``max_bytes``
budget in that order, so a partition that always has data cannot keep the others from being copied.

Failures: an error about one partition (fenced, not leader, out of range, a corrupt batch, a full disk) is that
member's alone: it leaves the session and its fetcher's state machine handles the error as it always has, then
joins again. Losing the connection, an unanswered round or an unreadable answer fails every member (each backs
off and rejoins); the session reconnects when a member joins again. A member that joins while a round is in
flight is asked for in the next one (within ``max_wait_ms``). Truncation, lag surveys and far-horizon copies
are not session requests: they go over the fetcher's own short-lived connection, only while it needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from tidelog.protocol.session_messages import (
    SessionFetchEntry,
    SessionFetchPartition,
    SessionFetchRequest,
    SessionFetchResponse,
    rotated,
    split_payload,
)
from tidelog.protocol.tls import SslSource
from tidelog.replication.follower.leader_link import LeaderLink, expect

log = logging.getLogger(__name__)

PartitionKey = tuple[str, int]
DEFAULT_SESSION_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024


class SessionMember(Protocol):
    """A partition fetched through a session: what to ask for, and what to do with the answer."""

    @property
    def key(self) -> PartitionKey: ...

    def session_entry(self) -> SessionFetchEntry:
        """This round's entry: the log end, the leadership followed, the leader HW known."""
        ...

    async def session_data(self, entry: SessionFetchEntry, part: SessionFetchPartition, data: memoryview) -> None:
        """The leader's answer for the ``entry`` sent; raising fails this member alone."""
        ...

    def session_failed(self, exc: BaseException) -> None:
        """The member was dropped from the session because of ``exc`` (its own, or the whole round's)."""
        ...


class FetchSession:
    """The session with one leader broker; see the module docstring."""

    def __init__(
        self,
        broker_id: str,
        leader_id: str,
        leader_address: str,
        *,
        max_wait_ms: int = 500,
        max_bytes: int = DEFAULT_SESSION_MAX_BYTES,
        partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
        request_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        ssl: SslSource | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.leader_address = leader_address
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._timeout = max_wait_ms / 1000 + request_timeout
        self._link = LeaderLink(leader_id, leader_address, connect_timeout, ssl=ssl)
        self._members: dict[PartitionKey, SessionMember] = {}  # joined; the session task reads, members write
        self._joined = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.rounds = 0  # requests sent (a statistic, and the rotation of the entries)

    @property
    def members(self) -> int:
        return len(self._members)

    @property
    def connected(self) -> bool:
        return self._link.connected

    def join(self, member: SessionMember) -> None:
        """Fetch ``member`` from the next round on (replacing any member of the same partition)."""
        if self._closed:
            raise RuntimeError(f"the fetch session with {self.leader_id} is closed")
        self._members[member.key] = member
        self._joined.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"fetch-session-{self.leader_id}")

    def leave(self, member: SessionMember) -> None:
        """Stop fetching ``member`` (a no-op when it is not, or no longer, the one joined)."""
        if self._members.get(member.key) is member:
            del self._members[member.key]

    async def close(self) -> None:
        """Stop the task and the connection; the members are their owners' to stop. Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._link.close()

    # -- the task ----------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self._members:
                # Cleared before the close, not after: a member may join while the connection closes (that
                # awaits), and its wake-up must stand, or it waits for a round that never comes (issue 23).
                self._joined.clear()
                await self._link.close()  # nothing to fetch: no connection either
                await self._joined.wait()
                continue
            sent = {key: (member, member.session_entry()) for key, member in self._members.items()}
            try:
                parts = await self._round(tuple(entry for _, entry in sent.values()))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection, or the round as a whole: every member backs off
                await self._link.close()
                self._fail(list(sent.values()), exc)
                continue
            await self._deliver(sent, parts)

    async def _round(self, entries: tuple[SessionFetchEntry, ...]) -> list[tuple[SessionFetchPartition, memoryview]]:
        if not self._link.connected:
            await self._link.open()
        request = SessionFetchRequest(
            self.broker_id,
            rotated(entries, self.rounds),
            self._max_bytes,
            self._partition_max_bytes,
            self._max_wait_ms,
        )
        self.rounds += 1
        header, payload = await self._link.send(request, self._timeout)
        return split_payload(expect(header, SessionFetchResponse), payload)

    async def _deliver(
        self,
        sent: dict[PartitionKey, tuple[SessionMember, SessionFetchEntry]],
        parts: list[tuple[SessionFetchPartition, memoryview]],
    ) -> None:
        """Hand each partition's answer to the member it was asked for (if still joined), all at once: their
        appends and fsyncs overlap. The next round waits for all of them (its entries acknowledge them)."""
        deliveries: list[asyncio.Task[None]] = []
        for part, data in parts:
            asked = sent.get((part.stream, part.partition))
            if asked is None or self._members.get(asked[0].key) is not asked[0]:
                continue  # not asked for, or it left meanwhile: its answer is of no use now
            member, entry = asked
            deliveries.append(asyncio.create_task(self._deliver_one(member, entry, part, data)))
        if deliveries:
            await asyncio.wait(deliveries)

    async def _deliver_one(
        self, member: SessionMember, entry: SessionFetchEntry, part: SessionFetchPartition, data: memoryview
    ) -> None:
        try:
            await member.session_data(entry, part, data)
        except asyncio.CancelledError:
            self.leave(member)  # its fetcher is stopping
        except Exception as exc:
            self._fail([(member, entry)], exc)

    def _fail(self, members: list[tuple[SessionMember, SessionFetchEntry]], exc: BaseException) -> None:
        for member, _ in members:
            if self._members.get(member.key) is member:
                del self._members[member.key]
                member.session_failed(exc)


class FetchSessions:
    """This broker's fetch sessions, one per leader broker, made when the first partition follows it."""

    def __init__(
        self,
        broker_id: str,
        *,
        max_wait_ms: int = 500,
        max_bytes: int = DEFAULT_SESSION_MAX_BYTES,
        partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
        request_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        ssl: SslSource | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._partition_max_bytes = partition_max_bytes
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        self._ssl = ssl
        self._sessions: dict[tuple[str, str], FetchSession] = {}

    def session(self, leader_id: str, leader_address: str) -> FetchSession:
        """The session with ``leader_id`` at ``leader_address`` (a broker that moved gets a new one)."""
        key = (leader_id, leader_address)
        session = self._sessions.get(key)
        if session is None:
            session = FetchSession(
                self._broker_id,
                leader_id,
                leader_address,
                max_wait_ms=self._max_wait_ms,
                max_bytes=self._max_bytes,
                partition_max_bytes=self._partition_max_bytes,
                request_timeout=self._request_timeout,
                connect_timeout=self._connect_timeout,
                ssl=self._ssl,
            )
            self._sessions[key] = session
        return session

    @property
    def sessions(self) -> list[FetchSession]:
        return list(self._sessions.values())

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()
