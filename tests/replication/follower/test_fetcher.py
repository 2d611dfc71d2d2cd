"""The follower's fetcher against a real leader: a wire server over a real ``Partition`` and ``Log``.

Every wait is on an event (the follower log's write listener, the HW callback, the fetcher's state), bounded
by ``BOUND``; nothing polls with sleeps.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.helpers import BOUND
from tests.replication.helpers import Wake, spy_truncations, until_log_end, write
from tidelog.api.wire import server as server_module
from tidelog.clock import ManualClock
from tidelog.protocol.frames import Op
from tidelog.protocol.messages import Acks
from tidelog.replication.follower.fetcher import FetcherState, ReplicaFetcher
from tidelog.replication.follower.session import FetchSessions
from tidelog.storage.config import FlushPolicy
from tidelog.storage.flush import FlushFailedError
from tidelog.storage.log import Log
from tidelog.testing.replica_leader import Leader, open_log, start_leader


class HighWatermarks:
    """The values the fetcher reports, and a way to wait for one."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self._moved = asyncio.Event()

    def __call__(self, hw: int) -> None:
        self.seen.append(hw)
        self._moved.set()

    async def reach(self, hw: int) -> None:
        async with asyncio.timeout(BOUND):
            while not self.seen or self.seen[-1] < hw:
                self._moved.clear()
                await self._moved.wait()


async def until_bounds(log: Log, start: int, end: int) -> None:
    """Wait until ``log`` holds exactly ``start``..``end``, woken by its writes."""
    wake = Wake()
    log.add_write_observer(wake)
    async with asyncio.timeout(BOUND):
        while (log.start_offset, log.end_offset) != (start, end):
            wake.moved.clear()
            await wake.moved.wait()


def same_bytes(a: Log, b: Log) -> bool:
    return a.end_offset == b.end_offset and a.read(0, 1 << 30) == b.read(0, 1 << 30)


@pytest.fixture
def follower_log(tmp_path: Path) -> Iterator[Log]:
    yield open_log(tmp_path / "follower", FlushPolicy.ALWAYS)


class Harness:
    """One leader, one follower log, and the fetchers started on it (all stopped at teardown). With
    ``session``, the fetchers fetch through a fetch session (SESSION_FETCH), else with REPLICA_FETCH."""

    def __init__(self, tmp_path: Path, follower: Log, *, session: bool = False) -> None:
        self.tmp_path = tmp_path
        self.follower = follower
        self.leader: Leader | None = None
        self.fetchers: list[ReplicaFetcher] = []
        self.session = session
        self.sessions: list[FetchSessions] = []

    async def lead(self, history: Sequence[tuple[int, Sequence[bytes]]] = (), epoch: int = 0) -> Leader:
        log = open_log(self.tmp_path / "leader")
        await write(log, history)
        self.leader = await start_leader(log, epoch=epoch)
        return self.leader

    async def fetch(self, *, epoch: int | None = None, broker_id: str = "b", **kwargs: Any) -> ReplicaFetcher:
        assert self.leader is not None
        kwargs.setdefault("initial_hw", 0)
        kwargs.setdefault("max_wait_ms", 200)
        if self.session:
            self.sessions.append(FetchSessions(broker_id, max_wait_ms=kwargs["max_wait_ms"]))
            kwargs["sessions"] = self.sessions[-1]
        fetcher = ReplicaFetcher(
            self.follower,
            "s",
            0,
            broker_id,
            "a",
            self.leader.partition.record.leader_epoch if epoch is None else epoch,
            self.leader.address,
            **kwargs,
        )
        self.fetchers.append(fetcher)
        await fetcher.start()
        return fetcher

    async def close(self) -> None:
        for fetcher in self.fetchers:
            await fetcher.stop()
        for sessions in self.sessions:
            await sessions.close()
        if self.leader is not None:
            await self.leader.close()
        await self.follower.close()


