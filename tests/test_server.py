"""The broker process as a whole: here, its controlled shutdown (SIGTERM hands leaderships off first)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from tidelog.broker.config import BrokerConfig
from tidelog.metadata.records import BrokerRecord, PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio

BROKERS = {name: BrokerRecord(name, "127.0.0.1", 1, 2, 0) for name in ("b1", "b2")}


def led_by(**leaders: str) -> MetadataSnapshot:
    partitions = {(s, 0): PartitionRecord(s, 0, ("b1", "b2"), leader, ("b1", "b2")) for s, leader in leaders.items()}
    return MetadataSnapshot(partitions=partitions, brokers=BROKERS)


class Mirror:
    """The broker's metadata mirror, publishing the snapshots a test gives it."""

    def __init__(self, snapshot: MetadataSnapshot) -> None:
        self.snapshot = snapshot
        self._changed = asyncio.Condition()

    async def publish(self, snapshot: MetadataSnapshot) -> None:
        async with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[MetadataSnapshot], bool], timeout: float | None = None) -> object:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.snapshot))
            return self.snapshot

    async def stop(self) -> None:
        pass


class RacingController:
    """The first answer is already stale: while this broker's leadership of ``s1`` moves away, a peer stopping
    at the same moment hands it ``s2``, which has nowhere else to go. Asked again, the controller says so."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.calls = 0

    async def controlled_shutdown(self, timeout: float) -> int:
        self.calls += 1
        if self.calls == 1:
            await self.mirror.publish(led_by(s1="b2", s2="b1"))
            return 0
        return 1


class Manager:
    async def close(self) -> None:
        pass


async def test_a_broker_handed_a_leadership_while_stopping_asks_the_controller_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = Broker(BrokerConfig(id="b1", data_dir=tmp_path, shutdown_timeout_ms=3_000))
    mirror = Mirror(led_by(s1="b1", s2="b2"))
    controller = RacingController(mirror)
    broker.mirror, broker.link, broker.manager = mirror, controller, Manager()  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="tidelog.broker.hand_off"):
        await broker.stop()
    assert controller.calls == 2
    assert "leadership handed off (1 partition(s) had no other ISR member)" in caplog.text
    assert "controlled shutdown incomplete" not in caplog.text
