"""Leader-side view of the followers: how far each has copied, and whether it keeps up.

A follower's fetch names the offset it wants next, which is its log end: everything below is on its disk (with
flush ``always``, fsynced). That one number is the follower's acknowledgement, and it feeds the high watermark.

Whether a follower *keeps up* is Kafka's "last caught-up time" (KIP-16 style, not a message-count lag, which
misfires on bursts): a fetch at offset ``o`` at time ``t`` proves the follower had everything the leader had
at ``t`` if ``o`` reaches the leader's log end then, and everything the leader had at the previous fetch if ``o``
reaches the log end the leader had at that previous fetch. A follower whose caught-up time is older than
``replica_lag_time_max`` is lagging and must leave the ISR (through the controller) — and, because the high
watermark is the ISR's minimum log end, it cannot move past what the lagging follower lacks until it is out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower."""

    log_end: int = -1  # the offset of its last fetch; -1: not heard from in this leadership
    caught_up_ns: int = 0  # the latest time it was known to have everything the leader had
    previous_fetch_ns: int = 0
    previous_leader_end: int = -1  # the leader's log end when that previous fetch arrived


class FollowerProgress:
    """Progress of every follower of one partition this broker leads."""

    def __init__(self, leader_id: str, replicas: Iterable[str], now_ns: int) -> None:
        # A fresh leader counts every follower as caught up at its start: it has not had a chance to fetch yet,
        # and shrinking the ISR in the first lag period would punish the leadership change, not the follower.
        self._leader_id = leader_id
        self._states = {r: FollowerState(caught_up_ns=now_ns) for r in replicas if r != leader_id}

    def set_replicas(self, replicas: Iterable[str], now_ns: int) -> None:
        self._states = {
            r: self._states.get(r) or FollowerState(caught_up_ns=now_ns) for r in replicas if r != self._leader_id
        }

    def fetched(self, replica: str, offset: int, leader_end: int, now_ns: int) -> bool:
        """Note a fetch from ``replica`` at ``offset``; False when it is not a follower of this partition."""
        state = self._states.get(replica)
        if state is None:
            return False
        if offset >= leader_end:
            state.caught_up_ns = now_ns
        elif offset >= state.previous_leader_end >= 0:
            state.caught_up_ns = max(state.caught_up_ns, state.previous_fetch_ns)
        state.log_end = offset
        state.previous_fetch_ns = now_ns
        state.previous_leader_end = leader_end
        return True

    def state(self, replica: str) -> FollowerState | None:
        return self._states.get(replica)

    def lagging(self, isr: Iterable[str], now_ns: int, max_lag_ns: int) -> list[str]:
        """ISR followers whose last caught-up time is older than ``max_lag_ns``."""
        return [r for r in isr if (s := self._states.get(r)) is not None and now_ns - s.caught_up_ns > max_lag_ns]

    def ready_to_join(self, isr: Iterable[str], high_watermark: int, epoch_start: int) -> list[str]:
        """Followers outside the ISR that hold everything committed and everything of this leader's epoch
        before it (Kafka's rule: at or past the HW, and past the start of the current leader epoch)."""
        members = set(isr)
        return [
            r
            for r, s in self._states.items()
            if r not in members and s.log_end >= high_watermark and s.log_end >= epoch_start
        ]
