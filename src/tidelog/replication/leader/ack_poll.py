"""A leader polls its event loop, instead of sleeping in it, for a moment after a lone acks-ALL write.

Once a leader has written and fsynced an acks-ALL write, what is left is the followers' acknowledgements, a few hundred
microseconds away (their own fsync), and then, from a producer that waits for each write, the next write. If the loop
sleeps meanwhile, every one of those messages has to wake it: the sender pays for waking an idle CPU and the leader pays
again for coming out of idle. On a virtual machine that is dear (several times a round trip on one vCPU, or to a
receiver that polls). A loop that keeps polling (``epoll_wait`` with a zero timeout) sees each message as soon as it is
on its socket, and nobody is woken. This is what the kernel's guest halt-polling does for a whole virtual CPU, where it
is enabled; Seastar-based brokers poll all the time.

Here the leader polls only:

- after a write that waits *alone* for its commit, for ``replica_ack_poll_us``. When several wait, producers
  are pipelining, the loop is busy anyway, and a leader spinning in the gaps would take CPU from followers that
  share its machine (polling after every write cost produce throughput);
- until it hands the next write to its followers (:meth:`LoopPoller.stop`): they need the CPUs then, for their
  own write and fsync, and the leader polls again once its own fsync of that write is done.

It lowers the latency of sequential acks-ALL writes at the cost of leader CPU per such write (the numbers are
in docs/performance.md). Set it to 0 where a leader shares its CPUs with other busy work.

How: a callback re-schedules itself with ``call_soon`` until the deadline; a loop with a ready callback polls its
selector without blocking (asyncio and uvloop alike), so each turn of the loop is one non-blocking poll.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Final

_POLLERS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPoller]] = weakref.WeakKeyDictionary()


class LoopPoller:
    """Keeps one event loop polling until a deadline that each :meth:`poll_for` may push out."""

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._loop = loop
        self._clock = clock
        self._until_ns = 0
        self._polling = False
        self.turns = 0  # loop turns spent polling (statistics, tests)

    @property
    def polling(self) -> bool:
        return self._polling

    @property
    def deadline_ns(self) -> int:
        """When the polling ends (on the poller's clock); in the past when it is not polling."""
        return self._until_ns

    def poll_for(self, budget_ns: int) -> None:
        """Poll until at least ``budget_ns`` from now."""
        self._until_ns = max(self._until_ns, self._clock() + budget_ns)
        if not self._polling:
            self._polling = True
            self._loop.call_soon(self._turn)

    def stop(self) -> None:
        """End the polling at the next turn of the loop, whatever the deadline was."""
        self._until_ns = 0

    def _turn(self) -> None:
        if self._clock() < self._until_ns:
            self.turns += 1
            self._loop.call_soon(self._turn)
        else:
            self._polling = False


def poller_for(loop: asyncio.AbstractEventLoop) -> LoopPoller:
    """The loop's poller (one per loop: every partition this broker leads shares it)."""
    poller = _POLLERS.get(loop)
    if poller is None:
        poller = _POLLERS[loop] = LoopPoller(loop)
    return poller
