"""A deadline on one future: the value when it resolves in time, TimeoutError when not, nothing left behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tidelog.deadline import within


async def test_returns_the_value_when_the_future_resolves_in_time() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, future.set_result, "answer")
    assert await within(future, 5) == "answer"


async def test_fails_the_future_with_timeout_error_when_the_deadline_passes() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError):
        await within(future, 0.01)
    assert isinstance(future.exception(), TimeoutError)  # a late answer finds it done and is dropped
    with pytest.raises(asyncio.InvalidStateError):
        future.set_result("late")


async def test_the_timer_is_cancelled_once_the_future_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []
    call_later = loop.call_later

    def spy(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        timers.append(call_later(delay, callback, *args))
        return timers[-1]

    monkeypatch.setattr(loop, "call_later", spy)
    future: asyncio.Future[int] = loop.create_future()
    loop.call_soon(future.set_result, 7)
    assert await within(future, 30) == 7
    assert len(timers) == 1 and timers[0].cancelled()  # no 30 s timer left on the loop per wait


async def test_cancelling_the_waiter_cancels_the_future() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiter = asyncio.ensure_future(within(future, 5))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert future.cancelled()