@pytest.fixture
async def harness(request: pytest.FixtureRequest, tmp_path: Path, follower_log: Log) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, follower_log, session=getattr(request, "param", "own") == "session")
    try:
        yield h
    finally:
        await h.close()


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_the_follower_copies_the_leaders_batches_byte_for_byte(harness: Harness) -> None:
    leader = await harness.lead([(0, [b"a", b"b"])])
    hws = HighWatermarks()
    fetcher = await harness.fetch(on_high_watermark=hws)
    for value in (b"c", b"d", b"e"):
        await leader.append(value)
    await until_log_end(harness.follower, 5)
    assert same_bytes(leader.log, harness.follower)
    assert harness.follower.latest_epoch == 0
    await hws.reach(5)  # the leader's HW moves with our fetches, and comes back on a later response
    assert fetcher.high_watermark == 5 and hws.seen == sorted(set(hws.seen))
    assert fetcher.caught_up and fetcher.status().leader_log_end == 5


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_an_acks_all_append_completes_only_once_the_follower_has_it(harness: Harness) -> None:
    leader = await harness.lead()
    await harness.fetch()
    for i in range(5):
        offset = await leader.append(b"v%d" % i, acks=Acks.ALL)
        # Acknowledged: so the follower asked for the offset after it, which it only does once it holds it.
        assert harness.follower.end_offset > offset
        assert leader.partition.high_watermark == offset + 1
    assert same_bytes(leader.log, harness.follower)


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_a_divergent_tail_from_an_older_epoch_is_truncated_then_replaced(harness: Harness) -> None:
    common = (0, [b"x", b"y", b"z"])
    await write(harness.follower, [common, (1, [b"lost1", b"lost2", b"lost3"])])
    leader = await harness.lead([common, (2, [b"new1", b"new2"])], epoch=2)
    cuts = spy_truncations(harness.follower)
    fetcher = await harness.fetch(initial_hw=3)
    await asyncio.wait_for(fetcher.wait_for_state(FetcherState.FETCHING), BOUND)  # truncation is over
    await until_log_end(harness.follower, 5)
    assert cuts == [3]  # epoch 1 never reached the leader: cut where its epoch 0 ends, no lower
    assert same_bytes(leader.log, harness.follower)
    assert harness.follower.end_offset_for_epoch(2) == (2, 5)


async def test_the_walk_back_over_epochs_the_follower_never_had(harness: Harness) -> None:
    # follower: e0 [0,2) e1 [2,4) e3 [4,6)      leader: e0 [0,2) e2 [2,5) e4 [5,7)
    common = (0, [b"p", b"q"])
    await write(harness.follower, [common, (1, [b"f1", b"f2"]), (3, [b"f3", b"f4"])])
    leader = await harness.lead([common, (2, [b"l1", b"l2", b"l3"]), (4, [b"l4", b"l5"])], epoch=4)
    cuts = spy_truncations(harness.follower)
    fetcher = await harness.fetch(initial_hw=2)
    await asyncio.wait_for(fetcher.wait_for_state(FetcherState.FETCHING), BOUND)
    await until_log_end(harness.follower, 7)
    assert cuts == [4, 2]
    assert same_bytes(leader.log, harness.follower)


async def test_a_follower_holding_a_prefix_of_the_leader_is_not_truncated(harness: Harness) -> None:
    await write(harness.follower, [(0, [b"a", b"b"])])
    leader = await harness.lead([(0, [b"a", b"b", b"c", b"d"])])
    cuts = spy_truncations(harness.follower)
    await harness.fetch()
    await until_log_end(harness.follower, 4)
    assert cuts == []
    assert same_bytes(leader.log, harness.follower)


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_a_follower_ahead_of_the_leaders_log_end_keeps_its_log_until_the_head_is_confirmed(
    harness: Harness,
) -> None:
    # The leader knows no epoch as old as the follower's (UNDEFINED): truncation keeps the known HW, 4, above the
    # leader's end, 2. Committed records are missing from the leader: it suspends appends (fail to safety), and
    # the follower keeps its copy, backing off, until an operator confirms the head (reset-head).
    await write(harness.follower, [(0, [b"a", b"b", b"c", b"d"])])
    leader = await harness.lead([(1, [b"a", b"b"])], epoch=1)
    cuts = spy_truncations(harness.follower)
    hws = HighWatermarks()
    fetcher = await harness.fetch(initial_hw=4, on_high_watermark=hws)
    await asyncio.wait_for(fetcher.wait_for_state(FetcherState.BACKING_OFF), BOUND)
    assert "suspended" in (fetcher.status().last_error or "")
    assert "replica b fetched from offset 4" in leader.partition.safety.reason
    assert cuts == [] and harness.follower.end_offset == 4

    record = leader.partition.record
    leader.partition.update_record(msgspec.structs.replace(record, suspended=leader.partition.safety.reason))
    leader.partition.update_record(msgspec.structs.replace(record, head_epoch=1, head_offset=2))  # reset-head's
    await cuts.wait_for(1)
    assert cuts == [2] and harness.follower.end_offset == 2
    assert fetcher.high_watermark == 2  # never above the log end, even when that means going back
    assert hws.seen == [2]  # and the replica is told: it no longer knows 2..3 committed


async def test_a_follower_whose_whole_log_lies_beyond_a_confirmed_head_starts_over_there(harness: Harness) -> None:
    await harness.follower.reset_to(10)  # it holds nothing below 10 (far-horizon catch-up from an older leader)
    leader = await harness.lead([(1, [b"a", b"b"])], epoch=1)
    leader.partition.update_record(msgspec.structs.replace(leader.partition.record, head_epoch=1, head_offset=2))
    follower, reset = harness.follower, asyncio.Event()
    reset_to = follower.reset_to

    async def spy(offset: int) -> None:
        await reset_to(offset)
        reset.set()

    follower.reset_to = spy  # type: ignore[method-assign]
    await harness.fetch()
    await asyncio.wait_for(reset.wait(), BOUND)
    assert (follower.start_offset, follower.end_offset) == (2, 2)
    await leader.append(b"c")
    await until_bounds(follower, 2, 3)
    assert harness.follower.read(2, 1 << 20) == leader.log.read(2, 1 << 20)


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_the_fetcher_reconnects_after_the_leader_restarts_and_reports_the_outage_once(
    harness: Harness,
) -> None:
    leader = await harness.lead()
    reports: list[None] = []
    reported = asyncio.Event()

    async def unreachable() -> None:
        reports.append(None)
        reported.set()

    await harness.fetch(on_leader_unreachable=unreachable)
    await leader.append(b"before")
    await until_log_end(harness.follower, 1)
    await leader.stop_serving()
    await asyncio.wait_for(reported.wait(), BOUND)
    await leader.append(b"while down")
    await leader.serve()  # same port
    await leader.append(b"after")
    await until_log_end(harness.follower, 3)
    assert same_bytes(leader.log, harness.follower)
    assert len(reports) == 1


