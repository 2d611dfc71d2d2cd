"""How much request work the wire server starts in one turn of the event loop, over all its connections.

Each connection bounds what it has *in flight* (``max_in_flight`` requests, ``max_in_flight_bytes`` of request
bytes: :mod:`tidelog.api.wire.session`). That bounds memory, not time: a socket read of thousands of tiny
pipelined frames, on a few connections at once, would still start thousands of handlers in one turn of the loop,
and everything else the broker does on that loop (other clients, replication, the etcd lease keep-alive) waits
behind them. A :class:`TurnBudget` caps the requests (and request bytes) admitted per turn by all the sessions
of one server together; a session that finds it spent admits the rest of what it read on a later turn
(``loop.call_soon``), after the loop has polled its sockets and run what was waiting. A turn always admits at
least one request, so a frame larger than the byte budget still goes through.

There is deliberately no broker-wide cap on requests *in flight*: a replica fetch or a long-polling consumer
fetch holds its slot until data arrives, and an acks-ALL produce holds its slot until a follower's replica fetch
is admitted, so a cap shared by clients and followers could leave every slot waiting on a request it refuses.
What the broker holds is bounded per connection; what it starts per turn is bounded here.
"""

from __future__ import annotations

import asyncio

ADMIT_PER_TURN = 128
"""Requests admitted per turn of the loop by all connections of one server together."""

ADMIT_BYTES_PER_TURN = 8 * 1024 * 1024
"""Request bytes (headers and payloads) admitted per turn of the loop by all connections together."""


class TurnBudget:
    """The admissions left in the current turn of the loop; refilled at the start of the next one."""

    __slots__ = ("_bytes", "_left", "_left_bytes", "_refill_due", "_requests")

    def __init__(self, requests: int = ADMIT_PER_TURN, nbytes: int = ADMIT_BYTES_PER_TURN) -> None:
        if requests < 1 or nbytes < 1:
            raise ValueError(f"a turn must admit at least one request and byte, not {requests} and {nbytes}")
        self._requests = requests
        self._bytes = nbytes
        self._left = requests
        self._left_bytes = nbytes
        self._refill_due = False

    def take(self, nbytes: int) -> bool:
        """Spend one request of ``nbytes`` from this turn's budget; False when the turn has none left (the
        first request of a turn is always admitted, whatever its size)."""
        if not self._refill_due:
            # The first admission of this turn: refill before anything scheduled from here on runs, so that a
            # session deferring to the next turn (call_soon, after this) finds a full budget there.
            self._refill_due = True
            asyncio.get_running_loop().call_soon(self._refill)
        elif self._left <= 0 or self._left_bytes < nbytes:
            return False
        self._left -= 1
        self._left_bytes -= nbytes
        return True

    def _refill(self) -> None:
        self._left = self._requests
        self._left_bytes = self._bytes
        self._refill_due = False
