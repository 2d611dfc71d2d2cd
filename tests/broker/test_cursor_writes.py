"""Cursor writes are coalesced per ``__cursors`` partition: the first write of a turn of the loop is appended at
once, alone; the later writes of the turn share one append; each gets its own record's offset; writes reach the
log in arrival order; a fence refuses only its own write; and a write counts as under way from its fence to the
end of its append (:mod:`tidelog.broker.cursor_writes`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.helpers import BOUND
from tidelog.broker.cursor_writes import MAX_BATCH_RECORDS, CursorLeader, CursorWrites
from tidelog.broker.partitions.write_path import Appended, WriteRefused
from tidelog.protocol.errors import ErrorCode, RequestTimeoutError, StaleGroupEpochError
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import decode_records, iter_batches


class Leader:
    """A ``__cursors`` leader that records each append's keys and holds it until ``release`` is set."""

    def __init__(self) -> None:
        self.appends: list[list[bytes]] = []
        self.values: list[bytes] = []  # every record's value, in log order
        self.release = asyncio.Event()
        self.release.set()
        self.fail: Exception | None = None
        self.end = 0

    async def write(self, data: bytes, acks: Acks, timeout: float) -> Appended | WriteRefused:
        assert acks is Acks.ALL
        records = [r for pos, header in iter_batches(data) for r in decode_records(data, pos, header=header)]
        keys = [r.key or b"" for r in records]
        self.appends.append(keys)
        self.values += [r.value or b"" for r in records]
        await asyncio.wait_for(self.release.wait(), BOUND)
        if self.fail is not None:
            raise self.fail
        base, self.end = self.end, self.end + len(keys)
        return Appended(base, self.end - 1, 0, 0)


def writes() -> tuple[CursorWrites, list[int]]:
    failed: list[int] = []

    def on_failed(pid: int, _: CursorLeader) -> None:
        failed.append(pid)

    return CursorWrites(on_failed), failed


async def test_a_lone_write_is_appended_at_once_alone() -> None:
    store, _ = writes()
    leader = Leader()
    assert await store.write(0, leader, b"a", b"1", BOUND) == 0
    assert await store.write(0, leader, b"b", b"2", BOUND) == 1
    assert leader.appends == [[b"a"], [b"b"]]


def started(store: CursorWrites, leader: Leader, keys: list[bytes], pid: int = 0) -> list[asyncio.Task[int]]:
    """Writes whose handlers start in one turn of the loop, as the wire server starts those of one read."""
    return [asyncio.create_task(store.write(pid, leader, key, b"v", BOUND)) for key in keys]


async def test_the_later_writes_of_a_turn_share_one_append() -> None:
    store, _ = writes()
    leader = Leader()
    keys = [f"k{i}".encode() for i in range(6)]
    offsets = await asyncio.wait_for(asyncio.gather(*started(store, leader, keys)), BOUND)
    assert leader.appends == [[b"k0"], [b"k1", b"k2", b"k3", b"k4", b"k5"]]  # two appends for six writes, in order
    assert offsets == [0, 1, 2, 3, 4, 5]  # each its own record's offset


async def test_a_batch_holds_at_most_max_batch_records() -> None:
    store, _ = writes()
    leader = Leader()
    await asyncio.wait_for(asyncio.gather(*started(store, leader, [b"k"] * (MAX_BATCH_RECORDS + 2))), BOUND)
    assert [len(keys) for keys in leader.appends] == [1, MAX_BATCH_RECORDS, 1]


async def test_pipelined_writes_of_one_cursor_reach_the_log_in_the_order_sent() -> None:
    store, _ = writes()
    leader = Leader()
    pattern = [0, 1, 0, 2, 0, 0, 1, 3, 1, 0] * 5  # turns of the loop between one write and the next
    tasks = []
    for i, gap in enumerate(pattern):
        tasks.append(asyncio.create_task(store.write(0, leader, b"k", str(i).encode(), BOUND)))
        for _ in range(gap):
            await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
    assert [int(v) for v in leader.values] == list(range(len(pattern)))
    assert len(leader.appends) < len(pattern)  # and some of them shared an append


async def test_a_write_does_not_wait_for_an_append_under_way() -> None:
    store, _ = writes()
    leader = Leader()
    leader.release.clear()
    first = asyncio.create_task(store.write(0, leader, b"first", b"v", BOUND))
    for _ in range(3):
        await asyncio.sleep(0)  # the first append is under way (not acknowledged), its turn is over
    second = asyncio.create_task(store.write(0, leader, b"second", b"v", BOUND))
    for _ in range(3):
        await asyncio.sleep(0)
    assert leader.appends == [[b"first"], [b"second"]]  # issued at once: the log's group commit overlaps them
    leader.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, second), BOUND) == [0, 1]


