"""When appended bytes reach stable storage: the flush policy, and group commit.

Every write to a segment is numbered (a *write sequence*, :meth:`Flusher.note_write`) and marks its segment
dirty. ``durable`` is the highest sequence known to be on stable storage.

Group commit (``FlushPolicy.ALWAYS``): an appender that needs durability waits for ``durable`` to reach its
sequence. If no fsync is running, the first waiter starts one; it snapshots ``target = written`` and the set
of dirty segments, runs ``fdatasync`` on each in a worker thread, then (back on the loop) sets
``durable = target`` and wakes every waiter at or below it. Appenders that write while that fsync runs cannot
be sure it covered them, so they wait for the next round, which starts as soon as the current one ends and
covers all of them at once.
Under load, one fsync therefore acknowledges every batch appended since the previous one; with a single
appender it costs one fsync per append, as a plain write-then-fsync loop would.

``fdatasync`` rather than ``fsync``: it flushes the data and the metadata needed to read it back (the file
size), skipping timestamps. A round also fsyncs the directory when a segment file was created since the last
one (:meth:`Flusher.note_directory`), so an acknowledged append never sits in a file whose name could vanish.

No fsync ever runs on the event loop thread. A segment is *pinned* while a worker thread syncs it, so a
concurrent truncation or retention can close it without the thread touching a closed descriptor.

If an fsync fails, the kernel may already have dropped the dirty pages, so a retry could "succeed" without
the data (the 2018 "fsyncgate" lesson). The flusher therefore fails every waiter and stays failed: the log
refuses further appends and must be reopened, which rescans its tail.

``INTERVAL`` runs :meth:`Flusher.flush` every ``flush_interval_ms`` on the injected clock; ``NEVER`` leaves
write-back to the kernel. Both still flush on :meth:`Flusher.flush` and at close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from tidelog.clock import Clock
from tidelog.storage.atomic import fsync_directory
from tidelog.storage.config import FlushPolicy
from tidelog.storage.errors import StorageError

T = TypeVar("T")


class FlushFailedError(StorageError):
    """An fsync failed: acknowledged durability can no longer be promised until the log is reopened."""


class Syncable(Protocol):
    """What the flusher syncs: a segment (fdatasync in a thread, pinned meanwhile)."""

    def sync(self) -> None: ...
    def pin(self) -> None: ...
    def unpin(self) -> None: ...


def _sync_all(targets: Iterable[Syncable], directories: Iterable[Path]) -> None:
    for target in targets:
        target.sync()
    for directory in directories:
        fsync_directory(directory)


_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_THREADS = 8


def _fsync_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that run group fsyncs, shared by every log of the process (created on first use).

    Separate from the loop's default executor so that slow work there (compaction, seals of large segments)
    never delays an acknowledgement, and used through ``submit`` directly: one wake-up of the loop per round.
    """
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="tidelog-fsync")
    return _POOL


def _round_in_thread(
    loop: asyncio.AbstractEventLoop,
    report: Callable[[int, list[Syncable], BaseException | None], None],
    target: int,
    targets: list[Syncable],
    directories: list[Path],
) -> None:
    error: BaseException | None = None
    try:
        _sync_all(targets, directories)
    except BaseException as exc:
        error = exc
    with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile: nobody is left to tell
        loop.call_soon_threadsafe(report, target, targets, error)


class Flusher:
    """Flush policy and group commit for one log. All methods run on the event loop thread."""

    def __init__(self, policy: FlushPolicy, interval_ms: int, clock: Clock) -> None:
        self.policy = policy
        self._interval_s = interval_ms / 1000
        self._clock = clock
        self.written = 0
        """Sequence of the latest write."""
        self.durable = 0
        """Every write with a sequence at or below this is on stable storage."""
        self.fsync_rounds = 0
        """Completed group fsync rounds (for tests and metrics)."""
        self._dirty: dict[Syncable, None] = {}  # insertion-ordered set
        self._dirty_directories: set[Path] = set()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._in_flight = False
        self._ticker: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._closed = False

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def check(self) -> None:
        """Raise FlushFailedError if an earlier fsync failed."""
        if self._failed is not None:
            raise FlushFailedError(f"an fsync failed; reopen the log: {self._failed}") from self._failed

    def note_write(self, target: Syncable) -> int:
        """Record a write to ``target``; returns its sequence. Starts the interval ticker on first use."""
        self._dirty[target] = None
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

    def forget(self, target: Syncable) -> None:
        """``target`` is gone (deleted): there is nothing of it left to sync."""
        self._dirty.pop(target, None)

    async def after_write(self, seq: int) -> None:
        """What an append waits for before acknowledging: an fsync covering ``seq`` under ALWAYS, else nothing."""
        if self.policy is FlushPolicy.ALWAYS:
            await self.wait_durable(seq)

    async def flush(self) -> None:
        """Make every write so far durable, whatever the policy."""
        await self.wait_durable(self.written)

    async def wait_durable(self, seq: int) -> None:
        """Return once a group fsync has covered write ``seq`` (joining the running round or the next one)."""
        self.check()
        if seq <= self.durable:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append((seq, future))
        if not self._in_flight:
            self._start_round(loop)
        await future

    def _start_round(self, loop: asyncio.AbstractEventLoop) -> None:
        """Snapshot what is written and dirty, and fsync it in a worker thread.

        A round is a chain of callbacks, not a task: the thread reports back with ``call_soon_threadsafe``
        and :meth:`_end_round` wakes the waiters on the loop, so an acknowledgement costs one thread hop and
        one loop turn. The round finishes even if every waiter was cancelled meanwhile.
        """
        target = self.written
        targets = list(self._dirty)
        directories = list(self._dirty_directories)
        self._dirty.clear()
        self._dirty_directories.clear()
        for each in targets:
            each.pin()
        self._in_flight = True
        _fsync_pool().submit(_round_in_thread, loop, self._end_round, target, targets, directories)

    def _end_round(self, target: int, targets: list[Syncable], error: BaseException | None) -> None:
        """On the loop: release the targets, then wake (or fail) every waiter the round covered."""
        for each in targets:
            each.unpin()
        self._in_flight = False
        if error is not None:
            self._failed = error
            failure = FlushFailedError(f"fsync failed: {error}")
            for _, future in self._waiters:
                if not future.done():
                    future.set_exception(failure)
            self._waiters.clear()
            return
        self.fsync_rounds += 1
        self.durable = max(self.durable, target)
        still: list[tuple[int, asyncio.Future[None]]] = []
        for seq, future in self._waiters:
            if future.done():
                continue
            if seq <= target:
                future.set_result(None)
            else:
                still.append((seq, future))
        self._waiters = still
        if still:  # writes made while this round ran: the next round covers all of them at once
            self._start_round(asyncio.get_running_loop())

    async def run_blocking(self, fn: Callable[..., T], *args: object) -> T:
        """Run blocking disk work (fsync, index writes, file rewrites) in a worker thread.

        Shielded: if the caller is cancelled the work still completes, so files are never left half-done.
        """
        future = asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
        return await asyncio.shield(future)

    async def sync_directory(self, path: Path) -> None:
        await self.run_blocking(fsync_directory, path)

    async def _tick(self) -> None:
        while not self._closed:
            await self._clock.sleep(self._interval_s)
            if self.written > self.durable and self._failed is None:
                with contextlib.suppress(FlushFailedError):
                    await self.flush()

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
