"""Checking a produced batch without blocking the broker, and without reordering a connection's batches.

The wire PRODUCE handler checks a batch's records (:func:`~tidelog.storage.batch_check.check_produced`) before
it appends. On the event loop that takes no await, so a connection's batches reach their partition in request
order (the session starts handlers in frame order, each running up to its first await). A producer's records
are laid out alike and are checked in runs, cheaply; records laid out irregularly are checked one by one, which
for a hostile 4 MiB batch of tiny records would hold the loop, and every other client, for about a second (see
docs/performance.md). So a batch with more than :data:`INLINE_ALONE` such records is checked again in a worker thread
(the loop keeps its share of the GIL meanwhile). While it is, later produces of the same connection to the same
partition wait for it — each one waiting takes a *turn* behind it — so they still append after it; produces to
other partitions and other connections do not wait.
"""

from __future__ import annotations

import asyncio

from tidelog.protocol.records import IrregularRecords
from tidelog.storage.batch_check import ProduceLimits, check_produced

INLINE_ALONE = 2_000
"""Records of a produce that may be checked one by one on the event loop; beyond, a worker thread."""

Key = tuple[str, int]  # stream, partition


class ProduceTurns:
    """The produces of one connection that are being checked off the loop, or waiting for one that is."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[Key, asyncio.Future[None]] = {}  # per partition: the latest produce still waiting

    async def check(
        self, key: Key, payload: memoryview, limits: ProduceLimits, now_ns: int
    ) -> asyncio.Future[None] | None:
        """Check ``payload`` (raising what :func:`check_produced` raises) and wait for the produces ahead of it.

        Returns None when it waited for nothing (the common case: no await at all); otherwise its turn, which
        the caller passes to :meth:`release` right before it appends, with no await in between, and on failure.
        """
        ahead = self._last.get(key)
        waiting = ahead is not None and not ahead.done()
        try:
            check_produced(payload, limits, now_ns, alone_budget=INLINE_ALONE)
            slow = False
        except IrregularRecords:
            slow = True
        if not slow and not waiting:
            return None
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[key] = turn
        try:
            if slow:
                await asyncio.to_thread(check_produced, payload, limits, now_ns)
            if ahead is not None:
                await asyncio.shield(ahead)  # a cancelled waiter must not cancel the turn others wait on
        except BaseException:
            self._release_after(key, turn, ahead)
            raise
        return turn

    def _release_after(self, key: Key, turn: asyncio.Future[None], ahead: asyncio.Future[None] | None) -> None:
        """Release a turn that will not append (its check failed, or it was cancelled) once the turn ahead of it
        is released: the produces behind it must still land after those ahead of it."""
        if ahead is None or ahead.done():
            self.release(key, turn)
        else:
            ahead.add_done_callback(lambda _: self.release(key, turn))

    def release(self, key: Key, turn: asyncio.Future[None] | None) -> None:
        """Let the produces behind ``turn`` go (their wake-ups run after the caller's next await)."""
        if turn is None:
            return
        if not turn.done():
            turn.set_result(None)
        if self._last.get(key) is turn:
            del self._last[key]
