"""The part of a :class:`~tidelog.replication.follower.fetcher.ReplicaFetcher` that a fetch session drives.

A fetcher in a :class:`~tidelog.replication.follower.session.FetchSession` does not fetch: it joins the session
(:meth:`SessionFetching._on_session_fetching`), and the session hands it each answer about its partition
(:meth:`SessionFetching.session_data`), which it appends exactly as a REPLICA_FETCH's answer: the same epoch and
out-of-range handling (:meth:`SessionFetching._on_fetch_error`, shared by both paths), producer state and high
watermark. A failure about its partition is raised into its own state machine through the future it waits on;
the session goes on with the others.
"""

from __future__ import annotations

import asyncio
import logging

from tidelog.clock import Clock
from tidelog.protocol.errors import ErrorCode, from_error_body
from tidelog.protocol.peer_messages import ReplicaFetchResponse
from tidelog.protocol.session_messages import SessionFetchEntry, SessionFetchPartition
from tidelog.replication.follower.fetcher_state import FetcherState
from tidelog.replication.follower.leader_link import LeaderLink
from tidelog.replication.follower.local_replica import LocalReplica
from tidelog.replication.follower.session import FetchSession, PartitionKey
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import record_replicated
from tidelog.storage.log import Log

log = logging.getLogger(__name__)


class SessionFetching:
    """A fetcher's session membership and the handling of a leader's answer about its partition."""

    # Set by ReplicaFetcher.__init__ (see there).
    stream: str
    partition: int
    leader_epoch: int
    _log: Log
    _link: LeaderLink
    _replica: LocalReplica
    _producers: ProducerStateTable | None
    _clock: Clock
    _session: FetchSession | None
    _outcome: asyncio.Future[bool] | None
    _delivery: asyncio.Task[None] | None
    _leader_hw: int
    _leader_end: int
    _leader_start: int
    _verify_next: bool
    _stopped: bool
    _copy_threshold: int
    _fetched_since_survey: int

    @property
    def name(self) -> str:
        return f"{self.stream}/{self.partition}"

    def _reached_leader(self) -> None:
        raise NotImplementedError

    async def _should_copy(self) -> bool:
        raise NotImplementedError

    async def _on_fetch_error(self, response: ReplicaFetchResponse | SessionFetchPartition, offset: int) -> bool:
        """An OFFSET_OUT_OF_RANGE is handled here (True: below the leader's start, copy segment files);
        anything else is raised for the state machine."""
        assert response.error is not None
        if response.error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
            raise from_error_body(response.error)
        self._reached_leader()
        self._leader_start = response.log_start
        if offset < response.log_start:
            log.info("%s: log ends at %d, the leader's starts at %d: copying", self.name, offset, response.log_start)
            return True
        if offset > response.log_end:
            # Epoch truncation prevents this but where an operator confirmed a lower head with reset-head (a
            # leader that finds it otherwise suspends appends and answers PARTITION_SUSPENDED: the log is kept).
            reason = f"the leader's log ends at {response.log_end}"
            if self._log.start_offset > response.log_end:  # nothing held is at or below it: start over there
                await self._replica.reset(response.log_end, reason)
            else:
                await self._replica.truncate(response.log_end, reason)
        return False  # otherwise the leader's bounds moved between its check and ours: just fetch again

    async def _on_session_fetching(self) -> FetcherState:
        """Join the session with the leader broker and let it fetch this partition (appending each answer
        through :meth:`session_data`) until it fails (raised here) or catch-up is due: a fetch below the leader's
        start (copy), or ``copy_threshold_bytes`` fetched (survey the lag, then copy or join again)."""
        assert self._session is not None
        while True:
            await self._link.close()  # steady state: the session's connection is the only one
            outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._outcome = outcome
            self._session.join(self)
            try:
                copy_now = await outcome
            finally:
                self._session.leave(self)
                self._outcome = None
            if copy_now or await self._should_copy():
                return FetcherState.COPYING

    @property
    def key(self) -> PartitionKey:
        return (self.stream, self.partition)

    def session_entry(self) -> SessionFetchEntry:
        """This partition's entry in the session's next round: our log end, our leadership, the leader's HW."""
        verify, self._verify_next = self._verify_next, False
        offset = self._log.end_offset
        return SessionFetchEntry(self.stream, self.partition, offset, self.leader_epoch, self._leader_hw, verify)

    async def session_data(self, entry: SessionFetchEntry, part: SessionFetchPartition, data: memoryview) -> None:
        """The leader's answer for this partition, exactly as :meth:`_on_fetching` handles a REPLICA_FETCH's:
        run in its own task by the session, which :meth:`stop` cancels; raising fails this partition alone."""
        outcome = self._outcome
        if self._stopped or outcome is None or outcome.done():
            return
        self._delivery = asyncio.current_task()
        try:
            if part.error is not None:
                if await self._on_fetch_error(part, entry.offset) and not outcome.done():
                    outcome.set_result(True)
                return
            self._reached_leader()
            log_ = self._log
            if data:
                try:
                    await log_.append_as_follower(data, None)  # returns once durable per the flush policy
                finally:
                    if self._producers is not None:  # what was written, even if the append then failed
                        record_replicated(self._producers, log_, data)
                self._fetched_since_survey += len(data)
                if self._producers is not None:
                    self._replica.maintain_producers()
            self._leader_end = part.log_end
            self._leader_hw = part.high_watermark
            self._replica.advance_hw(part.high_watermark)
            survey = self._copy_threshold and self._fetched_since_survey >= self._copy_threshold
            if survey and part.log_end > log_.end_offset and not outcome.done():
                outcome.set_result(False)
            elif survey:
                self._fetched_since_survey = 0
        finally:
            self._delivery = None

    def session_failed(self, exc: BaseException) -> None:
        if self._outcome is not None and not self._outcome.done():
            self._outcome.set_exception(exc)

    async def _leave_session(self) -> None:
        """Leave the session and wait out an answer being appended (after :meth:`stop` no write is in flight)."""
        if self._session is None:
            return
        self._session.leave(self)
        delivery = self._delivery
        for _ in range(100):
            if delivery is None or delivery.done():
                break
            delivery.cancel()
            await asyncio.wait((delivery,), timeout=0.5)

    async def _own_link(self) -> None:
        """In a session, this fetcher's own connection (truncation, surveys, copies) opens only when needed."""
        if self._session is not None and not self._link.connected:
            await self._link.open()
