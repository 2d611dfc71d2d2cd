"""The clock every timer and deadline in tidelog goes through.

Code that takes a :class:`Clock` asks it instead of calling ``time`` or ``asyncio.sleep()`` directly. Production
passes :class:`SystemClock`; tests pass :class:`ManualClock` and move time forward explicitly with
:meth:`ManualClock.advance`, so a test of "roll the segment after seven days" or "flush every 200 ms" runs
instantly and the same way every time (trio's ``MockClock`` is the model).

Not all of tidelog does yet. These take an injected clock: the storage log and its flusher, the metadata
controller, its election and lease sessions, and in the broker (:mod:`tidelog.broker`) the partition manager and
everything it makes with it — the partition runtime (follower lag, ISR shrink, producer snapshots, record
timestamps on the write path), the fail-to-safety and step-down retries, the follower's fetcher, NATS ingest and
its reader — the log cleaner, transactional appends (their spool's timestamp check), stream administration and
the controller link's retries. Production passes none of them a clock, so each makes its own ``SystemClock``.

What still reads ``time`` or sleeps with ``asyncio.sleep()`` itself: the broker record written at start-up and
the stream-creation marker, the request handlers' timestamps and the wire server's shutdown grace, the nats-py
fallback's reconnect wait, the client and Spark retry loops, and the leader's ack poller
(:mod:`tidelog.replication.leader.ack_poll`, which spins the loop for microseconds of real time by design).
Deadlines of single requests are event-loop timers (``asyncio.timeout``, ``call_later``: long-polls, the
transactional append's rate window, the follower's high-watermark waits), which a :class:`Clock` does not
drive.

Two readings are offered because they answer different questions: :meth:`Clock.now_ns` is wall-clock time in
nanoseconds since the Unix epoch (record timestamps, retention by age), :meth:`Clock.monotonic_ns` never goes
backwards (intervals, deadlines).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of time and of sleeping."""

    def now_ns(self) -> int:
        """Wall-clock time, nanoseconds since the Unix epoch."""
        ...

    def monotonic_ns(self) -> int:
        """A reading that never decreases, in nanoseconds; only differences are meaningful."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ManualClock:
    """A clock that only moves when a test says so.

    Both readings advance together by :meth:`advance`. Sleepers are woken, in deadline order, when time
    reaches their deadline; a sleep of zero or less returns after one turn of the event loop.
    """

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self._now = start_ns
        self._monotonic = 0
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def monotonic_ns(self) -> int:
        return self._monotonic

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        deadline = self._monotonic + int(seconds * 1_000_000_000)
        heapq.heappush(self._sleepers, (deadline, next(self._seq), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (cancelled ones excluded): lets a test wait until a timer is armed."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def advance(self, seconds: float = 0.0, *, ns: int = 0) -> None:
        """Move both readings forward and wake every sleeper whose deadline has come."""
        step = int(seconds * 1_000_000_000) + ns
        if step < 0:
            raise ValueError("a clock cannot go backwards")
        self._now += step
        self._monotonic += step
        while self._sleepers and self._sleepers[0][0] <= self._monotonic:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def set_now_ns(self, now_ns: int) -> None:
        """Set the wall-clock reading (it may jump backwards, as a real wall clock can); monotonic is untouched."""
        self._now = now_ns
