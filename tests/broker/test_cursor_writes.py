"""Cursor writes are grouped per ``__cursors`` partition: a lone write is appended at once, writes arriving while
an append is under way share the next one, each gets its own record's offset, a fence refuses only its own write,
and a write counts as under way from its fence to the end of its append (:mod:`tidelog.broker.cursor_writes`)."""

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
        self.release = asyncio.Event()
        self.release.set()
        self.fail: Exception | None = None
        self.end = 0

    async def write(self, data: bytes, acks: Acks, timeout: float) -> Appended | WriteRefused:
        assert acks is Acks.ALL
        keys = [r.key or b"" for pos, header in iter_batches(data) for r in decode_records(data, pos, header=header)]
        self.appends.append(keys)
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


async def test_writes_arriving_during_an_append_share_the_next_one() -> None:
    store, _ = writes()
    leader = Leader()
    leader.release.clear()
    first = asyncio.create_task(store.write(0, leader, b"k0", b"v", BOUND))
    await asyncio.sleep(0)  # the lone write is being appended
    rest = [asyncio.create_task(store.write(0, leader, f"k{i}".encode(), b"v", BOUND)) for i in range(1, 6)]
    await asyncio.sleep(0)
    leader.release.set()
    offsets = await asyncio.wait_for(asyncio.gather(first, *rest), BOUND)
    assert leader.appends == [[b"k0"], [b"k1", b"k2", b"k3", b"k4", b"k5"]]  # two appends for six writes, in order
    assert offsets == [0, 1, 2, 3, 4, 5]  # each its own record's offset


async def test_a_batch_holds_at_most_max_batch_records() -> None:
    store, _ = writes()
    leader = Leader()
    leader.release.clear()
    first = asyncio.create_task(store.write(0, leader, b"first", b"v", BOUND))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(store.write(0, leader, b"k", b"v", BOUND)) for _ in range(MAX_BATCH_RECORDS + 1)]
    await asyncio.sleep(0)
    leader.release.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), BOUND)
    assert [len(keys) for keys in leader.appends] == [1, MAX_BATCH_RECORDS, 1]


async def test_a_fence_refuses_its_own_write_only() -> None:
    store, _ = writes()
    leader = Leader()
    leader.release.clear()
    first = asyncio.create_task(store.write(0, leader, b"first", b"v", BOUND))
    await asyncio.sleep(0)

    def refuse() -> None:
        raise StaleGroupEpochError("the partition moved")

    fenced = asyncio.create_task(store.write(0, leader, b"stale", b"v", BOUND, refuse))
    kept = asyncio.create_task(store.write(0, leader, b"owner", b"v", BOUND, lambda: None))
    await asyncio.sleep(0)
    leader.release.set()
    assert await asyncio.wait_for(kept, BOUND) == 1
    with pytest.raises(StaleGroupEpochError):
        await fenced
    await first
    assert leader.appends == [[b"first"], [b"owner"]]  # nothing of the refused write stored


async def test_a_failed_append_fails_every_write_it_carried() -> None:
    store, failed = writes()
    leader = Leader()
    leader.release.clear()
    first = asyncio.create_task(store.write(0, leader, b"first", b"v", BOUND))
    await asyncio.sleep(0)
    carried = [asyncio.create_task(store.write(3, leader, b"k", b"v", BOUND)) for _ in range(3)]
    await asyncio.sleep(0)
    leader.fail = RequestTimeoutError("no acknowledgement in time")
    leader.release.set()
    results = await asyncio.wait_for(asyncio.gather(first, *carried, return_exceptions=True), BOUND)
    assert all(isinstance(r, RequestTimeoutError) for r in results)
    assert failed  # the store is told: it reads its cache again from the log


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


async def test_a_caller_that_goes_away_while_waiting_is_not_written() -> None:
    store, _ = writes()
    leader = Leader()
    leader.release.clear()
    first = asyncio.create_task(store.write(0, leader, b"first", b"v", BOUND))
    await asyncio.sleep(0)
    gone = asyncio.create_task(store.write(0, leader, b"gone", b"v", BOUND))
    kept = asyncio.create_task(store.write(0, leader, b"kept", b"v", BOUND))
    await asyncio.sleep(0)
    gone.cancel()
    leader.release.set()
    await asyncio.wait_for(asyncio.gather(first, kept), BOUND)
    assert leader.appends == [[b"first"], [b"kept"]]
