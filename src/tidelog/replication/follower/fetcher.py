"""The follower side of replication: one task per followed partition that copies the leader's log.

A :class:`ReplicaFetcher` is bound to one leadership (leader id, leader epoch, address). The broker starts one
when it becomes a follower of a partition and stops it (and starts another) whenever the leader or its epoch
changes; a fetcher never changes leader by itself. Its task is a small state machine, one handler per state::

    CONNECTING ──▶ TRUNCATING ──▶ FETCHING ◀─┐
        ▲              │   │          │  ▲   │ (each response: append, fsync, fetch again)
        │              │   └─▶ COPYING ◀─┘   │ (far-horizon catch-up: whole segment files, in rounds)
        └──── BACKING_OFF ◀─────┴─────┴──────┘
                                      └──▶ PARKED (a leader that cannot serve segment files; a failed log)

- **connecting**: a dedicated wire :class:`~tidelog.protocol.connection.Connection` to the leader.
- **truncating**: KIP-101/279 — cut the log where it stops agreeing with the leader's, asking EPOCH_END_OFFSET
  (the decision itself is :mod:`tidelog.replication.follower.truncation`). Run after every (re)connection: it costs one
  round trip and a leader may have changed its log while we could not see it.
- **fetching**: in a broker, through the fetch session with the leader broker (``sessions``,
  :mod:`tidelog.replication.follower.session`): the fetcher closes its own connection, joins the session, and the
  session hands it each answer about its partition, appended exactly as below
  (:mod:`tidelog.replication.follower.session_member`); a failure about its partition comes back here, the others
  go on. Without a session: REPLICA_FETCH at the log end, long-polling at the tail; append what comes back with
  :meth:`Log.append_as_follower`, which returns once the log's flush policy is met (flush ``always``: fsynced),
  and only then fetch again. The next fetch's offset is the acknowledgement the leader's high watermark waits
  for, so nothing is acknowledged before it is durable here. One request in flight, no sleep on this path:
  the leader's write wakes the long-poll, and the fsync here is followed by exactly one round trip.
- **copying**: far-horizon catch-up (seed 001, :mod:`tidelog.replication.follower.catch_up`): copy the leader's sealed
  segment files in rounds, then fetch again. Entered when a fetch answers OFFSET_OUT_OF_RANGE below the leader's
  log start (retention deleted what we need next), or when more than ``copy_threshold_bytes`` of sealed
  segments lie beyond our log end: checked after each truncation (every connection) and again each time that
  many bytes were fetched without catching up, one SEGMENT_LIST round trip each time.
- **parked**: behind a leader that cannot serve segment files, or the log failed a write or an fsync: a fetch
  names the log end, which is an acknowledgement, and the end of a failed log may hold bytes its disk never
  got (the broker recovers the log and starts a new fetcher: :mod:`tidelog.broker.partitions.failed_logs`).
- **backing off**: after a failure, 50 ms doubling to 1 s, then back to where it failed (connecting when the
  connection is gone, truncating when that never completed, fetching otherwise). The leader being unreachable
  (connection refused or lost, or a request unanswered past its deadline) is reported once per outage through
  ``on_leader_unreachable``; NOT_LEADER and FENCED_LEADER_EPOCH are simply retried: the metadata will move
  the broker to stop this fetcher and start one for the new leadership.

The fetcher decides; its :class:`~tidelog.replication.follower.local_replica.LocalReplica` carries the changes
out on this broker's copy: truncations and resets, the follower's high watermark (``min(leader HW seen, own log
end)``, lowered only with a cut below it, ``on_high_watermark`` told either way) and the producer state
(``producers``, optional). The fetcher is the only writer of a follower's log, so it records the headers of every
payload it appends in that state (also when the append is cancelled after its write, so a promotion finds every
batch the log holds; :mod:`tidelog.replication.idempotence.producer_sync`): that is what lets this replica, once
leader, answer a producer's retry with the original offsets. Its requests go through a
:class:`~tidelog.replication.follower.leader_link.LeaderLink`, a connection of its own to the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable

from tidelog.clock import Clock, SystemClock
from tidelog.protocol.connection import ConnectionClosedError, Response
from tidelog.protocol.errors import TidelogError, UnsupportedError, from_error_body
from tidelog.protocol.frames import ProtocolError
from tidelog.protocol.peer_messages import (
    EpochEndOffsetRequest,
    EpochEndOffsetResponse,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)
from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError
from tidelog.protocol.tls import SslSource
from tidelog.replication.follower.catch_up import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_COPY_THRESHOLD_BYTES,
    DEFAULT_MAX_ROUNDS,
    CatchUpIncompleteError,
    CatchUpStats,
    CopyHooks,
    SegmentCopier,
)
from tidelog.replication.follower.fetcher_state import CatchUpNeededError, FetcherState, FetcherStatus
from tidelog.replication.follower.leader_link import LeaderLink, expect, response_of
from tidelog.replication.follower.local_replica import LocalReplica
from tidelog.replication.follower.session import FetchSessions
from tidelog.replication.follower.session_member import SessionFetching
from tidelog.replication.follower.truncation import truncation_step
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.replication.idempotence.producer_sync import (
    record_replicated,
)
from tidelog.storage.epoch_cache import UNDEFINED, UNDEFINED_EPOCH, EpochEndOffset
from tidelog.storage.errors import DiskFullError, LogClosedError
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

MIN_BACKOFF = 0.05
MAX_BACKOFF = 1.0
MAX_TRUNCATION_ROUNDS = 1000  # each round asks about a strictly older epoch: far more than any real history


class ReplicaFetcher(SessionFetching):
    """Copies one partition from its leader into ``log``; see the module docstring."""

    def __init__(
        self,
        log_: Log,
        stream: str,
        partition: int,
        broker_id: str,
        leader_id: str,
        leader_epoch: int,
        leader_address: str,
        *,
        initial_hw: int,
        max_wait_ms: int = 500,
        max_bytes: int = 1024 * 1024,
        on_high_watermark: Callable[[int], None] | None = None,
        on_leader_unreachable: Callable[[], Awaitable[None]] | None = None,
        request_timeout: float = 5.0,
        connect_timeout: float = 5.0,
        clock: Clock | None = None,
        copy_threshold_bytes: int = DEFAULT_COPY_THRESHOLD_BYTES,
        copy_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_copy_rounds: int = DEFAULT_MAX_ROUNDS,
        copy_hooks: CopyHooks | None = None,
        producers: ProducerStateTable | None = None,
        ssl: SslSource | None = None,
        sessions: FetchSessions | None = None,
    ) -> None:
        """``sessions``: fetch through this broker's session with the leader broker (one connection for every
        partition followed from it, :mod:`tidelog.replication.follower.session`); None: REPLICA_FETCH on a
        connection of this fetcher's own (tools, tests, and the benchmarks that compare both).

        ``producers``: the replica's producer state, kept in step with every change this fetcher makes to
        the log (None: not tracked, as for tools that only copy a log).

        ``request_timeout`` bounds a response beyond the long-poll (``max_wait_ms``): a leader that accepts
        connections but never answers (paused, wedged) counts as unreachable after it.

        ``copy_threshold_bytes``: copy sealed segment files rather than fetch when more than this many bytes of
        them lie beyond our log end (0: only when the log ends below the leader's start). ``copy_chunk_bytes``
        is the size of one SEGMENT_FETCH, ``max_copy_rounds`` bounds one catch-up (see
        :mod:`tidelog.replication.follower.catch_up`); ``copy_hooks`` are test seams."""
        self._log = log_
        self.stream = stream
        self.partition = partition
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.leader_address = leader_address
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._on_leader_unreachable = on_leader_unreachable
        self._fetch_timeout = max_wait_ms / 1000 + request_timeout
        self._request_timeout = request_timeout
        self._clock: Clock = clock or SystemClock()
        self._leader_end = -1
        self._leader_start = 0  # as of the last out-of-range answer
        self._state = FetcherState.CONNECTING
        self._state_waiters: list[asyncio.Future[None]] = []
        self._truncated = False  # truncation completed on the current connection
        self._verify_next = False  # the leader's last answer failed its CRC here: ask it to check its disk
        self._in_outage = False  # the leader was reported unreachable and has not answered since
        self._backoff = MIN_BACKOFF
        self._last_error: str | None = None
        self._link = LeaderLink(leader_id, leader_address, connect_timeout, ssl=ssl)
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._copy_threshold = copy_threshold_bytes
        self._copy_pending = False  # a catch-up was decided and has not completed: back-offs resume it
        self._copy_supported = True  # False once the leader answered UNSUPPORTED (an older broker)
        self._fetched_since_survey = 0  # bytes fetched since the lag was last measured
        self._producers = producers
        self._replica = LocalReplica(log_, self.name, initial_hw, producers, on_high_watermark, self._clock)
        self._session = None if sessions is None else sessions.session(leader_id, leader_address)
        self._outcome: asyncio.Future[bool] | None = None  # joined to the session: True copy, False survey
        self._delivery: asyncio.Task[None] | None = None  # the session handing this partition an answer
        self._leader_hw = 0  # the leader's high watermark as last heard (each session entry tells the leader)
        self._copier = SegmentCopier(
            log_,
            self._link.send,
            stream,
            partition,
            broker_id,
            leader_epoch,
            request_timeout=request_timeout,
            chunk_bytes=copy_chunk_bytes,
            max_rounds=max_copy_rounds,
            near_bytes=copy_threshold_bytes,
            hooks=copy_hooks,
            producers=producers,
        )

    # -- public ------------------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.stream}/{self.partition}"

    @property
    def _ctx(self) -> dict[str, object]:
        """The ``extra=`` of its log lines: the partition and the leader it fetches from (fields of a JSON line)."""
        return {"stream": self.stream, "partition": self.partition, "leader": self.leader_id}

    @property
    def high_watermark(self) -> int:
        """The highest offset known committed here: ``min(leader HW seen, own log end)``."""
        return self._replica.hw

    @property
    def state(self) -> FetcherState:
        return self._state

    @property
    def caught_up(self) -> bool:
        """Whether this replica held the leader's whole log at the last response."""
        return self._state is FetcherState.FETCHING and 0 <= self._leader_end <= self._log.end_offset

    @property
    def catch_up_stats(self) -> CatchUpStats:
        """A copy of the far-horizon catch-up counters (phases, rounds, segments and bytes copied…)."""
        return dataclasses.replace(self._copier.stats)

    def status(self) -> FetcherStatus:
        stats = self._copier.stats
        return FetcherStatus(
            self._state,
            self.leader_id,
            self.leader_epoch,
            self._log.end_offset,
            self._leader_end,
            self._replica.hw,
            self.caught_up,
            self._last_error,
            stats.segments,
            stats.phases,
        )

    async def wait_for_state(self, *states: FetcherState) -> FetcherState:
        """Return once the fetcher is in one of ``states`` (at once when it is): wait on progress, never poll."""
        while self._state not in states:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._state_waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
        return self._state

    async def start(self) -> None:
        """Spawn the fetch task (once); returns at once."""
        if self._task is None and not self._stopped:
            self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.name}")

    async def stop(self) -> None:
        """Cancel the task, wait for it, close the connection. Idempotent; the log stays open (the caller's)."""
        self._stopped = True
        task, self._task = self._task, None
        # Cancel until it is done: one cancellation can be lost inside a library call that completes at the
        # same moment (asyncio.wait_for on Python 3.11), and a fetcher that ran on would hold up the caller
        # (the partition manager, and with it every metadata change) forever. The loop also checks _stopped.
        for _ in range(100):
            if task is None or task.done():
                break
            task.cancel()
            await asyncio.wait((task,), timeout=0.5)
        await self._leave_session()
        await self._disconnect()
        self._set_state(FetcherState.STOPPED)

    # -- the state machine -------------------------------------------------------------------------------------

    async def _run(self) -> None:
        resume = FetcherState.CONNECTING
        try:
            while not self._stopped:
                if self._log.flusher.failed is not None:  # its next fetch would acknowledge what may not be stored
                    log.error(
                        "%s: this replica's log failed a write or an fsync (%s): it stops fetching until the broker "
                        "recovers the log",
                        self.name,
                        self._log.flusher.failed,
                        extra=self._ctx,
                    )
                    self._set_state(FetcherState.PARKED)
                    return
                self._set_state(resume)
                try:
                    if resume is FetcherState.CONNECTING:
                        await self._on_connecting()
                        resume = FetcherState.TRUNCATING
                    elif resume is FetcherState.TRUNCATING:
                        await self._on_truncating()
                        resume = FetcherState.COPYING if await self._should_copy() else FetcherState.FETCHING
                    elif resume is FetcherState.COPYING:
                        await self._on_copying()
                        resume = FetcherState.FETCHING
                    elif self._session is not None:
                        resume = await self._on_session_fetching()  # returns only to copy
                    else:
                        resume = await self._on_fetching()  # returns only to copy
                except (ConnectionClosedError, TimeoutError) as exc:
                    await self._leader_unreachable(exc)
                    resume = FetcherState.CONNECTING
                except TidelogError as exc:  # NOT_LEADER, FENCED, UNAVAILABLE…: the metadata will move us on
                    self._note_failure(f"leader {self.leader_id} refused: {exc}", logging.INFO)
                except (CorruptBatchError, InvalidBatchError, ProtocolError) as exc:
                    self._note_failure(f"bad data from leader {self.leader_id}: {exc}", logging.ERROR)
                    self._verify_next = isinstance(exc, CorruptBatchError)  # bit rot on its disk? it checks
                    self._truncated = False  # re-establish where the logs agree before copying again
                except DiskFullError as exc:  # nothing of the write was kept: copy it again once space is freed
                    self._note_failure(str(exc), logging.WARNING)
                except CatchUpIncompleteError as exc:
                    self._note_failure(str(exc), logging.WARNING)
                except CatchUpNeededError as exc:
                    log.error(
                        "%s: %s; this replica stops fetching until the broker restarts it",
                        self.name,
                        exc,
                        extra=self._ctx,
                    )
                    self._last_error = str(exc)
                    self._set_state(FetcherState.PARKED)
                    return
                except LogClosedError:
                    return  # the broker is closing the partition: nothing left to copy into
                except Exception as exc:
                    log.exception(
                        "%s: fetching from leader %s failed; reconnecting after a back-off",
                        self.name,
                        self.leader_id,
                        extra=self._ctx,
                    )
                    self._last_error = f"{type(exc).__name__}: {exc}"
                    await self._disconnect()
                else:
                    continue
                resume = await self._on_backing_off()
        finally:
            await self._disconnect()
            if self._state is not FetcherState.PARKED:
                self._set_state(FetcherState.STOPPED)

    async def _on_connecting(self) -> None:
        self._truncated = False
        await self._link.open()

    async def _on_truncating(self) -> None:
        """Cut the log back to where it agrees with the leader's (see
        :mod:`tidelog.replication.follower.truncation`)."""
        log_ = self._log
        for _ in range(MAX_TRUNCATION_ROUNDS):
            if log_.end_offset <= log_.start_offset:
                break  # nothing to cut
            epoch = log_.latest_epoch
            leader = UNDEFINED if epoch == UNDEFINED_EPOCH else await self._ask_epoch_end(epoch)
            local = UNDEFINED if leader.epoch == UNDEFINED_EPOCH else log_.end_offset_for_epoch(leader.epoch)
            step = truncation_step(leader, local, log_.end_offset, self._replica.hw)
            await self._replica.truncate(step.offset, step.reason)
            if step.complete:
                break
        else:
            raise ProtocolError(f"epoch truncation of {self.name} did not settle in {MAX_TRUNCATION_ROUNDS} rounds")
        self._truncated = True

    async def _on_fetching(self) -> FetcherState:
        """Fetch, append, fetch again, until something fails or catch-up is due (the busy path: keep it free of
        extra awaits).

        The next fetch goes out as soon as an append is durable, before the bookkeeping of the batches just
        appended (producer state, high watermark): its offset is the acknowledgement the leader's high
        watermark, and an acks-ALL producer, wait for. It is sent from inside the fsync round itself (the
        append's ``on_durable``), before the append returns through its awaits (what each saves:
        docs/performance.md). Not when a lag survey is due next: its request would queue behind the long-poll on the
        connection."""
        log_ = self._log
        ahead: tuple[int, asyncio.Future[Response]] | None = None  # a fetch sent right after the last append
        try:
            while True:
                if ahead is None:
                    offset = log_.end_offset
                    pending = self._fetch(offset)
                else:
                    (offset, pending), ahead = ahead, None
                header, payload = await response_of(pending, self._fetch_timeout)
                response = expect(header, ReplicaFetchResponse)
                if response.error is not None:
                    if await self._on_fetch_error(response, offset):
                        return FetcherState.COPYING
                    continue
                self._reached_leader()
                if payload:
                    fetched = self._fetched_since_survey + len(payload)
                    fetch_next = not (self._copy_threshold and fetched >= self._copy_threshold)
                    sent: list[tuple[int, asyncio.Future[Response]]] = []
                    try:
                        # Returns once durable per the flush policy; the next fetch (our acknowledgement) is sent
                        # from inside the fsync round already, as soon as the batches are durable.
                        await log_.append_as_follower(
                            payload, functools.partial(self._fetch_into, sent) if fetch_next else None
                        )
                        if fetch_next:
                            ahead = sent[0] if sent else (log_.end_offset, self._fetch(log_.end_offset))
                    finally:
                        if self._producers is not None:  # what was written, even if the append then failed
                            record_replicated(self._producers, log_, payload)
                    self._fetched_since_survey = fetched
                    if self._producers is not None:
                        self._replica.maintain_producers()
                self._leader_end = response.log_end
                self._replica.advance_hw(response.high_watermark)
                if self._copy_threshold and self._fetched_since_survey >= self._copy_threshold:
                    self._fetched_since_survey = 0  # that many bytes fetched: still far behind?
                    if response.log_end > log_.end_offset and await self._should_copy():
                        return FetcherState.COPYING
        finally:
            if ahead is not None:  # left with a fetch unanswered (a failure): its answer is of no use now
                ahead[1].cancel()

    async def _should_copy(self) -> bool:
        """Whether far-horizon catch-up is due: more than ``copy_threshold_bytes`` of sealed segments beyond our
        log end (a log ending below the leader's start is found by the fetch itself)."""
        if not self._copy_threshold or not self._copy_supported:
            return False
        await self._own_link()
        try:
            listing, lag = await self._copier.survey()
        except UnsupportedError:
            self._copy_unsupported()
            return False
        self._reached_leader()
        self._fetched_since_survey = 0
        self._leader_start, self._leader_end = listing.log_start, listing.log_end
        self._copy_pending = lag > self._copy_threshold or self._log.end_offset < listing.log_start
        if self._copy_pending:
            log.info("%s: %d bytes of sealed segments behind the leader: copying them", self.name, lag)
        return self._copy_pending

    async def _on_copying(self) -> None:
        """Far-horizon catch-up: copy sealed segment files in rounds (:mod:`tidelog.replication.follower.catch_up`)."""
        self._copy_pending = True
        if not self._copy_supported:
            raise CatchUpNeededError(self._log.end_offset, self._leader_start)
        self._copier.stats.phases += 1
        await self._own_link()
        try:
            listing = await self._copier.run()
        except UnsupportedError:
            self._copy_unsupported()
            raise CatchUpNeededError(self._log.end_offset, self._leader_start) from None
        self._copy_pending = False
        self._reached_leader()
        self._leader_end = listing.log_end
        self._replica.advance_hw(listing.high_watermark)

    def _copy_unsupported(self) -> None:
        if self._copy_supported:
            log.warning("%s: leader %s cannot serve segment files (an older broker?)", self.name, self.leader_id)
        self._copy_supported = False

    async def _on_backing_off(self) -> FetcherState:
        self._set_state(FetcherState.BACKING_OFF)
        await self._clock.sleep(self._backoff)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)
        if self._session is not None and self._truncated:  # its own connection opens only when needed
            return FetcherState.COPYING if self._copy_pending else FetcherState.FETCHING
        if not self._link.connected:
            return FetcherState.CONNECTING
        if not self._truncated:
            return FetcherState.TRUNCATING
        return FetcherState.COPYING if self._copy_pending else FetcherState.FETCHING

    def _set_state(self, state: FetcherState) -> None:
        if state is self._state:
            return
        self._state = state
        waiters, self._state_waiters = self._state_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- steps -------------------------------------------------------------------------------------------------

    async def _ask_epoch_end(self, epoch: int) -> EpochEndOffset:
        await self._own_link()
        request = EpochEndOffsetRequest(self.stream, self.partition, self.broker_id, epoch, self.leader_epoch)
        header, _ = await self._link.send(request, self._request_timeout)
        response = expect(header, EpochEndOffsetResponse)
        if response.error is not None:
            raise from_error_body(response.error)
        self._reached_leader()
        return EpochEndOffset(response.leader_epoch, response.end_offset)

    # -- connection and failures -------------------------------------------------------------------------------

    def _fetch_into(self, sent: list[tuple[int, asyncio.Future[Response]]], offset: int) -> None:
        """The next fetch, sent from inside the fsync round the moment the append is durable (the append's
        ``on_durable``): the acknowledgement leaves before this task resumes. A connection that is gone sends
        nothing here; the fetch loop then sends as before, and meets the failure there."""
        with contextlib.suppress(ConnectionClosedError):
            sent.append((offset, self._fetch(offset)))

    def _fetch(self, offset: int) -> asyncio.Future[Response]:
        """Send a REPLICA_FETCH at ``offset`` (our log end: the acknowledgement of everything below)."""
        verify, self._verify_next = self._verify_next, False
        return self._link.request(
            ReplicaFetchRequest(
                self.stream,
                self.partition,
                self.broker_id,
                offset,
                self.leader_epoch,
                self._max_bytes,
                self._max_wait_ms,
                verify,
            )
        )

    def _reached_leader(self) -> None:
        """A response came back: any outage is over, and the next failure starts backing off from the bottom."""
        self._in_outage = False
        self._backoff = MIN_BACKOFF
        self._last_error = None

    async def _leader_unreachable(self, exc: BaseException) -> None:
        """Drop the connection; report the outage the first time (a report per retry would flood the controller)."""
        reason = str(exc) or "no response in time"
        if self._session is not None:
            self._truncated = False  # truncate again once it answers: it may have changed its log meanwhile
        self._last_error = f"leader {self.leader_id} at {self.leader_address} unreachable: {reason}"
        await self._disconnect()
        if self._in_outage:
            return
        self._in_outage = True
        log.warning(
            "%s: %s; reconnecting, and telling the controller (it fails the leader over if it is gone)",
            self.name,
            self._last_error,
            extra=self._ctx,
        )
        if self._on_leader_unreachable is not None:
            try:
                await self._on_leader_unreachable()
            except Exception:
                log.exception(
                    "%s: telling the controller that leader %s is unreachable failed; it fails the leader over once "
                    "the leader's lease lapses",
                    self.name,
                    self.leader_id,
                    extra=self._ctx,
                )

    def _note_failure(self, message: str, level: int) -> None:
        """Log a failure once, not at every retry of the same one."""
        if message != self._last_error:
            log.log(level, "%s: %s; fetching again after a back-off", self.name, message, extra=self._ctx)
        self._last_error = message

    async def _disconnect(self) -> None:
        await self._link.close()
