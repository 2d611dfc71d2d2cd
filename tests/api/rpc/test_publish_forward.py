"""A publish forwarded to the leader by a broker whose published metadata lags etcd: it waits (bounded) for its
view to name the leader instead of refusing at once (a three-broker test published through a follower right
after the ISR filled, and was told the partition had no leader)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from tidelog.api.rpc.publish import _leader_known
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot

pytestmark = pytest.mark.asyncio

STREAM = StreamRecord("s", "s", "", 1, 3, 0)
LED = MetadataSnapshot(
    streams={"s": STREAM}, partitions={("s", 0): PartitionRecord("s", 0, ("a", "b", "c"), "a", ("a", "b", "c"))}
)


class Mirror:
    def __init__(self) -> None:
        self.snapshot = MetadataSnapshot()
        self._changed = asyncio.Condition()

    async def publish(self, snapshot: MetadataSnapshot) -> None:
        async with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[MetadataSnapshot], bool], timeout: float) -> MetadataSnapshot:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.snapshot))
            return self.snapshot


async def test_a_lagging_view_is_waited_for_then_names_the_leader() -> None:
    mirror = Mirror()
    ctx = cast(Any, type("Ctx", (), {"mirror": mirror}))
    waiting = asyncio.create_task(_leader_known(ctx, "s", 0, 5.0))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await mirror.publish(LED)
    stream, meta = await asyncio.wait_for(waiting, 5.0)
    assert stream == STREAM and meta is not None and meta.leader == "a"


async def test_a_partition_still_unknown_after_the_wait_is_reported_as_such() -> None:
    ctx = cast(Any, type("Ctx", (), {"mirror": Mirror()}))
    assert await _leader_known(ctx, "s", 0, 0.05) == (None, None)