async def test_a_fence_refuses_its_own_write_only() -> None:
    store, _ = writes()
    leader = Leader()

    def refuse() -> None:
        raise StaleGroupEpochError("the partition moved")

    first = asyncio.create_task(store.write(0, leader, b"first", b"v", BOUND))
    fenced = asyncio.create_task(store.write(0, leader, b"stale", b"v", BOUND, refuse))
    kept = asyncio.create_task(store.write(0, leader, b"owner", b"v", BOUND, lambda: None))
    assert await asyncio.wait_for(kept, BOUND) == 1
    with pytest.raises(StaleGroupEpochError):
        await fenced
    await first
    assert leader.appends == [[b"first"], [b"owner"]]  # nothing of the refused write stored


async def test_a_failed_append_fails_every_write_it_carried() -> None:
    store, failed = writes()
    leader = Leader()
    leader.fail = RequestTimeoutError("no acknowledgement in time")
    results = await asyncio.wait_for(
        asyncio.gather(*started(store, leader, [b"k"] * 4, pid=3), return_exceptions=True), BOUND
    )
    assert all(isinstance(r, RequestTimeoutError) for r in results)
    assert len(leader.appends) == 2 and failed == [3, 3]  # the store reads its cache again from the log


async def test_a_refused_append_is_the_error_of_its_code() -> None:
    store, failed = writes()

    class Refusing(Leader):
        async def write(self, data: bytes, acks: Acks, timeout: float) -> Appended | WriteRefused:
            return WriteRefused(ErrorCode.NOT_ENOUGH_REPLICAS, "one in-sync replica, min_isr is 2")

    with pytest.raises(Exception, match="min_isr is 2") as caught:
        await store.write(0, Refusing(), b"k", b"v", BOUND)
    assert getattr(caught.value, "code", None) is ErrorCode.NOT_ENOUGH_REPLICAS
    assert not failed  # nothing was stored: the cache stays


async def test_a_write_is_under_way_from_its_fence_to_the_end_of_its_append() -> None:
    store, _ = writes()
    leader = Leader()
    leader.release.clear()
    seen: list[int] = []
    fence: Callable[[], None] = lambda: seen.append(len(store.under_way(b"k")))  # noqa: E731
    task = asyncio.create_task(store.write(0, leader, b"k", b"v", BOUND, fence))
    await asyncio.sleep(0)
    assert seen == [0] and len(store.under_way(b"k")) == 1
    waiting = store.under_way(b"k")
    leader.release.set()
    await asyncio.wait_for(task, BOUND)
    assert all(f.done() for f in waiting) and store.under_way(b"k") == []


async def test_a_caller_that_goes_away_before_its_batch_is_appended_is_not_written() -> None:
    store, _ = writes()
    leader = Leader()
    first, gone, kept = started(store, leader, [b"first", b"gone", b"kept"])
    await asyncio.sleep(0)  # all three ran: the last two wait for their batch, appended next turn
    gone.cancel()
    await asyncio.wait_for(asyncio.gather(first, kept), BOUND)
    assert leader.appends == [[b"first"], [b"kept"]]


async def test_a_delete_is_one_append_in_order_with_the_commits_before_it() -> None:
    store, _ = writes()
    leader = Leader()
    first, second = started(store, leader, [b"a", b"b"])  # the first goes at once, the second waits for its batch
    delete = asyncio.create_task(store.write_all(0, leader, [b"a", b"b", b"c"], BOUND))
    assert await asyncio.wait_for(asyncio.gather(first, second, delete), BOUND) == [0, 1, [2, 3, 4]]
    assert leader.appends == [[b"a"], [b"b", b"a", b"b", b"c"]]  # the tombstones after the commit of b
    assert leader.values[2:] == [b"", b"", b""]  # tombstones: no value
    lone = await store.write_all(0, leader, [b"x", b"y"], BOUND)
    assert lone == [5, 6] and leader.appends[-1] == [b"x", b"y"]  # all in one append
    with pytest.raises(ValueError, match="at most"):
        await store.write_all(0, leader, [b"k"] * (MAX_BATCH_RECORDS + 1), BOUND)
