"""Futures waiting for an offset to be passed, woken in offset order.

Used for a follower's high watermark (consumers reading from an ISR replica long-poll on it). A heap keyed by
the offset each waiter needs, so an advance wakes exactly the waiters it satisfies instead of every waiter on
the partition. A wait is one future and, at most, one timer: no task, no ``asyncio.timeout`` (which cancels
the task and converts the cancellation back), no ``asyncio.wait`` (which adds a future and callbacks of its
own).
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
        """Wait until the position is above ``offset``; False when ``timeout`` passes first."""
        if offset < self._position:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), fut))
        timer = None if timeout is None else loop.call_later(timeout, _wake, fut)
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            if not fut.done():
                fut.cancel()
            if len(self._waiters) > 64:  # timed-out waiters on an idle partition: drop them now and then
                self._waiters = [w for w in self._waiters if not w[2].done()]
                heapq.heapify(self._waiters)
        return offset < self._position


def _wake(fut: asyncio.Future[None]) -> None:
    """A deadline passed: the waiter returns and looks at the position itself."""
    if not fut.done():
        fut.set_result(None)
