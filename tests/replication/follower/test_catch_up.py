"""Far-horizon catch-up against a real leader: a wire server over a real ``Partition`` and ``Log`` with small
segments, a follower log, and a :class:`ReplicaFetcher` copying segment files in rounds.

Every wait is on an event (the follower log's writes, the fetcher's state) bounded by ``BOUND``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BOUND
from tests.replication.helpers import spy_truncations, until_log_end, write
from tidelog.clock import ManualClock
from tidelog.protocol.peer_messages import SegmentSummary
from tidelog.replication.follower.catch_up import CopyHooks
from tidelog.replication.follower.fetcher import FetcherState, ReplicaFetcher
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log
from tidelog.storage.segment_install import STAGING_DIR
from tidelog.testing.replica_leader import Leader, batch, start_leader

HISTORY = [
    (0, [b"a%d" % i for i in range(12)]),
    (2, [b"b%d" % i for i in range(10)]),
    (5, [b"c%d" % i for i in range(9)]),
]


def open_small(path: Path, flush: FlushPolicy = FlushPolicy.NEVER) -> Log:
    return Log.open(path, LogConfig(segment_max_bytes=600, index_interval_bytes=128, flush_policy=flush))


def identical(leader: Log, follower: Log) -> bool:
    """Byte-identical from the leader's start to its end (the follower may start lower only if empty there)."""
    start = leader.start_offset
    return follower.end_offset == leader.end_offset and follower.read(start, 1 << 30) == leader.read(start, 1 << 30)


class CatchUpHarness:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.follower = open_small(tmp_path / "follower", FlushPolicy.ALWAYS)
        self.leader: Leader | None = None
        self.fetchers: list[ReplicaFetcher] = []

    async def lead(self, history: Sequence[tuple[int, Sequence[bytes]]] = HISTORY, *, delete_before: int = 0) -> Leader:
        log = open_small(self.tmp_path / "leader")
        await write(log, history)
        await log.roll()
        await log.append(batch(b"active"), leader_epoch=history[-1][0])
        if delete_before:
            await log.delete_segments_before(delete_before)
        self.leader = await start_leader(log, epoch=history[-1][0])
        return self.leader

    async def fetch(self, **kwargs: Any) -> ReplicaFetcher:
        assert self.leader is not None
        kwargs.setdefault("initial_hw", 0)
        kwargs.setdefault("max_wait_ms", 200)
        fetcher = ReplicaFetcher(
            self.follower, "s", 0, "b", "a", self.leader.partition.record.leader_epoch, self.leader.address, **kwargs
        )
        self.fetchers.append(fetcher)
        await fetcher.start()
        return fetcher

    async def close(self) -> None:
        for fetcher in self.fetchers:
            await fetcher.stop()
        if self.leader is not None:
            await self.leader.close()
        await self.follower.close()


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[CatchUpHarness]:
    h = CatchUpHarness(tmp_path)
    try:
        yield h
    finally:
        await h.close()


async def test_a_follower_behind_the_leaders_start_copies_its_segments_and_ends_byte_identical(
    harness: CatchUpHarness, tmp_path: Path
) -> None:
    leader = await harness.lead(delete_before=8)
    start = leader.log.start_offset
    assert start > 0 and len(leader.log.segments) > 3
    await write(harness.follower, [(0, [b"stale1", b"stale2"])])  # ends at 2: below the leader's start
    fetcher = await harness.fetch()
    await until_log_end(harness.follower, leader.log.end_offset)
    assert identical(leader.log, harness.follower)
    assert harness.follower.start_offset == start
    stats = fetcher.catch_up_stats
    assert stats.resets == 1 and stats.segments == len(leader.log.segments) - 1 and stats.phases == 1
    status = fetcher.status()
    assert status.segments_copied == stats.segments and status.state is FetcherState.FETCHING
    for epoch in (0, 1, 2, 5):
        assert harness.follower.end_offset_for_epoch(epoch) == leader.log.end_offset_for_epoch(epoch)
    await leader.append(b"after")  # and fetching carries on from there
    await until_log_end(harness.follower, leader.log.end_offset)
    assert identical(leader.log, harness.follower)
    await fetcher.stop()
    await harness.follower.close()
    assert not (tmp_path / "follower" / STAGING_DIR).exists()
    reopened = open_small(tmp_path / "follower")
    try:
        assert identical(leader.log, reopened)
        for epoch in (0, 1, 2, 5, 6):
            assert reopened.end_offset_for_epoch(epoch) == leader.log.end_offset_for_epoch(epoch)
    finally:
        await reopened.close()
        harness.follower = open_small(tmp_path / "follower-unused")


