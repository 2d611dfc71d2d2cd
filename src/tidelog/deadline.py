"""Awaiting one future with a deadline, without ``asyncio.timeout``.

``asyncio.timeout`` is a context manager written in Python: entering it schedules a timer, leaving it
reschedules and cancels, and on expiry it cancels the whole task and converts the cancellation back into
``TimeoutError``. That is the right tool around several awaits; a wait on a hot path for one future that the
waiter owns (a follower's fetch response, once per replicated write) need not pay for it. :func:`within` puts
the deadline on the future itself instead: a timer that fails it with ``TimeoutError``, cancelled once the
future resolves.

The followers' fetch responses are awaited this way; an acks-ALL produce's wait for its commit gained nothing
from it (its reply leaves from the acknowledgement itself, :class:`tidelog.api.wire.handlers._CommittedReply`), so
it keeps ``asyncio.timeout``. The numbers are in docs/performance.md.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

T = TypeVar("T")


async def within(future: asyncio.Future[T], timeout: float) -> T:
    """Await ``future``; after ``timeout`` seconds it fails with ``TimeoutError`` (raised here).

    Only for a future the caller owns, whose other users (if any) treat a failed future as given up on (a
    response arriving later is dropped). Cancelling the caller cancels the future, as a plain await does.
    """
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
