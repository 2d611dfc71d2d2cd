"""How much request work the wire server starts in one turn of the event loop, over all its connections.

Each connection bounds what it has *in flight* (``max_in_flight`` requests, ``max_in_flight_bytes`` of request
bytes: :mod:`tidelog.api.wire.session`). That bounds memory, not time: a socket read of thousands of tiny
pipelined frames, on a few connections at once, would still start thousands of handlers in one turn of the loop,
and everything else the broker does on that loop (other clients, replication, the etcd lease keep-alive) waits
behind them. A :class:`TurnBudget` caps the requests (and request bytes) admitted per turn by all the sessions
of one server together. A session that finds the turn's budget spent, or other sessions already waiting for the
next turn, joins the queue (:meth:`TurnBudget.wait_turn`); at the start of the next turn the budget is shared
out among the queued sessions in arrival order, each getting an equal share (at least one request), and a
session with requests left joins the back of the queue again. So a connection that sends one request while
four others flood the broker waits one turn, not until the floods are through; and a turn always admits at
least one request, so a frame larger than the byte budget still goes through.

There is deliberately no broker-wide cap on requests *in flight*: a replica fetch or a long-polling consumer
fetch holds its slot until data arrives, and an acks-ALL produce holds its slot until a follower's replica fetch
is admitted, so a cap shared by clients and followers could leave every slot waiting on a request it refuses.
What the broker holds is bounded per connection; what it starts per turn is bounded here.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

ADMIT_PER_TURN = 128
"""Requests admitted per turn of the loop by all connections of one server together."""

ADMIT_BYTES_PER_TURN = 8 * 1024 * 1024
"""Request bytes (headers and payloads) admitted per turn of the loop by all connections together."""

Admit = Callable[[int], None]
"""A waiting session's way in: admit up to this many of its waiting requests now (:meth:`TurnBudget.spend`
each), and call :meth:`TurnBudget.wait_turn` again if some are left."""


class TurnBudget:
    """The admissions left in the current turn of the loop, and the sessions waiting for the next turn."""

    __slots__ = ("_bytes", "_left", "_left_bytes", "_queue", "_refill_due", "_requests", "_turn_due")

    def __init__(self, requests: int = ADMIT_PER_TURN, nbytes: int = ADMIT_BYTES_PER_TURN) -> None:
        if requests < 1 or nbytes < 1:
            raise ValueError(f"a turn must admit at least one request and byte, not {requests} and {nbytes}")
        self._requests = requests
        self._bytes = nbytes
        self._left = requests
        self._left_bytes = nbytes
        self._refill_due = False  # a refill is scheduled for the next turn
        self._queue: deque[Admit] = deque()  # sessions waiting for the next turn, in arrival order
        self._turn_due = False  # _next_turn is scheduled

    def take(self, nbytes: int) -> bool:
        """Spend one request of ``nbytes`` from this turn's budget; False when the turn has none left or other
        sessions are already waiting (then :meth:`wait_turn`). The first request of a turn is always admitted,
        whatever its size."""
        if self._queue:
            return False  # no overtaking: they were first
        if not self._refill_due:
            # The first admission of this turn: refill before anything scheduled from here on runs.
            self._refill_due = True
            asyncio.get_running_loop().call_soon(self._refill)
        elif self._left <= 0 or self._left_bytes < nbytes:
            return False
        self.spend(nbytes)
        return True

    @property
    def bytes_left(self) -> int:
        """Request bytes this turn may still admit (a share's first request goes through regardless)."""
        return self._left_bytes

    def spend(self, nbytes: int) -> None:
        """Count a request admitted through :meth:`wait_turn`'s share."""
        self._left -= 1
        self._left_bytes -= nbytes

    def wait_turn(self, admit: Admit) -> None:
        """Call ``admit(share)`` at the start of the next turn, after the sessions already waiting."""
        self._queue.append(admit)
        if not self._turn_due:
            self._turn_due = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _refill(self) -> None:
        self._left = self._requests
        self._left_bytes = self._bytes
        self._refill_due = False

    def _next_turn(self) -> None:
        """Share a fresh budget among the waiting sessions; those with requests left queue up again."""
        self._turn_due = False
        self._left = self._requests
        self._left_bytes = self._bytes
        waiting, self._queue = self._queue, deque()
        share = max(1, self._requests // len(waiting))
        for admit in waiting:
            admit(share)
