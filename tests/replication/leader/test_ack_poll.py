"""The leader's loop polls instead of sleeping until a deadline, and sleeps again after it."""

from __future__ import annotations

import asyncio

from tidelog.replication.leader.ack_poll import LoopPoller, poller_for


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_the_loop_polls_until_the_deadline_then_sleeps_again() -> None:
    clock = _Clock()
    poller = LoopPoller(asyncio.get_running_loop(), clock)
    assert not poller.polling
    poller.poll_for(500)
    await _turns(20)
    assert poller.polling and poller.turns >= 19  # one poll per turn of the loop while due
    clock.now += 500
    await _turns(3)
    assert not poller.polling
    turns = poller.turns
    await _turns(10)
    assert poller.turns == turns  # nothing left running: the loop may sleep


async def test_a_later_poll_pushes_the_deadline_out_and_adds_no_second_chain() -> None:
    clock = _Clock()
    poller = LoopPoller(asyncio.get_running_loop(), clock)
    poller.poll_for(500)
    clock.now += 300
    poller.poll_for(500)  # while polling: only the deadline moves
    assert poller.deadline_ns == clock.now + 500
    before = poller.turns
    await _turns(10)
    assert poller.turns - before <= 10  # a second chain would count two per turn
    clock.now += 300  # past the first deadline, not the second
    await _turns(3)
    assert poller.polling
    clock.now += 200
    await _turns(3)
    assert not poller.polling


async def test_an_earlier_deadline_never_cuts_a_later_one_short() -> None:
    clock = _Clock()
    poller = LoopPoller(asyncio.get_running_loop(), clock)
    poller.poll_for(1_000)
    poller.poll_for(10)
    assert poller.deadline_ns == 2_000


async def test_each_loop_has_one_poller() -> None:
    loop = asyncio.get_running_loop()
    assert poller_for(loop) is poller_for(loop)
    other = asyncio.new_event_loop()
    try:
        assert poller_for(other) is not poller_for(loop)
    finally:
        other.close()


async def test_stop_ends_the_polling_before_its_deadline() -> None:
    clock = _Clock()
    poller = LoopPoller(asyncio.get_running_loop(), clock)
    poller.poll_for(1_000)
    await _turns(3)
    poller.stop()
    await _turns(3)
    assert not poller.polling
    poller.poll_for(1_000)  # and a later write starts it again
    await _turns(3)
    assert poller.polling
