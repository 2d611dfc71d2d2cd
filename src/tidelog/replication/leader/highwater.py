"""Leader-side high watermark: what is committed, and who is waiting for it.

The high watermark (HW) is the offset *after* the last committed record: every offset below it is stored on
every in-sync replica (and, with flush ``always``, fsynced there), so readers see only offsets below the HW.
HW = the lowest log end offset across the ISR; with one replica it is simply the leader's durable log end.

A follower the leader has asked to add to the ISR counts in the HW from the moment it is asked, before the
metadata names it (Kafka's "maximal ISR", KIP-497): the controller may act on the change, electing that follower,
before this leader hears of it, so the HW must not pass what the follower holds in the meantime. It stops
counting when the metadata names it (it is a member), when an ISR change without it is written, or when the
controller refuses the join (nothing was written).

While the ISR is smaller than ``min_isr`` the HW does not move at all (Rama's min-ISR stall): a write that was
appended while the ISR was full and is still waiting for its acks must not become committed — acknowledged,
and visible — just because the ISR shrank to the leader alone. It waits (and times out) instead, and becomes
visible once enough replicas hold it again.

Producers with acks ``ALL`` wait for the HW to pass their last offset; consumers long-poll for it to move.
Waiters sit in a heap keyed by the offset they need, so an advance wakes exactly those it satisfies rather than
every waiter on the partition. A waiter may also leave a callback that runs inside the advance itself, before
it resumes: a produce writes its reply from there, from inside the follower acknowledgement that commits it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger(__name__)


class HighWatermark:
    """Tracks the ISR's log end offsets and the HW they imply."""

    def __init__(self, leader_id: str, isr: Iterable[str], initial_hw: int, *, min_isr: int = 1) -> None:
        self._leader_id = leader_id
        self._min_isr = min_isr
        self._members = set(isr) | {leader_id}
        self._joining: set[str] = set()
        self._ends: dict[str, int] = dict.fromkeys(self._members, initial_hw)
        self._hw = initial_hw
        self._waiters: list[tuple[int, int, asyncio.Future[None], Callable[[], None] | None]] = []
        self._seq = itertools.count()

    @property
    def value(self) -> int:
        return self._hw

    def set_isr(self, isr: Iterable[str], fetched: Mapping[str, int] | None = None) -> None:
        """Replace the ISR. Members keep their known log end; a new one starts where it last fetched
        (``fetched``), never above the HW: it was proposed at or past the HW, but the HW may have moved on while
        the change reached the metadata, and crediting it with the HW then would commit (and let it lead with)
        records it lacks. Without ``fetched``, new members start at the HW."""
        self._members = set(isr) | {self._leader_id}
        self._joining -= self._members
        known = {} if fetched is None else fetched
        counted = self._members | self._joining
        self._ends = {r: self._ends.get(r, min(self._hw, known.get(r, self._hw))) for r in counted}
        self._recompute()

    @property
    def joining(self) -> frozenset[str]:
        """Followers asked into the ISR that the metadata does not name yet (counted in the HW)."""
        return frozenset(self._joining)

    def count_joining(self, replica: str, log_end: int) -> None:
        """Count ``replica`` in the HW from now: the leader asks for it to join the ISR, holding everything
        below ``log_end`` (at or past the HW: Kafka's join rule). See the module docstring."""
        if replica in self._members:
            return
        self._joining.add(replica)
        self._ends[replica] = max(self._ends.get(replica, log_end), log_end)

    def stop_counting(self, replicas: Iterable[str]) -> None:
        """Stop counting joining ``replicas``: an ISR change without them was written, their join was refused
        (nothing written), or they are no replicas any more. The HW may move at once."""
        for replica in set(replicas) & self._joining:
            self._joining.discard(replica)
            del self._ends[replica]
        self._recompute()

    def set_min_isr(self, min_isr: int) -> None:
        """Take a new ``min_isr`` (a stream's setting changed at run time); a lower one may commit at once."""
        self._min_isr = min_isr
        self._recompute()

    def replica_caught_up_to(self, replica: str, log_end: int) -> None:
        """Record that ``replica`` has everything below ``log_end`` (the leader itself included)."""
        if replica in self._ends and log_end > self._ends[replica]:
            self._ends[replica] = log_end
            self._recompute()

    def _recompute(self) -> None:
        if len(self._members) < self._min_isr:
            return  # below min_isr nothing new commits (module docstring); a joining follower is no member yet
        hw = min(self._ends.values())
        if hw <= self._hw:
            return  # the HW never goes back
        self._hw = hw
        while self._waiters and self._waiters[0][0] < hw:
            _, _, fut, then = heapq.heappop(self._waiters)
            if not fut.done():
                if then is not None:
                    try:
                        then()
                    except Exception:  # never into the acknowledgement that moved the HW
                        log.exception("a high-watermark callback failed")
                fut.set_result(None)

    async def wait_committed(self, offset: int, then: Callable[[], None] | None = None) -> None:
        """Return once ``offset`` is below the HW (committed). ``then`` runs from inside the advance that commits
        it, before this returns; not when ``offset`` is committed already, nor when the wait ends otherwise."""
        if offset < self._hw:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), fut, then))
        await fut

    async def wait_beyond(self, offset: int, timeout: float | None) -> bool:
        """Wait until the HW is above ``offset`` (a record at ``offset`` is readable); False on timeout."""
        if offset < self._hw:
            return True
        try:
            async with asyncio.timeout(timeout):  # not wait_for: that wraps the wait in a task of its own
                await self.wait_committed(offset)
        except TimeoutError:
            return False
        return True

    def fail_waiters(self, exc: BaseException) -> None:
        """Wake every waiter with ``exc`` (the partition is closing or lost leadership)."""
        waiters, self._waiters = self._waiters, []
        for _, _, fut, _then in waiters:
            if not fut.done():
                fut.set_exception(exc)
