"""The injected clock: the manual clock moves only when told, and wakes sleepers in deadline order."""

from __future__ import annotations

import asyncio

import pytest

from tidelog.clock import Clock, ManualClock, SystemClock


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SystemClock(), Clock) and isinstance(ManualClock(), Clock)


async def test_system_clock_reads_and_sleeps() -> None:
    clock = SystemClock()
    before = clock.monotonic_ns()
    await clock.sleep(0)
    assert clock.monotonic_ns() >= before and clock.now_ns() > 1_600_000_000 * 10**9


async def test_manual_clock_wakes_sleepers_when_time_reaches_them() -> None:
    clock = ManualClock(start_ns=1000)
    woken: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woken.append(name)

    tasks = [asyncio.ensure_future(sleeper("late", 2)), asyncio.ensure_future(sleeper("early", 1))]
    await asyncio.sleep(0)
    assert clock.sleepers == 2
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woken == []
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woken == ["early"]
    clock.advance(5)
    await asyncio.gather(*tasks)
    assert woken == ["early", "late"]
    assert clock.now_ns() == 1000 + 6 * 10**9 and clock.monotonic_ns() == 6 * 10**9


async def test_manual_clock_ignores_cancelled_sleepers_and_refuses_going_back() -> None:
    clock = ManualClock()
    task = asyncio.ensure_future(clock.sleep(1))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    assert clock.sleepers == 0
    clock.advance(2)  # must not fail on the cancelled future
    with pytest.raises(ValueError):
        clock.advance(-1)
    clock.set_now_ns(5)
    assert clock.now_ns() == 5


async def test_zero_sleep_yields_once() -> None:
    clock = ManualClock()
    await clock.sleep(0)
