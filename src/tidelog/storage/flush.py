"""When appended bytes reach stable storage: the flush policy, and group commit.

Every write to a segment is numbered (a *write sequence*, :meth:`Flusher.note_write`) and marks its segment
dirty. ``durable`` is the highest sequence known to be on stable storage.

Group commit (``FlushPolicy.ALWAYS``): an appender that needs durability waits for ``durable`` to reach its
sequence. A *round* snapshots ``target = written`` and the set of dirty segments, runs ``fdatasync`` on each,
then sets ``durable = target`` and wakes every waiter at or below it. Appenders that write while a round runs
cannot be sure it covered them, so they wait for the next round, which starts as soon as the current one ends
and covers all of them at once. Under load, one fsync therefore acknowledges every batch appended since the
previous one; with a single appender it costs one fsync per append, as a plain write-then-fsync loop would.

Where the fsync runs (:class:`FlushMode`). A round normally runs off the loop, in a worker thread, so the event
loop goes on serving while the disk works. But for a lone append the hop *is* the latency: waking a worker,
handing it the GIL and waking the loop again cost more than the fsync blocks the loop (``docs/performance.md``).
So under ``FlushMode.ADAPTIVE`` a round runs *inline*, on the loop thread, when nothing else could use the loop
meanwhile and blocking it is cheap:

- the flusher is idle (no round scheduled or running) and the policy is ``ALWAYS``: the append asking is the
  only one waiting, so there is nobody to group with and no fsync to overlap with;
- what it syncs is small: one segment, no directory, at most :data:`INLINE_MAX_BYTES`;
- this flusher's fsyncs have been fast: their moving average is under :data:`INLINE_MAX_SYNC_NS`. A slow or
  stalling disk sends rounds to the worker, whose timings bring inline back once the disk recovers;
- the loop is idle enough (:class:`_LoopShare`, one per loop, shared by the flushers of one
  :class:`FlushShares`): no worker round of any
  log is scheduled or running on it; no inline fsync ran in this turn of the loop and no round just woke
  several appenders (their appends, already scheduled, then share one worker round: a burst costs one fsync
  however fast the disk); and the loop's thread has been on the CPU at most :data:`INLINE_MAX_LOOP_LOAD` of
  the time since the last look. A lone client leaves the loop idle while its ack and its next request
  travel; a busy loop keeps its fsyncs on the worker and overlaps them with its work.

The worst an inline fsync does to the loop is therefore one small fsync (or a stall the moving average has not
seen yet) at a moment when the loop had little else to do. A round that does not run inline is *scheduled*
(``call_soon``) rather than started at once, so every append of the current loop turn joins it (except under
``FlushMode.WORKER``). Under load rounds stay on the worker, back to back.

The worker threads are a job queue and bare threads (:class:`_SyncThreads`), not a ``ThreadPoolExecutor``: a
round needs no ``concurrent.futures.Future`` (the thread reports back with one ``call_soon_threadsafe``), and
the executor's future, work item and idle semaphore are Python-level locks taken under the GIL on both threads.

``fdatasync`` rather than ``fsync``: it flushes the data and the metadata needed to read it back (the file
size), skipping timestamps. A round also fsyncs the directory when a segment file was created since the last
one (:meth:`Flusher.note_directory`), so an acknowledged append never sits in a file whose name could vanish.
A segment is *pinned* while a worker thread syncs it, so a concurrent truncation or retention can close it
without the thread touching a closed descriptor (an inline fsync needs no pin: nothing else runs meanwhile).

If an fsync fails, the kernel may already have dropped the dirty pages, so a retry could "succeed" without
the data (the 2018 "fsyncgate" lesson). The flusher therefore fails every waiter and stays failed: the log
refuses further appends and must be reopened, which rescans its tail.

``INTERVAL`` runs :meth:`Flusher.flush` every ``flush_interval_ms`` on the injected clock, from a timer that
exists only while something written is not yet flushed (an idle log has none); ``NEVER`` leaves
write-back to the kernel. Both still flush on :meth:`Flusher.flush` and at close, always on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from tidelog import telemetry
from tidelog.clock import Clock
from tidelog.storage.atomic import fsync_directory
from tidelog.storage.config import FlushPolicy
from tidelog.storage.errors import StorageError
from tidelog.storage.open_files import OPEN_FILES
from tidelog.storage.sync_threads import submit_sync_job

T = TypeVar("T")
log = logging.getLogger(__name__)

INLINE_MAX_BYTES = 256 * 1024
"""The most unsynced bytes an inline fsync may write (an fsync's time grows little up to there)."""
INLINE_MAX_SYNC_NS = 2_000_000
"""Inline fsyncs only while the flusher's fsyncs average (EWMA) under 2 ms."""
INLINE_MAX_LOOP_LOAD = 0.8
"""Inline fsyncs only while the loop's thread has been on the CPU at most 80 % of the time since the last look."""
SYNC_EWMA_WEIGHT = 0.125
"""Weight of the latest fsync in the moving average: one hiccup does not leave inline, a long stall sends the
next rounds to the worker."""


class FlushFailedError(StorageError):
    """An fsync failed: acknowledged durability can no longer be promised until the log is reopened."""


class Syncable(Protocol):
    """What the flusher syncs: a segment (fdatasync, pinned while a worker thread has it)."""

    def sync(self) -> None: ...
    def pin(self) -> None: ...
    def unpin(self) -> None: ...


class FlushMode(enum.Enum):
    """Where a log's group-commit rounds run; fixed when the log is opened (:meth:`Flusher.set_mode` says when
    it changes on a live log)."""

    ADAPTIVE = "adaptive"
    """A round runs inline on the loop thread when that is cheap (module docstring), else on a worker thread,
    scheduled at the loop's next turn so that every append of the current turn joins it."""
    WORKER = "worker"
    """Every round runs on a worker thread and starts at once. For a replicated partition's leader: followers
    woken by a write fetch it while the leader's fsync runs, instead of after an fsync blocking the loop, and
    the round does not wait behind the answers to their fetches. Appends of the same turn join the next round;
    under load rounds run back to back either way."""


class RoundState(enum.Enum):
    """Where a flusher's group commit stands. Waiters exist only in ``SCHEDULED`` and ``SYNCING``."""

    IDLE = "idle"
    """No round scheduled or running: the next waiter may fsync inline, or schedules a round."""
    SCHEDULED = "scheduled"
    """A worker round starts at the loop's next turn; waiters arriving meanwhile join it."""
    SYNCING = "syncing"
    """A worker thread is syncing; waiters arriving meanwhile wait for the round after it."""


# ---------------------------------------------------------------------------------------------- worker threads


def _sync_all(targets: Iterable[Syncable], directories: Iterable[Path]) -> None:
    for target in targets:
        target.sync()
    for directory in directories:
        fsync_directory(directory)


def _round_in_thread(
    loop: asyncio.AbstractEventLoop,
    report: Callable[[int, list[Syncable], BaseException | None, int], None],
    clock: Clock,
    target: int,
    targets: list[Syncable],
    directories: list[Path],
) -> None:
    error: BaseException | None = None
    started = clock.monotonic_ns()
    try:
        _sync_all(targets, directories)
    except BaseException as exc:
        error = exc
    elapsed = clock.monotonic_ns() - started
    with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile: nobody is left to tell
        loop.call_soon_threadsafe(report, target, targets, error, elapsed)


def _busy(directory: Path | None, fn: Callable[..., T], *args: object) -> T:
    """Blocking work on a log in a worker thread: it may hold its segments' descriptors, so none of them is
    released meanwhile (:meth:`~tidelog.storage.open_files.OpenFiles.busy`)."""
    if directory is None:
        return fn(*args)
    with OPEN_FILES.busy(directory):
        return fn(*args)


# ---------------------------------------------------------------------------------------------- the loop's share


class _LoopShare:
    """What one event loop is doing, as far as inline fsyncs are concerned; shared by every flusher on it.

    The loop's *load* is the share of wall time its thread spent on the CPU between two looks (at each inline
    decision and at the end of each inline fsync): time blocked in ``epoll`` (or in an fsync) does not count.
    Every flusher on a loop is expected to read the same clock (a mix could only ever cost or allow an inline
    fsync: never a guarantee).
    """

    __slots__ = ("cpu_ns", "rounds", "turn_taken", "wall_ns")

    def __init__(self) -> None:
        self.rounds = 0
        """Worker rounds scheduled or running on this loop, all flushers together."""
        self.turn_taken = False
        """An inline fsync ran, or a round woke several appenders, in this turn of the loop."""
        self.wall_ns: int | None = None
        """Clock reading at the latest look (None: never looked)."""
        self.cpu_ns = 0
        """The loop thread's CPU time at the latest look."""

    def allows(self, wall_ns: int, cpu_ns: int) -> bool:
        """May a flusher sync inline now? Takes a look at the load (the next one measures from here)."""
        if self.rounds or self.turn_taken:
            return False
        quiet = self.wall_ns is None or cpu_ns - self.cpu_ns <= INLINE_MAX_LOOP_LOAD * (wall_ns - self.wall_ns)
        self.wall_ns, self.cpu_ns = wall_ns, cpu_ns
        return quiet

    def spend(self, loop: asyncio.AbstractEventLoop, wall_ns: int, cpu_ns: int) -> None:
        """An inline fsync ended: the load is measured from here, and this turn of the loop has had its one."""
        self.wall_ns, self.cpu_ns = wall_ns, cpu_ns
        self.take_turn(loop)

    def take_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        """No inline fsync until everything already scheduled on the loop has run."""
        if not self.turn_taken:
            self.turn_taken = True
            loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self.turn_taken = False


class FlushShares:
    """The loop shares of a set of flushers: the flushers given one object look at one :class:`_LoopShare` per
    event loop, so that one log's worker round or inline fsync keeps the others' fsyncs off that loop.

    Owned by whoever opens the logs: the broker's partition manager holds one for all its logs. A log opened
    without one gets its own and sees only its own rounds.
    """

    __slots__ = ("_shares",)

    def __init__(self) -> None:
        self._shares: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopShare] = weakref.WeakKeyDictionary()

    def of(self, loop: asyncio.AbstractEventLoop) -> _LoopShare:
        share = self._shares.get(loop)
        if share is None:
            share = self._shares[loop] = _LoopShare()
        return share


