"""What the group consumer tests share: producing numbered records, a member consuming in a task of its own, and
a watch on the committed offsets that notes any that go back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from tests.helpers import BOUND
from tidelog.client import Admin, ConsumerRecord, GroupConsumer, Producer
from tidelog.protocol.errors import TidelogError


async def produce(address: str, stream: str, partitions: Iterable[int], count: int, first: int = 0) -> None:
    """``count`` records into each partition, valued ``partition:index`` from index ``first``."""
    async with Producer(address) as producer:
        futures = [
            await producer.send(stream, f"{p}:{i}".encode(), partition=p)
            for p in partitions
            for i in range(first, first + count)
        ]
        await producer.flush()
        for future in futures:
            await future


class Reader:
    """A member consuming in a task of its own, keeping every record it was handed."""

    def __init__(self, consumer: GroupConsumer) -> None:
        self.consumer = consumer
        self.seen: list[ConsumerRecord] = []
        self._running = True
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._running:
            record = await self.consumer.getone(timeout=0.1)
            if record is not None:
                self.seen.append(record)

    async def stop(self) -> None:
        """Stop consuming (the loop ends at its next record or timeout), then close: commit and leave."""
        self._running = False
        if self._task is not None:
            await asyncio.wait_for(self._task, BOUND)
        await self.consumer.close()

    def offsets(self, partition: int) -> list[int]:
        return [r.offset for r in self.seen if r.partition == partition]


class CursorWatch:
    """Reads the group's committed offsets over and over while a test runs, noting any that went back."""

    def __init__(self, admin: Admin, stream: str, group: str, partitions: int) -> None:
        self._admin, self._stream, self._group, self._partitions = admin, stream, group, partitions
        self.last = dict.fromkeys(range(partitions), -1)
        self.regressions: list[tuple[int, int, int]] = []
        self._running = True
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._running:
            for p in range(self._partitions):
                try:
                    offset = await self._admin.fetch_cursor(self._stream, p, self._group)
                except TidelogError:
                    continue  # a failover of the cursor's leader: read it on the next pass
                if offset < self.last[p]:
                    self.regressions.append((p, self.last[p], offset))
                self.last[p] = max(offset, self.last[p])
            await asyncio.sleep(0.05)  # a sampling pace, not a wait for anything

    async def stop(self) -> None:
        self._running = False
        await asyncio.wait_for(self._task, BOUND)
