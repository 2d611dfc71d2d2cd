"""The led partitions' periodic work runs from one timer: idle partitions cost no timer each."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.helpers import until
from tidelog.broker.partitions.maintenance import LeaderMaintenance
from tidelog.broker.partitions.partition import Partition
from tidelog.clock import ManualClock
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

IDLE = 25


async def _led(
    tmp_path: Path, name: str, clock: ManualClock, maintenance: LeaderMaintenance, isr: tuple[str, ...] = ("b",)
) -> Partition:
    log = await Log.open_async(tmp_path / name, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord(name, name, "", 1, len(isr), 0)
    proposed: list[tuple[str, ...]] = []

    async def alter_isr(_: PartitionRecord, wanted: tuple[str, ...]) -> None:
        proposed.append(wanted)

    partition = Partition(
        stream,
        PartitionRecord(name, 0, isr, "b", isr),
        log,
        "b",
        min_isr=1,
        alter_isr=alter_isr,
        replica_lag_time_max=10.0,
        clock=clock,
        maintenance=maintenance,
    )
    partition.proposed = proposed  # type: ignore[attr-defined]  # what the test reads back
    return partition


async def test_many_idle_partitions_share_one_timer_and_a_replicated_one_is_still_looked_after(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    maintenance = LeaderMaintenance(clock)
    tasks_before = len(asyncio.all_tasks())
    idle = [await _led(tmp_path, f"idle{i}", clock, maintenance) for i in range(IDLE)]
    replicated = await _led(tmp_path, "replicated", clock, maintenance, isr=("b", "c"))
    await replicated.append(_one_batch(), Acks.LEADER, 5)  # "c" never fetches it
    await until(lambda: clock.sleepers > 0, "the maintenance timer")
    assert clock.sleepers == 1, "a timer per partition"
    assert len(asyncio.all_tasks()) == tasks_before + 1, "a task per partition"

    passes = maintenance.passes
    clock.advance(1.0)
    await until(lambda: maintenance.passes > passes and clock.sleepers == 1, "a pass over the partitions")
    assert (replicated.log.directory / HW_CHECKPOINT_FILE).exists()  # checkpointed from the shared timer
    assert not any((p.log.directory / HW_CHECKPOINT_FILE).exists() for p in idle)  # one replica: none
    for _ in range(11):  # 11 s without a fetch from "c": it leaves the ISR
        passes = maintenance.passes
        clock.advance(1.0)
        await until(lambda: maintenance.passes > passes and clock.sleepers == 1, "the next pass")  # noqa: B023
    await until(lambda: ("b",) in replicated.proposed, "the ISR shrink")  # type: ignore[attr-defined]
    assert all(p.proposed == [] for p in idle)  # type: ignore[attr-defined]

    for partition in [*idle, replicated]:
        await partition.close()
    assert not maintenance.running and clock.sleepers == 0, "a timer left behind with nothing to look after"
    assert len(asyncio.all_tasks()) == tasks_before


async def test_an_idle_partition_is_not_visited_until_a_write_wakes_it(tmp_path: Path) -> None:
    clock = ManualClock()
    maintenance = LeaderMaintenance(clock)
    partition = await _led(tmp_path, "one", clock, maintenance)
    await partition.append(_one_batch(), Acks.LEADER, 5)
    for _ in range(31):  # past SNAPSHOT_INTERVAL_NS: the producer state is snapshotted, then nothing is due
        await until(lambda: clock.sleepers == 1 or not maintenance.running, "the maintenance timer")
        if not maintenance.running:
            break
        passes = maintenance.passes
        clock.advance(1.0)
        await until(lambda: maintenance.passes > passes, "a pass")  # noqa: B023
    assert not maintenance.running and maintenance.active == 0, "an idle partition still visited every second"
    assert clock.sleepers == 0

    await partition.append(_one_batch(), Acks.LEADER, 5)
    assert maintenance.running and maintenance.active == 1, "a write did not wake the partition"
    await partition.close()
    assert not maintenance.running and len(maintenance) == 0


async def test_an_interval_flushed_log_has_no_timer_once_everything_is_flushed(tmp_path: Path) -> None:
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_interval_ms=10))
    tasks_before = len(asyncio.all_tasks())
    await log.append(_one_batch(), 0)
    assert len(asyncio.all_tasks()) == tasks_before + 1  # the ticker, while a write waits for its flush
    await until(lambda: log.flusher.durable == log.flusher.written, "the interval flush")
    await until(lambda: len(asyncio.all_tasks()) == tasks_before, "the ticker to end")
    await log.append(_one_batch(), 0)  # the next write starts it again
    await until(lambda: log.flusher.durable == log.flusher.written, "the second interval flush")
    await log.close()


def _one_batch() -> bytes:
    return build_batch([NewRecord(value=b"v")], timestamp=1_700_000_000_000_000_000)
