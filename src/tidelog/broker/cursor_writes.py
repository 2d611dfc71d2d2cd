"""Cursor writes of one ``__cursors`` partition, coalesced: commits that arrive in the same turn of the event loop
share one append (one batch of records, one fsync round, one acknowledgement round from the ISR).

:class:`~tidelog.broker.cursors.CursorStore` hands every cursor record it stores to :meth:`CursorWrites.write`
(and the tombstones of a group's deletion, all in one append, to :meth:`CursorWrites.write_all`).
Per ``__cursors`` partition (per leadership of it, a :class:`~tidelog.broker.partitions.partition.Partition`):

- the first write of a turn of the loop is appended **at once, alone**, in its caller's task: a commit awaited
  one at a time waits for nobody and pays for no extra task or turn of the loop;
- a write arriving later in the same turn (the wire server starts the handlers of every request one read
  delivered in one turn: a member committing all its partitions at once, a client pipelining its commits,
  several members) opens a batch that every further write of the turn joins; the batch is appended at the start
  of the next turn, by a task of its own, as one batch of records (at most :data:`MAX_BATCH_RECORDS`). Each
  caller gets the offset of its own record in ``__cursors``.

Appends are never held back waiting for one another: one arriving while another is being fsynced or replicated
goes to the log at once, and the log's group commit (:mod:`tidelog.storage.flush`) shares the fsync between
them. Grouping appends one level above that log saves the rest, which is most of a commit's cost on the broker:
the write path, the log's checks and write, and the followers' fetches run once per batch instead of once per
commit (``docs/performance.md`` has the numbers). An earlier version that queued every write arriving while an
append was under way, and appended them when it ended, made concurrent commits slower: it serialized what the
log's group commit overlaps.

**Fencing and takeovers** keep their rule (:mod:`tidelog.broker.groups.fencing`): a write's ``fence`` (a group
member's ownership check) runs just before the append that carries it is issued, and the write counts as under
way on its cursor from that same moment, with no await between (:meth:`CursorWrites.under_way`): a member taking
a partition over waits for it. A write refused by its fence gets its error alone; the others of its batch are
written. A failed append fails every write it carried.

**Order**: writes reach the log in the order they arrived (a batch in its writes' order, the first write of the
turn before it), so commits of one cursor pipelined by one client are stored in the order sent.
"""

from __future__ import annotations

import asyncio
import time
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
class _Turn:
    """What one ``__cursors`` partition has seen of the current turn of the loop."""

    leader: CursorLeader
    issued: bool = False  # a write was appended at once in this turn: later ones batch
    batches: list[list[_Write]] = field(default_factory=list)  # this turn's later writes, appended next turn


class CursorWrites:
    """Coalesces the cursor writes of each ``__cursors`` partition (see the module docstring)."""

    def __init__(self, on_failed: Callable[[int, CursorLeader], None]) -> None:
        """``on_failed(pid, leader)``: an append failed (it may be in the log all the same): the store forgets
        its cache of that partition, to read it again from the log."""
        self._on_failed = on_failed
        self._turns: dict[int, _Turn] = {}  # __cursors partition -> this turn's state (absent: nothing this turn)
        self._under_way: dict[bytes, set[asyncio.Future[None]]] = {}  # cursor key -> writes past their fence
        self._batches: set[asyncio.Task[None]] = set()
        self._unplaced: dict[int, int] = {}  # __cursors partition -> its batches not yet handed to the log

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
        write = _Write(key, value, timeout, fence, asyncio.get_running_loop().create_future())
        await self._submit(pid, leader, [write])
        return await write.done

    async def write_all(self, pid: int, leader: CursorLeader, keys: list[bytes], timeout: float) -> list[int]:
        """Store a tombstone (a cursor deleted) for each of ``keys`` (at most :data:`MAX_BATCH_RECORDS`) in one
        append, all or none; their offsets in ``__cursors`` partition ``pid``."""
        if len(keys) > MAX_BATCH_RECORDS:
            raise ValueError(f"{len(keys)} cursor records: one append carries at most {MAX_BATCH_RECORDS}")
        loop = asyncio.get_running_loop()
        writes = [_Write(key, None, timeout, None, loop.create_future()) for key in keys]
        await self._submit(pid, leader, writes)
        return [await write.done for write in writes]

    async def _submit(self, pid: int, leader: CursorLeader, writes: list[_Write]) -> None:
        """Append ``writes`` (one append for all of them) at once when they are the first of this turn, else
        put them in the turn's batch; return once they are settled or waiting there."""
        loop = asyncio.get_running_loop()
        turn = self._turns.get(pid)
        if turn is None or turn.leader is not leader:
            turn = self._turns[pid] = _Turn(leader)
            loop.call_soon(self._end_turn, pid, turn)  # runs after every handler already started this turn
        if turn.issued or self._unplaced.get(pid):  # joins the turn's batch (never overtakes an earlier one)
            batches = turn.batches
            if batches and len(batches[-1]) + len(writes) <= MAX_BATCH_RECORDS:
                batches[-1].extend(writes)
            else:
                batches.append(list(writes))
            return
        turn.issued = True
        await self._append(pid, leader, writes)

    def under_way(self, key: bytes) -> list[asyncio.Future[None]]:
        """The writes of cursor ``key`` that passed their fence and whose append has not ended (stored or
        failed), also those whose caller went away meanwhile."""
        return list(self._under_way.get(key, ()))

    async def close(self) -> None:
        """Wait for the batches being written (the broker is stopping: their partitions fail them when closing)."""
        await asyncio.gather(*self._batches, return_exceptions=True)

    # ---- appends ----

    def _end_turn(self, pid: int, turn: _Turn) -> None:
        """The turn is over: append its batches, in order, each in a task of its own (no caller's cancellation
        stops one)."""
        if self._turns.get(pid) is turn:
            del self._turns[pid]
        loop = asyncio.get_running_loop()
        for batch in turn.batches:
            self._unplaced[pid] = self._unplaced.get(pid, 0) + 1
            task = loop.create_task(self._append_batch(pid, turn.leader, batch), name=f"cursor-writes-{pid}")
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _append_batch(self, pid: int, leader: CursorLeader, batch: list[_Write]) -> None:
        """A batch's task. Tasks start in the order they were made, and each hands its batch to the log (where
        the log's lock orders appends) before it first waits: from here on, a write may go at once again."""
        left = self._unplaced[pid] - 1
        if left:
            self._unplaced[pid] = left
        else:
            del self._unplaced[pid]
        await self._append(pid, leader, batch)

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
