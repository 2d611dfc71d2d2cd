"""The states of a :class:`~tidelog.replication.follower.fetcher.ReplicaFetcher`, the status it reports, and the
failure that parks it."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FetcherState(enum.Enum):
    CONNECTING = "connecting"
    TRUNCATING = "truncating"
    FETCHING = "fetching"
    BACKING_OFF = "backing-off"
    COPYING = "copying"  # far-horizon catch-up: copying the leader's sealed segment files
    PARKED = "parked"  # behind the leader's log start and it cannot serve segment files, or the log failed
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class FetcherStatus:
    """A snapshot for ``cluster status``: where this replica stands against its leader."""

    state: FetcherState
    leader_id: str
    leader_epoch: int
    log_end: int
    leader_log_end: int  # as of the last response; -1 before the first
    high_watermark: int
    caught_up: bool
    last_error: str | None
    segments_copied: int = 0  # by far-horizon catch-up, since the fetcher started
    copy_phases: int = 0


class CatchUpNeededError(Exception):
    """The leader no longer holds the offsets this replica needs next, and cannot serve its segment files
    (a broker from before far-horizon catch-up): neither fetching nor copying can catch this replica up."""

    def __init__(self, log_end: int, leader_start: int) -> None:
        super().__init__(
            f"far-horizon catch-up needed: this replica ends at {log_end}, the leader's log starts at {leader_start}"
        )
        self.log_end = log_end
        self.leader_start = leader_start