# ---------------------------------------------------------------------------------------------- the flusher


def _call(on_durable: Callable[[], None]) -> None:
    """Run an ``on_durable`` callback; its failure is logged, never raised into the round or the append."""
    try:
        on_durable()
    except Exception:
        log.exception("a durability callback failed")


class Flusher:
    """Flush policy and group commit for one log. All methods run on the event loop thread.

    ``clock`` times the fsyncs and the loop's load; ``mode`` says where rounds run; ``shares``: the flushers this
    one looks at before an inline fsync (:class:`FlushShares`; its own when not given); ``cpu_ns`` reads the
    calling thread's CPU time (tests pass their own to describe a busy or an idle loop).
    """

    def __init__(
        self,
        policy: FlushPolicy,
        interval_ms: int,
        clock: Clock,
        *,
        mode: FlushMode = FlushMode.ADAPTIVE,
        shares: FlushShares | None = None,
        cpu_ns: Callable[[], int] = time.thread_time_ns,
    ) -> None:
        self.policy = policy
        self._mode = mode
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self._cpu_ns = cpu_ns  # CPU time of the calling (event loop) thread: a measurement, not a timer
        self.written = 0
        """Sequence of the latest write."""
        self.durable = 0
        """Every write with a sequence at or below this is on stable storage."""
        self.position: Callable[[], int] = lambda: 0
        """The log's end offset now (set by the log): a round reads it when it snapshots what it covers."""
        self.durable_end = 0
        """The log's end offset at the snapshot of the last round that succeeded: every byte below it was
        fsynced (or read back at open). After a failure, what a recovery keeps (:meth:`cut_durable`)."""
        self._round_end = 0  # position() when the running worker round took its snapshot
        self.fsync_rounds = 0
        """Completed group fsync rounds, inline ones included (for tests and metrics)."""
        self.inline_rounds = 0
        """Completed rounds that ran inline on the loop thread (for tests and metrics)."""
        self.sync_ewma_ns = 0.0
        """Moving average of this flusher's fsync rounds, in ns of its clock (inline and worker)."""
        self._dirty: dict[Syncable, None] = {}  # insertion-ordered set
        self._dirty_bytes = 0  # written since the last round's snapshot
        self._round_bytes = 0  # what the running worker round syncs (for the fsynced-bytes metric)
        self._dirty_directories: set[Path] = set()
        self._waiters: list[tuple[int, asyncio.Future[None], Callable[[], None] | None]] = []
        self._state = RoundState.IDLE
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shares = FlushShares() if shares is None else shares
        self._share = _LoopShare()  # the share of the loop the flusher runs on (looked up when idle)
        self._ticker: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._closed = False
        self.directory: Path | None = None
        """The log's directory: its blocking work (:meth:`run_blocking`) keeps its segments' descriptors open."""

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    @property
    def state(self) -> RoundState:
        return self._state

    @property
    def mode(self) -> FlushMode:
        return self._mode

    def set_mode(self, mode: FlushMode) -> None:
        """Change where rounds run from the next one on (:meth:`~tidelog.storage.log.Log.set_flush_mode` says why
        a live log's mode changes at all)."""
        self._mode = mode

    def check(self) -> None:
        """Raise FlushFailedError if an earlier fsync failed."""
        if self._failed is not None:
            raise FlushFailedError(f"an fsync failed; reopen the log: {self._failed}") from self._failed

    def note_write(self, target: Syncable, size: int = 0) -> int:
        """Record a write of ``size`` bytes to ``target``; returns its sequence. Starts the interval ticker."""
        self._dirty[target] = None
        self._dirty_bytes += size
        self.written += 1
        if self.policy is FlushPolicy.INTERVAL and self._ticker is None and not self._closed:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self.written

    def note_directory(self, directory: Path) -> None:
        """A file was created in ``directory``: the next round fsyncs the directory too, so an append
        acknowledged into a new segment never loses the segment's name."""
        self._dirty_directories.add(directory)

    def poison(self, error: BaseException) -> None:
        """Record a failed fsync made elsewhere (sealing a segment): from now on the log refuses appends."""
        if self._failed is None:
            self._failed = error

    def cut_durable(self, offset: int, *, exact: bool = False) -> None:
        """The log was cut to ``offset`` (a truncation: nothing at or above it is known durable any more, also
        for a round already under way), or with ``exact`` restarted there (a reset, durable by itself)."""
        self.durable_end = offset if exact else min(self.durable_end, offset)
        self._round_end = offset if exact else min(self._round_end, offset)

    def forget(self, target: Syncable) -> None:
        """``target`` is gone (deleted): there is nothing of it left to sync."""
        self._dirty.pop(target, None)

    async def after_write(self, seq: int, on_durable: Callable[[], None] | None = None) -> None:
        """What an append waits for before acknowledging: an fsync covering ``seq`` under ALWAYS, else nothing.

        ``on_durable`` runs the moment the fsync covering ``seq`` has returned, from inside the round (before any
        waiter resumes), or before this returns when no fsync is needed; never when the fsync fails or the wait
        is cancelled first. A follower sends its acknowledgement from there
        (:meth:`~tidelog.replication.follower.fetcher.ReplicaFetcher._on_fetching`)."""
        if self.policy is FlushPolicy.ALWAYS and seq > self.durable:
            await self.wait_durable(seq, on_durable)
        elif on_durable is not None:
            _call(on_durable)

    async def flush(self) -> None:
        """Make every write so far durable, whatever the policy."""
        await self.wait_durable(self.written)

    async def wait_durable(self, seq: int, on_durable: Callable[[], None] | None = None) -> None:
        """Return once a group fsync has covered write ``seq``: inline when the flusher is idle and the loop can
        afford it (module docstring), else joining the scheduled or next worker round."""
        self.check()
        if seq <= self.durable:
            if on_durable is not None:
                _call(on_durable)
            return
        loop = asyncio.get_running_loop()
        if self._state is RoundState.IDLE:
            if loop is not self._loop:
                self._loop, self._share = loop, self._shares.of(loop)
            if self._may_sync_inline():
                self._sync_inline(loop)  # durable = written >= seq, or raises
                if on_durable is not None:
                    _call(on_durable)
                return
            self._state = RoundState.SCHEDULED
            self._share.rounds += 1
            if self._mode is FlushMode.ADAPTIVE:
                loop.call_soon(self._start_round, loop)
            else:
                self._start_round(loop)  # see FlushMode.WORKER
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append((seq, future, on_durable))
        await future

    # -- inline rounds ---------------------------------------------------------------------------------------

    def _may_sync_inline(self) -> bool:
        return (
            self._mode is FlushMode.ADAPTIVE
            and self.policy is FlushPolicy.ALWAYS
            and len(self._dirty) == 1
            and not self._dirty_directories
            and self._dirty_bytes <= INLINE_MAX_BYTES
            and self.sync_ewma_ns < INLINE_MAX_SYNC_NS
            and self._share.allows(self._clock.monotonic_ns(), self._cpu_ns())
        )

    def _sync_inline(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sync the one dirty segment on the loop thread (idle flusher: nobody else is waiting)."""
        target = self.written
        end = self.position()
        (segment,) = self._dirty
        nbytes = self._dirty_bytes
        clock = self._clock
        started = clock.monotonic_ns()
        try:
            segment.sync()
        except Exception as exc:
            self._fail(exc)
            raise FlushFailedError(f"fsync failed: {exc}") from exc
        ended = clock.monotonic_ns()
        self._share.spend(loop, ended, self._cpu_ns())
        self._dirty.clear()
        self._dirty_bytes = 0
        self._note_sync_time(ended - started)
        telemetry.fsynced(ended - started, 1, nbytes)
        self.inline_rounds += 1
        self.fsync_rounds += 1
        self.durable = target
        self.durable_end = end

    # -- worker rounds ---------------------------------------------------------------------------------------

    def _start_round(self, loop: asyncio.AbstractEventLoop) -> None:
        """Snapshot what is written and dirty, and fsync it in a worker thread.

        A round is a chain of callbacks, not a task: the thread's ``call_soon_threadsafe`` reports back, and
        :meth:`_end_round` wakes the waiters on the loop, so an acknowledgement costs one wake-up of the loop.
        The round finishes even if every waiter was cancelled meanwhile.
        """
        target = self.written
        self._round_end = self.position()
        targets = list(self._dirty)
        directories = list(self._dirty_directories)
        self._dirty.clear()
        self._round_bytes, self._dirty_bytes = self._dirty_bytes, 0
        self._dirty_directories.clear()
        for each in targets:
            each.pin()
        self._state = RoundState.SYNCING
        submit_sync_job(
            functools.partial(_round_in_thread, loop, self._end_round, self._clock, target, targets, directories)
        )

    def _end_round(self, target: int, targets: list[Syncable], error: BaseException | None, elapsed_ns: int) -> None:
        """On the loop: release the targets, then wake (or fail) every waiter the round covered."""
        for each in targets:
            each.unpin()
        if error is not None:
            self._to_idle()
            self._fail(error)
            return
        self._note_sync_time(elapsed_ns)
        self.fsync_rounds += 1
        self.durable = max(self.durable, target)
        self.durable_end = self._round_end
        still: list[tuple[int, asyncio.Future[None], Callable[[], None] | None]] = []
        woken = 0
        for waiter in self._waiters:
            seq, future, on_durable = waiter
            if future.done():
                continue  # gave up (cancelled): nobody to tell
            if seq <= target:
                if on_durable is not None:
                    _call(on_durable)
                future.set_result(None)
                woken += 1
            else:
                still.append(waiter)
        self._waiters = still
        telemetry.fsynced(elapsed_ns, woken, self._round_bytes)
        loop = asyncio.get_running_loop()
        if woken > 1:  # a wave of appenders resumes next: their appends share one round, none goes inline
            self._share.take_turn(loop)
        if still:  # writes made while this round ran: the next round covers all of them at once
            self._start_round(loop)
        else:
            self._to_idle()

    def _to_idle(self) -> None:
        self._state = RoundState.IDLE
        self._share.rounds -= 1

    # -- both ------------------------------------------------------------------------------------------------

    def _note_sync_time(self, elapsed_ns: int) -> None:
        self.sync_ewma_ns += SYNC_EWMA_WEIGHT * (elapsed_ns - self.sync_ewma_ns)

    def _fail(self, error: BaseException) -> None:
        """An fsync failed: stay failed, and fail every waiter."""
        log.error(
            "fsync failed (%s): this log refuses appends until it is reopened; the %d appends waiting for it fail "
            "unacknowledged",
            error,
            len(self._waiters),
        )
        self._failed = error
        failure = FlushFailedError(f"fsync failed: {error}")
        for _, future, _on_durable in self._waiters:
            if not future.done():
                future.set_exception(failure)
        self._waiters.clear()

    async def run_blocking(self, fn: Callable[..., T], *args: object) -> T:
        """Run blocking disk work (fsync, index writes, file rewrites) in a worker thread.

        Shielded: if the caller is cancelled the work still completes, so files are never left half-done.
        """
        future = asyncio.get_running_loop().run_in_executor(None, functools.partial(_busy, self.directory, fn, *args))
        try:
            return await asyncio.shield(future)
        finally:
            OPEN_FILES.trim()  # what the work kept open past the bound (open_files)

    def run_detached(self, job: Callable[[], None], then: Callable[[], None]) -> None:
        """Run ``job`` on the fsync threads without waiting for it; ``then`` runs on the loop afterwards (even if
        the job raised). For background disk work that no appender waits on (a segment's zero fill)."""
        loop = asyncio.get_running_loop()

        def run() -> None:
            try:
                job()
            finally:
                with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
                    loop.call_soon_threadsafe(then)

        submit_sync_job(run)

    async def sync_directory(self, path: Path) -> None:
        await self.run_blocking(fsync_directory, path)

    async def _tick(self) -> None:
        """Flush every interval while there is something to flush; then end (the next write starts it again), so
        an idle log has no timer."""
        while not self._closed:
            await self._clock.sleep(self._interval_s)
            if self.written > self.durable and self._failed is None:
                with contextlib.suppress(FlushFailedError):
                    await self.flush()
            if self.written <= self.durable or self._failed is not None:
                self._ticker = None
                return

    async def close(self) -> None:
        """Stop the ticker and flush what is left (raises FlushFailedError if that fails)."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._failed is None:
            await self.flush()
        self.check()
