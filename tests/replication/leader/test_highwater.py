"""The leader's high watermark: the minimum log end across the ISR, never moving back, waking exactly its waiters."""

from __future__ import annotations

import asyncio

import pytest

from tidelog.replication.leader.highwater import HighWatermark


async def test_a_sole_leader_commits_what_it_writes() -> None:
    hw = HighWatermark("a", ["a"], 0)
    assert hw.value == 0
    hw.replica_caught_up_to("a", 5)
    assert hw.value == 5


async def test_the_hw_is_the_lowest_log_end_in_the_isr() -> None:
    hw = HighWatermark("a", ["a", "b", "c"], 10)
    hw.replica_caught_up_to("a", 20)
    assert hw.value == 10
    hw.replica_caught_up_to("b", 15)
    assert hw.value == 10
    hw.replica_caught_up_to("c", 18)
    assert hw.value == 15
    hw.replica_caught_up_to("x", 100)  # not in the ISR: ignored
    assert hw.value == 15


async def test_the_hw_never_goes_back() -> None:
    hw = HighWatermark("a", ["a", "b"], 0)
    hw.replica_caught_up_to("a", 10)
    hw.replica_caught_up_to("b", 10)
    assert hw.value == 10
    hw.replica_caught_up_to("b", 3)  # a stale report
    hw.set_isr(["a", "b", "c"])  # a new member starts at the HW, not at 0
    assert hw.value == 10


async def test_a_new_member_counts_only_what_it_fetched_though_the_hw_moved_while_it_joined() -> None:
    # Found by the nemesis (seed 3201): c fetched at 10 (the HW then) and was proposed; a and b went on to 15
    # before the ISR change reached the metadata. Credited with the HW, c let 10..14 commit without it, then led
    # without them (the preferred-leader election).
    hw = HighWatermark("a", ["a", "b"], 0)
    hw.replica_caught_up_to("a", 10)
    hw.replica_caught_up_to("b", 10)
    hw.replica_caught_up_to("a", 15)
    hw.replica_caught_up_to("b", 15)
    assert hw.value == 15
    hw.set_isr(["a", "b", "c"], {"b": 15, "c": 10})
    hw.replica_caught_up_to("a", 20)
    hw.replica_caught_up_to("b", 20)
    assert hw.value == 15  # held by c, at 10 (never back below 15)
    hw.replica_caught_up_to("c", 20)
    assert hw.value == 20


async def test_a_follower_asked_into_the_isr_holds_the_hw_before_the_metadata_names_it() -> None:
    # Found by the long nemesis (seed 3311): c's join reached etcd while a, not yet applying it, committed two
    # records c lacked; the controller then made c leader, and those two acknowledged records were lost.
    hw = HighWatermark("a", ["a", "b"], 10)
    hw.count_joining("c", 10)
    hw.replica_caught_up_to("a", 12)
    hw.replica_caught_up_to("b", 12)
    assert hw.value == 10  # c has only 10
    hw.set_isr(["a", "b"])  # another change (no news of the join): c still counts
    assert hw.value == 10 and hw.joining == {"c"}
    hw.replica_caught_up_to("c", 12)
    assert hw.value == 12
    hw.set_isr(["a", "b", "c"])  # the join reached the metadata: c is a member
    assert hw.joining == frozenset()
    hw.replica_caught_up_to("a", 14)
    hw.replica_caught_up_to("b", 14)
    assert hw.value == 12


async def test_a_joining_follower_stops_counting_once_an_isr_without_it_is_written() -> None:
    hw = HighWatermark("a", ["a", "b"], 10)
    hw.count_joining("c", 10)
    hw.replica_caught_up_to("a", 12)
    hw.replica_caught_up_to("b", 12)
    assert hw.value == 10
    hw.stop_counting(["c"])
    assert hw.value == 12 and hw.joining == frozenset()
    hw.count_joining("b", 12)  # already a member: nothing to count twice
    assert hw.joining == frozenset()


async def test_a_joining_follower_is_no_member_for_min_isr() -> None:
    hw = HighWatermark("a", ["a"], 0, min_isr=2)
    hw.count_joining("b", 0)
    hw.replica_caught_up_to("a", 5)
    hw.replica_caught_up_to("b", 5)
    assert hw.value == 0  # a and b hold 5, but the ISR is a alone until the metadata names b
    hw.set_isr(["a", "b"])
    assert hw.value == 5


async def test_shrinking_the_isr_commits_what_the_rest_has() -> None:
    hw = HighWatermark("a", ["a", "b"], 0)
    hw.replica_caught_up_to("a", 8)
    assert hw.value == 0
    hw.set_isr(["a"])
    assert hw.value == 8
    hw.set_isr([])  # the leader always counts
    hw.replica_caught_up_to("a", 9)
    assert hw.value == 9


