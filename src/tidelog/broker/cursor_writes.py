"""Cursor writes of one ``__cursors`` partition, grouped: commits that arrive while one is being written share the
next append (one batch, one fsync round, one acknowledgement round from the ISR).

:class:`~tidelog.broker.cursors.CursorStore` hands every cursor record it stores to :meth:`CursorWrites.write`.
Per ``__cursors`` partition (per leadership of it, a :class:`~tidelog.broker.partitions.partition.Partition`):

- a write that finds nothing being written is written **at once, alone**, in its caller's task: a lone commit
  waits for nobody and pays for no extra task or turn of the loop;
- writes that arrive while an append is under way wait in arrival order; when it ends, one task writes *all* of
  them as one batch of records (at most :data:`MAX_BATCH_RECORDS`), and so on while more keep arriving. Each
  caller gets the offset of its own record in ``__cursors``.

This is group commit one level above the log's (:mod:`tidelog.storage.flush`, which shares an fsync among
concurrent appends): concurrent commits (a member committing all its partitions at once, many members, a client
that pipelines its commits) cost one append, not one each: the write path, the log's checks and write and the
followers' fetches run once per batch (``docs/performance.md`` has the numbers). A commit awaited one at a time
costs what it did.

**Fencing and takeovers** keep their rule (:mod:`tidelog.broker.groups.fencing`): a write's ``fence`` (a group
member's ownership check) runs just before the append that carries it is issued, when its batch is formed, and
the write counts as under way on its cursor from that same moment, with no await between
(:meth:`CursorWrites.under_way`): a member taking a partition over waits for it. A write refused by its fence
gets its error alone; the others of its batch are written. A failed append fails every write it carried.

**Order**: writes reach the log in the order they arrived, so commits of one cursor pipelined by one client are
stored in the order sent (the newest last, which is what compaction and the cache keep).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from tidelog.broker.partitions.write_path import Appended, WriteRefused
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch

MAX_BATCH_RECORDS = 500
"""The most cursor records one append carries (a record is at most about 1.5 KB: a batch stays far below the
log's batch size limit); more waiting writes go in the next append."""


class CursorLeader(Protocol):
    """What a write needs of the ``__cursors`` partition's leader (:class:`Partition` is one)."""

    def write(self, data: bytes, acks: Acks, timeout: float) -> Coroutine[Any, Any, Appended | WriteRefused]: ...


@dataclass(eq=False, slots=True)
class _Write:
    """One cursor record waiting for (or carried by) an append."""

    key: bytes
    value: bytes | None  # None: a tombstone
    timeout: float
    fence: Callable[[], None] | None
    done: asyncio.Future[int]  # its caller's answer: the record's offset, or an error
    landed: asyncio.Future[None] | None = None  # set once it passed its fence: done when its append is


@dataclass(eq=False, slots=True)
class _Queue:
    """The writes of one leadership of one ``__cursors`` partition."""

    leader: CursorLeader
    busy: bool = False  # an append is under way (a lone write, or a task writing a batch)
    waiting: deque[_Write] = field(default_factory=deque)


class CursorWrites:
    """Groups the cursor writes of each ``__cursors`` partition (see the module docstring)."""

    def __init__(self, on_failed: Callable[[int, CursorLeader], None]) -> None:
        """``on_failed(pid, leader)``: an append failed (it may be in the log all the same): the store forgets
        its cache of that partition, to read it again from the log."""
        self._on_failed = on_failed
        self._queues: dict[int, _Queue] = {}
        self._under_way: dict[bytes, set[asyncio.Future[None]]] = {}  # cursor key -> writes past their fence
        self._rounds: set[asyncio.Task[None]] = set()

    async def write(
        self,
        pid: int,
        leader: CursorLeader,
        key: bytes,
        value: bytes | None,
        timeout: float,
        fence: Callable[[], None] | None = None,
    ) -> int:
        """Store one cursor record in ``__cursors`` partition ``pid`` (acks ALL); its offset there once committed.
        Raises what ``fence`` raises (nothing stored), a refusal's error, or the append's failure."""
        queue = self._queues.get(pid)
        if queue is None or queue.leader is not leader:
            queue = self._queues[pid] = _Queue(leader)
        write = _Write(key, value, timeout, fence, asyncio.get_running_loop().create_future())
        if queue.busy:
            queue.waiting.append(write)
            return await write.done
        queue.busy = True
        try:
            await self._append(pid, leader, [write])
        finally:
            self._next(pid, queue)
        return write.done.result()

    def under_way(self, key: bytes) -> list[asyncio.Future[None]]:
        """The writes of cursor ``key`` that passed their fence and whose append has not ended (stored or
        failed), also those whose caller went away meanwhile."""
        return list(self._under_way.get(key, ()))

    async def close(self) -> None:
        """Wait for the batches being written (the broker is stopping: their partitions fail them when closing)."""
        await asyncio.gather(*self._rounds, return_exceptions=True)

    # ---- appends ----

    def _next(self, pid: int, queue: _Queue) -> None:
        """An append ended: write what waits, in one task, or go idle."""
        while queue.waiting and queue.waiting[0].done.done():
            queue.waiting.popleft()  # its caller went away before it was written
        if not queue.waiting:
            queue.busy = False
            return
        batch = [queue.waiting.popleft() for _ in range(min(len(queue.waiting), MAX_BATCH_RECORDS))]
        task = asyncio.get_running_loop().create_task(self._round(pid, queue, batch), name=f"cursor-writes-{pid}")
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _round(self, pid: int, queue: _Queue, batch: list[_Write]) -> None:
        try:
            await self._append(pid, queue.leader, batch)
        finally:
            self._next(pid, queue)

    async def _append(self, pid: int, leader: CursorLeader, writes: list[_Write]) -> None:
        """Fence, then append ``writes`` as one batch; settle each one (its record offset, or an error)."""
        loop = asyncio.get_running_loop()
        admitted: list[_Write] = []
        for write in writes:  # fences and registration together, no await until the append is issued
            if write.done.done():
                continue  # its caller went away
            if write.fence is not None:
                try:
                    write.fence()
                except Exception as exc:
                    write.done.set_exception(exc)
                    continue
            write.landed = loop.create_future()
            self._under_way.setdefault(write.key, set()).add(write.landed)
            admitted.append(write)
        if not admitted:
            return
        now = time.time_ns()
        data = build_batch([NewRecord(w.value, w.key, timestamp=now) for w in admitted], timestamp=now)
        outcome: Appended | BaseException
        try:
            written = await leader.write(data, Acks.ALL, max(w.timeout for w in admitted))
            outcome = written.error() if isinstance(written, WriteRefused) else written  # refused: nothing stored
        except asyncio.CancelledError:
            self._on_failed(pid, leader)
            for write in admitted:
                self._settle(write, None)
            raise
        except Exception as exc:
            self._on_failed(pid, leader)  # the records may be in the log all the same: read it again
            outcome = exc
        for i, write in enumerate(admitted):
            self._settle(write, outcome if isinstance(outcome, BaseException) else outcome.base_offset + i)

    def _settle(self, write: _Write, outcome: int | BaseException | None) -> None:
        """Answer ``write``'s caller (None: the append was cancelled) and take it off its cursor's writes."""
        if not write.done.done():
            if outcome is None:
                write.done.cancel()
            elif isinstance(outcome, BaseException):
                write.done.set_exception(outcome)
            else:
                write.done.set_result(outcome)
        landed = write.landed
        if landed is not None:
            landed.set_result(None)
            writes = self._under_way.get(write.key)
            if writes is not None:
                writes.discard(landed)
                if not writes:
                    del self._under_way[write.key]