@pytest.mark.parametrize(
    ("epoch", "broker_id", "expected"),
    [(1, "b", "leader epoch 1"), (5, "b", "stale"), (3, "z", "not a follower")],
    ids=["older-epoch", "newer-epoch", "unknown-replica"],
)
@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_a_refused_fetcher_backs_off_and_copies_nothing(
    harness: Harness, epoch: int, broker_id: str, expected: str
) -> None:
    leader = await harness.lead(epoch=3)
    await leader.append(b"v")  # uncommitted until b acknowledges it, which a refused fetch must not do
    clock = ManualClock()
    fetcher = await harness.fetch(epoch=epoch, broker_id=broker_id, clock=clock)
    await asyncio.wait_for(fetcher.wait_for_state(FetcherState.BACKING_OFF), BOUND)
    status = fetcher.status()
    assert status.last_error is not None and expected in status.last_error
    assert harness.follower.end_offset == 0 and not fetcher.caught_up
    assert leader.partition.high_watermark == 0


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_a_follower_behind_the_leaders_log_start_copies_its_segments(harness: Harness) -> None:
    leader = await harness.lead([(0, [b"old1", b"old2"])])
    await leader.log.roll()
    await leader.append(b"new")
    await leader.log.roll()
    await leader.append(b"active")
    await leader.log.delete_segments_before(2)
    assert leader.log.start_offset == 2
    fetcher = await harness.fetch()
    await until_log_end(harness.follower, 4)
    assert harness.follower.start_offset == 2
    assert harness.follower.read(2, 1 << 20) == leader.log.read(2, 1 << 20)
    assert fetcher.catch_up_stats.resets == 1 and fetcher.status().segments_copied == 1


async def test_a_leader_that_cannot_serve_segment_files_parks_a_follower_behind_its_start(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(server_module.ROUTES, Op.SEGMENT_LIST)  # a broker from before far-horizon catch-up
    leader = await harness.lead([(0, [b"old1", b"old2"])])
    await leader.log.roll()
    await leader.append(b"new")
    await leader.log.delete_segments_before(2)
    fetcher = await harness.fetch()
    assert await asyncio.wait_for(fetcher.wait_for_state(FetcherState.PARKED), BOUND) is FetcherState.PARKED
    status = fetcher.status()
    assert status.last_error is not None and "far-horizon catch-up needed" in status.last_error
    assert harness.follower.end_offset == 0
    await fetcher.stop()
    assert fetcher.state is FetcherState.STOPPED


async def test_stop_is_idempotent_and_the_high_watermark_starts_from_what_is_known(harness: Harness) -> None:
    await write(harness.follower, [(0, [b"a", b"b", b"c"])])
    await harness.lead([(0, [b"a", b"b", b"c"])])
    fetcher = await harness.fetch(initial_hw=10)
    assert fetcher.high_watermark == 3  # never above the own log end
    await fetcher.stop()
    await fetcher.stop()
    await fetcher.start()  # a stopped fetcher stays stopped
    assert fetcher.state is FetcherState.STOPPED


@pytest.mark.parametrize("harness", ["own", "session"], indirect=True)
async def test_a_follower_whose_fsync_failed_stops_fetching_and_acknowledges_nothing_more(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the nemesis (seed 3001): reconnecting after the failure, the follower fetched at its log end, which
    # acknowledged bytes its disk never got; the leader's HW passed them.
    leader = await harness.lead([(0, [b"a"])])
    fetcher = await harness.fetch()
    await until_log_end(harness.follower, 1)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken)  # the leader's log (flush never) does not fsync on append
    await leader.append(b"b")
    assert await asyncio.wait_for(fetcher.wait_for_state(FetcherState.PARKED), BOUND) is FetcherState.PARKED
    monkeypatch.undo()
    assert harness.follower.end_offset == 2  # written, readable, never durable
    follower = leader.partition.followers.state("b")
    assert follower is not None and follower.log_end == 1 and leader.partition.high_watermark == 1
    status = fetcher.status()
    assert status.last_error is not None
    await fetcher.stop()
    with pytest.raises(FlushFailedError):
        await harness.follower.close()