async def test_a_follower_beyond_the_lag_threshold_copies_instead_of_fetching(harness: CatchUpHarness) -> None:
    leader = await harness.lead()
    await write(harness.follower, [(0, [b"a0", b"a1", b"a2"])])  # a prefix ending inside the first segment
    cuts = spy_truncations(harness.follower)
    fetcher = await harness.fetch(copy_threshold_bytes=1000)
    await until_log_end(harness.follower, leader.log.end_offset)
    assert identical(leader.log, harness.follower)
    stats = fetcher.catch_up_stats
    assert stats.phases == 1 and stats.resets == 0 and stats.segments >= len(leader.log.segments) - 2
    assert cuts == []  # never cut what it held: the segment it ended inside was completed by fetching


async def test_below_the_threshold_or_with_the_trigger_off_the_follower_just_fetches(harness: CatchUpHarness) -> None:
    leader = await harness.lead()
    fetcher = await harness.fetch(copy_threshold_bytes=0)
    await until_log_end(harness.follower, leader.log.end_offset)
    assert identical(leader.log, harness.follower)
    assert fetcher.catch_up_stats.phases == 0 and fetcher.catch_up_stats.bytes == 0


async def test_a_segment_deleted_mid_copy_restarts_the_round(harness: CatchUpHarness) -> None:
    leader = await harness.lead(delete_before=8)
    deleted: list[int] = []

    async def on_chunk(summary: SegmentSummary, position: int) -> None:
        if not deleted:  # retention strikes while the first segment is half copied
            deleted.extend(await leader.log.delete_segments_before(summary.next_offset + 1))

    fetcher = await harness.fetch(copy_chunk_bytes=100, copy_hooks=CopyHooks(on_chunk=on_chunk))
    await until_log_end(harness.follower, leader.log.end_offset)
    assert deleted and identical(leader.log, harness.follower)
    stats = fetcher.catch_up_stats
    assert stats.restarts >= 1 and stats.resets >= 1
    assert harness.follower.start_offset == leader.log.start_offset


async def test_a_corrupt_download_is_refused_and_the_copy_tried_again(harness: CatchUpHarness) -> None:
    leader = await harness.lead(delete_before=8)
    damaged: list[Path] = []

    def on_downloaded(path: Path) -> None:
        if not damaged:
            data = bytearray(path.read_bytes())
            data[100] ^= 0x01  # inside the first batch: only its CRC can tell
            path.write_bytes(bytes(data))
            damaged.append(path)

    clock = ManualClock()
    fetcher = await harness.fetch(clock=clock, copy_hooks=CopyHooks(on_downloaded=on_downloaded))
    await asyncio.wait_for(fetcher.wait_for_state(FetcherState.BACKING_OFF), BOUND)
    status = fetcher.status()
    assert damaged and status.last_error is not None and "CRC" in status.last_error
    assert harness.follower.end_offset == 0 and status.segments_copied == 0  # nothing installed, nothing reset
    assert not (harness.follower.directory / STAGING_DIR).exists()
    clock.advance(1.0)  # the back-off ends: copy again, undamaged this time
    await until_log_end(harness.follower, leader.log.end_offset)
    assert identical(leader.log, harness.follower)
