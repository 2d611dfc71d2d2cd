"""What the follower and catch-up tests share: writing a history into a log, waiting for its end, watching its
truncations."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.helpers import BOUND
from tidelog.storage.log import Log
from tidelog.testing.replica_leader import batch


class Wake:
    """A write observer (told after each write, as the storage hook allows) that sets an event."""

    before_write = False

    def __init__(self) -> None:
        self.moved = asyncio.Event()

    def on_write(self, _first: int, _end: int, _parts: object) -> None:
        self.moved.set()


async def until_log_end(log: Log, offset: int) -> None:
    """Wait until ``log`` holds everything below ``offset``, woken by its writes."""
    wake = Wake()
    log.add_write_observer(wake)
    try:
        async with asyncio.timeout(BOUND):
            while log.end_offset < offset:
                wake.moved.clear()
                await wake.moved.wait()
    finally:
        log.remove_write_observer(wake)


async def write(log: Log, history: Sequence[tuple[int, Sequence[bytes]]]) -> None:
    for epoch, values in history:
        for value in values:
            await log.append(batch(value), leader_epoch=epoch)


class Truncations(list[int]):
    """Every offset a log was truncated to (only cuts that remove something), and a way to wait for them."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self._cut = asyncio.Event()
        truncate_to = log.truncate_to

        async def spy(offset: int) -> None:
            cuts = offset < log.end_offset
            await truncate_to(offset)
            if cuts:
                self.append(offset)
                self._cut.set()

        log.truncate_to = spy  # type: ignore[method-assign]

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(BOUND):
            while len(self) < count:
                self._cut.clear()
                await self._cut.wait()


def spy_truncations(log: Log) -> Truncations:
    return Truncations(log)
