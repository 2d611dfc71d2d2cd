"""The partition manager acts on what a metadata change touched, not on every partition, and starts the leaders
a change gives it concurrently. Snapshots are handed to ``reconcile`` as the mirror would; NATS is a stub."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.helpers import BOUND
from tidelog.broker.manager import PartitionManager
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord
from tidelog.metadata.shared_map import SharedMap
from tidelog.metadata.snapshot import MetadataSnapshot, SnapshotChange
from tidelog.storage.config import FlushPolicy, LogConfig

from .test_manager_damaged import StubNats

OTHERS = 2_000
MINE = 12
BROKERS = {"b": BrokerRecord("b", "127.0.0.1", 1, 1, 0), "x": BrokerRecord("x", "127.0.0.1", 2, 2, 0)}


def config(_: StreamRecord) -> LogConfig:
    return LogConfig(flush_policy=FlushPolicy.NEVER)


def cluster() -> MetadataSnapshot:
    """``OTHERS`` one-partition streams on broker x, and ``MINE`` led by b (the manager's broker)."""
    streams = {f"s{i}": StreamRecord(f"s{i}", f"s{i}", "", 1, 1, 1) for i in range(OTHERS + MINE)}
    parts = {(f"s{i}", 0): PartitionRecord(f"s{i}", 0, ("x",), "x", ("x",), 1) for i in range(OTHERS)}
    parts.update(
        {(f"s{i}", 0): PartitionRecord(f"s{i}", 0, ("b",), "b", ("b",), 1) for i in range(OTHERS, OTHERS + MINE)}
    )
    return MetadataSnapshot(1, SharedMap(streams), SharedMap(parts), SharedMap(BROKERS))


def changed(old: MetadataSnapshot, record: PartitionRecord) -> MetadataSnapshot:
    key = (record.stream, record.id)
    partitions = SharedMap(old.partitions).edit({key: record})
    return MetadataSnapshot(old.revision + 1, old.streams, partitions, old.brokers, SnapshotChange(frozenset({key})))


async def test_a_change_of_one_partition_among_thousands_is_one_partition_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = PartitionManager("b", tmp_path, StubNats(), config, ack_timeout=BOUND)
    in_flight: list[str] = []
    all_started = asyncio.Event()
    start_ingest = manager._ingests.start

    async def start(partition: Partition) -> None:  # every new leader waits here until all of them are in
        in_flight.append(partition.name)
        if len(in_flight) == MINE:
            all_started.set()
        await all_started.wait()
        await start_ingest(partition)

    monkeypatch.setattr(manager._ingests, "start", start)
    first = cluster()
    async with asyncio.timeout(BOUND):  # one at a time, the first leader would wait for the others forever
        await manager.reconcile(MetadataSnapshot(), first)
    assert len(manager.partitions()) == MINE

    looked_at: list[tuple[str, int]] = []
    for name in ("_reconcile_one", "_drop"):
        method = getattr(manager, name)

        async def counted(key: tuple[str, int], *args: Any, method: Any = method) -> None:
            looked_at.append(key)
            await method(key, *args)

        monkeypatch.setattr(manager, name, counted)

    other = msgspec.structs.replace(first.partitions[("s5", 0)], readonly=True)
    second = changed(first, other)
    await manager.reconcile(first, second)
    assert looked_at == [("s5", 0)]

    mine = first.partitions[(f"s{OTHERS}", 0)]
    third = changed(second, msgspec.structs.replace(mine, readonly=True))
    await manager.reconcile(second, third)
    assert looked_at == [("s5", 0), (f"s{OTHERS}", 0)]
    led = manager.local(f"s{OTHERS}", 0)
    assert led is not None and led.record.readonly
    await manager.close()