async def test_waiters_wake_exactly_when_their_offset_commits() -> None:
    hw = HighWatermark("a", ["a"], 0)
    waiting = {offset: asyncio.ensure_future(hw.wait_committed(offset)) for offset in (0, 2, 5)}
    await asyncio.sleep(0)
    hw.replica_caught_up_to("a", 3)  # offsets 0..2 committed
    await asyncio.wait_for(asyncio.gather(waiting[0], waiting[2]), 5)
    assert not waiting[5].done()
    hw.replica_caught_up_to("a", 6)
    await asyncio.wait_for(waiting[5], 5)


async def test_already_committed_returns_at_once() -> None:
    hw = HighWatermark("a", ["a"], 4)
    await asyncio.wait_for(hw.wait_committed(3), 1)
    assert await hw.wait_beyond(3, 0)


async def test_wait_beyond_times_out() -> None:
    hw = HighWatermark("a", ["a"], 0)
    assert not await hw.wait_beyond(0, 0.01)
    hw.replica_caught_up_to("a", 1)
    assert await hw.wait_beyond(0, 0.01)


async def test_failing_waiters_wakes_them_with_the_error() -> None:
    hw = HighWatermark("a", ["a"], 0)
    waiter = asyncio.ensure_future(hw.wait_committed(10))
    await asyncio.sleep(0)
    hw.fail_waiters(RuntimeError("closing"))
    with pytest.raises(RuntimeError, match="closing"):
        await asyncio.wait_for(waiter, 1)


async def test_wait_beyond_without_a_timeout_waits_for_the_advance() -> None:
    hw = HighWatermark("a", ["a"], 0)
    waiter = asyncio.ensure_future(hw.wait_beyond(2, None))
    await asyncio.sleep(0)
    hw.replica_caught_up_to("a", 2)
    await asyncio.sleep(0)
    assert not waiter.done()
    hw.replica_caught_up_to("a", 3)
    assert await asyncio.wait_for(waiter, 5)


def test_the_hw_holds_while_the_isr_is_below_min_isr() -> None:
    hw = HighWatermark("a", ["a", "b", "c"], 0, min_isr=2)
    hw.replica_caught_up_to("a", 5)
    hw.replica_caught_up_to("b", 5)
    hw.replica_caught_up_to("c", 3)
    assert hw.value == 3
    hw.set_isr(["a"])  # both followers gone: a write appended meanwhile must not commit on the leader alone
    assert hw.value == 3
    hw.replica_caught_up_to("a", 9)
    assert hw.value == 3
    hw.set_isr(["a", "b"])  # b is back in the ISR at the HW it was known at; its next fetch moves the HW
    hw.replica_caught_up_to("b", 9)
    assert hw.value == 9


async def test_a_waiters_callback_runs_inside_the_advance_that_commits_it() -> None:
    hw = HighWatermark("a", ["a", "b"], 0)
    hw.replica_caught_up_to("a", 5)
    calls: list[str] = []
    waiter = asyncio.ensure_future(hw.wait_committed(3, lambda: calls.append("committed 3")))
    await asyncio.sleep(0)
    hw.replica_caught_up_to("b", 3)  # offset 3 not yet committed: no call
    assert calls == []
    hw.replica_caught_up_to("b", 4)
    assert calls == ["committed 3"]  # from inside the advance, before the waiter resumed
    assert not waiter.done()
    await waiter


async def test_a_callback_is_not_run_when_the_offset_was_committed_already_or_the_wait_fails() -> None:
    hw = HighWatermark("a", ["a", "b"], 0)
    calls: list[int] = []
    hw.replica_caught_up_to("a", 5)
    hw.replica_caught_up_to("b", 5)
    await hw.wait_committed(2, lambda: calls.append(2))
    failing = asyncio.ensure_future(hw.wait_committed(9, lambda: calls.append(9)))
    await asyncio.sleep(0)
    hw.fail_waiters(RuntimeError("leadership lost"))
    with pytest.raises(RuntimeError):
        await failing
    assert calls == []


async def test_a_failing_callback_does_not_stop_the_advance() -> None:
    hw = HighWatermark("a", ["a", "b"], 0)
    hw.replica_caught_up_to("a", 5)

    def broken() -> None:
        raise ValueError("bug")

    first = asyncio.ensure_future(hw.wait_committed(1, broken))
    second = asyncio.ensure_future(hw.wait_committed(2))
    await asyncio.sleep(0)
    hw.replica_caught_up_to("b", 5)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert hw.value == 5
