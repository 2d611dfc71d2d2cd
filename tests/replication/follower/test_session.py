"""Fetch sessions: three partitions followed from one leader broker over one connection, and one task.

A real leader (three partitions on one wire server) and three fetchers of one broker sharing a
:class:`FetchSessions`; every wait is on an event, bounded by ``BOUND``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import BOUND
from tests.replication.helpers import until_log_end
from tidelog.protocol.messages import Acks
from tidelog.protocol.session_messages import SessionFetchEntry, SessionFetchPartition
from tidelog.replication.follower.fetcher import FetcherState, ReplicaFetcher
from tidelog.replication.follower.session import FetchSession, FetchSessions, PartitionKey
from tidelog.storage.config import FlushPolicy
from tidelog.storage.log import Log
from tidelog.testing.replica_leader import Leader, batch, open_log, start_leader

EPOCH = 2


class Followers:
    """Broker ``b`` following ``s/0..2`` of one leader through one :class:`FetchSessions`."""

    def __init__(self, tmp_path: Path, leader: Leader) -> None:
        self.leader = leader
        self.sessions = FetchSessions("b", max_wait_ms=200)
        self.logs = [open_log(tmp_path / f"follower{i}", FlushPolicy.ALWAYS) for i in range(3)]
        self.fetchers: list[ReplicaFetcher] = []

    async def start(self, i: int, *, epoch: int = EPOCH) -> ReplicaFetcher:
        fetcher = ReplicaFetcher(
            self.logs[i], "s", i, "b", "a", epoch, self.leader.address, initial_hw=0, sessions=self.sessions
        )
        self.fetchers.append(fetcher)
        await fetcher.start()
        return fetcher

    async def close(self) -> None:
        for fetcher in self.fetchers:
            await fetcher.stop()
        await self.sessions.close()
        for log_ in self.logs:
            await log_.close()


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Leader]:
    started = await start_leader(open_log(tmp_path / "leader0"), epoch=EPOCH)
    for i in (1, 2):
        started.lead_also(open_log(tmp_path / f"leader{i}"))
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
async def followers(tmp_path: Path, leader: Leader) -> AsyncIterator[Followers]:
    f = Followers(tmp_path, leader)
    try:
        yield f
    finally:
        await f.close()


def leader_log(leader: Leader, i: int) -> Log:
    return leader.others[i - 1].log if i else leader.log


async def test_three_partitions_copy_through_one_session_and_commit_acks_all_writes(
    leader: Leader, followers: Followers
) -> None:
    fetchers = [await followers.start(i) for i in range(3)]
    for fetcher in fetchers:
        await asyncio.wait_for(fetcher.wait_for_state(FetcherState.FETCHING), BOUND)
    partitions = [leader.partition, *leader.others]
    for round_ in range(3):
        # acks ALL: each completes only once b's next session entry acknowledges it (HW moved past it)
        await asyncio.gather(*(p.append(batch(b"v%d" % round_), Acks.ALL, BOUND) for p in partitions))
    for i in range(3):
        await until_log_end(followers.logs[i], 3)
        assert followers.logs[i].read(0, 1 << 20) == leader_log(leader, i).read(0, 1 << 20)
    (session,) = followers.sessions.sessions
    assert session.members == 3 and session.connected
    # Every fetcher closed its own connection once it joined: one connection to the leader in all.
    assert all(not f._link.connected for f in fetchers)
    assert all(f.caught_up for f in fetchers)


async def test_a_refused_partition_backs_off_alone_while_the_others_are_copied(
    leader: Leader, followers: Followers
) -> None:
    good = [await followers.start(0), await followers.start(1)]
    fenced = await followers.start(2, epoch=EPOCH - 1)  # follows a leadership that is over
    await asyncio.wait_for(fenced.wait_for_state(FetcherState.BACKING_OFF), BOUND)
    for i, p in enumerate([leader.partition, leader.others[0]]):
        await p.append(batch(b"x"), Acks.ALL, BOUND)
        await until_log_end(followers.logs[i], 1)
    assert all(f.state is FetcherState.FETCHING for f in good)
    assert followers.logs[2].end_offset == 0 and "leader epoch" in (fenced.status().last_error or "")


async def test_a_stopped_fetcher_leaves_the_session_and_the_rest_go_on(leader: Leader, followers: Followers) -> None:
    fetchers = [await followers.start(i) for i in range(2)]
    for fetcher in fetchers:
        await asyncio.wait_for(fetcher.wait_for_state(FetcherState.FETCHING), BOUND)
    await fetchers[0].stop()
    await leader.partition.append(batch(b"after"), Acks.LEADER, BOUND)
    await leader.others[0].append(batch(b"after"), Acks.LEADER, BOUND)
    await until_log_end(followers.logs[1], 1)
    assert followers.logs[0].end_offset == 0  # stopped: nothing appended after stop() returned
    assert followers.sessions.sessions[0].members == 1


class _Member:
    """A session member that only counts the rounds it is asked for (its partition is idle at the leader)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.asked = asyncio.Event()

    @property
    def key(self) -> PartitionKey:
        return ("s", self.partition)

    def session_entry(self) -> SessionFetchEntry:
        self.asked.set()
        return SessionFetchEntry("s", self.partition, 0, EPOCH)

    async def session_data(self, entry: SessionFetchEntry, part: SessionFetchPartition, data: memoryview) -> None:
        pass

    def session_failed(self, exc: BaseException) -> None:
        pass


async def test_a_member_joining_while_the_idle_session_closes_its_connection_is_fetched(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last member left, and the session closes its connection; a member that joins before the close is
    done (a busy event loop, or one whose connection closes slowly) is asked for all the same. It used to be
    forgotten: the session cleared the join's wake-up after the close and waited for another join, which
    never came (every fetcher of that leader waited on it: a follower out of the ISR for good, issue 23)."""
    session = FetchSession("b", "a", leader.address, max_wait_ms=50)
    first, second = _Member(0), _Member(1)
    closing, release = asyncio.Event(), asyncio.Event()
    close = session._link.close

    async def slow_close() -> None:
        closing.set()
        await release.wait()
        await close()

    try:
        session.join(first)
        await asyncio.wait_for(first.asked.wait(), BOUND)
        monkeypatch.setattr(session._link, "close", slow_close)
        session.leave(first)
        await asyncio.wait_for(closing.wait(), BOUND)
        session.join(second)  # while the connection is closing
        release.set()
        await asyncio.wait_for(second.asked.wait(), BOUND)
        assert session.members == 1
    finally:
        release.set()
        await session.close()
