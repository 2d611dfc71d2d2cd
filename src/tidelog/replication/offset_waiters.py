"""Futures waiting for an offset to be passed, woken in offset order.

Used for the log end (replica fetches long-poll on it). A heap keyed by the offset each waiter needs, so an
advance wakes exactly the waiters it satisfies instead of every waiter on the partition.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class OffsetWaiters:
    """Waiters for ``position > offset``; :meth:`advance` moves the position."""

    def __init__(self, position: int) -> None:
        self._position = position
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def position(self) -> int:
        return self._position

    def advance(self, position: int) -> None:
        if position <= self._position:
            return
        self._position = position
        while self._waiters and self._waiters[0][0] < position:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)

    def reset(self, position: int) -> None:
        """Move the position back (the log was truncated); waiters stay."""
        self._position = position

    async def wait_beyond(self, offset: int, timeout: float | None) -> bool:
        """Wait until the position is above ``offset``; False on timeout."""
        if offset < self._position:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), fut))
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            if len(self._waiters) > 64:  # timed-out waiters on an idle partition: drop them now and then
                self._waiters = [w for w in self._waiters if not w[2].done()]
                heapq.heapify(self._waiters)
        return True

    def fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, fut in waiters:
            if not fut.done():
                fut.set_exception(exc)
