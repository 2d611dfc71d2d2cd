"""The partition manager applying a confirmed head (fail to safety): the leader's broker starts the new leadership
on its open log cut to the head, and never cuts committed records. Metadata snapshots are handed to
``reconcile`` directly, as the mirror would; NATS is a stub (ingest only subscribes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.helpers import BOUND
from tidelog.broker.manager import PartitionManager
from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import PartitionSuspendedError
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.replication.hw_checkpoint import checkpointed_hw, write_hw_checkpoint
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

STREAM = StreamRecord("s", "s", "", 1, 2, 1)
# Led by b; c never fetches, so the HW stays where the checkpoint put it and the tail above is uncommitted.
SUSPENDED = PartitionRecord("s", 0, ("b", "c"), "b", ("b", "c"), leader_epoch=3, suspended="evidence")
BROKERS = {b: BrokerRecord(b, "127.0.0.1", 1, 1, 0) for b in "bc"}


class StubNats:
    async def subscribe(self, *args: Any, **kwargs: Any) -> StubNats:
        return self

    async def unsubscribe(self) -> None:
        pass


def config(_: StreamRecord) -> LogConfig:
    return LogConfig(flush_policy=FlushPolicy.NEVER)


def snapshot(record: PartitionRecord, revision: int) -> MetadataSnapshot:
    return MetadataSnapshot(revision, {"s": STREAM}, {("s", 0): record}, BROKERS)


@pytest.fixture
async def manager(tmp_path: Path) -> AsyncIterator[PartitionManager]:
    """Broker b, whose replica of s/0 holds 5 records and a checkpoint saying 3 are committed."""
    started = PartitionManager("b", tmp_path, StubNats(), config, ack_timeout=BOUND)
    directory = started.path_of(STREAM, 0)
    directory.mkdir(parents=True)
    log = Log.open(directory, config(STREAM))
    for i in range(5):
        await log.append(build_batch([NewRecord(value=b"v%d" % i)], timestamp=1), leader_epoch=3)
    await log.close()
    await write_hw_checkpoint(directory, 3)
    try:
        yield started
    finally:
        await started.close()


async def test_the_new_leadership_starts_cut_to_the_confirmed_head(manager: PartitionManager) -> None:
    await manager.reconcile(MetadataSnapshot(), snapshot(SUSPENDED, 1))
    led = manager.local("s", 0)
    assert led is not None and (led.high_watermark, led.log_end) == (3, 5)
    with pytest.raises(PartitionSuspendedError):
        led.check_appendable()

    confirmed = msgspec.structs.replace(SUSPENDED, suspended="", leader_epoch=4, head_epoch=4, head_offset=4)
    await manager.reconcile(snapshot(SUSPENDED, 1), snapshot(confirmed, 2))
    resumed = manager.local("s", 0)
    assert resumed is not None and resumed is not led
    assert (resumed.high_watermark, resumed.log_end) == (3, 4)  # the uncommitted record beyond the head is cut
    assert checkpointed_hw(resumed.log) == 3
    appended = await resumed.append(build_batch([NewRecord(value=b"new")], timestamp=2), Acks.LEADER, BOUND)
    assert appended.base_offset == 4


async def test_a_head_below_the_high_watermark_is_not_applied_and_suspends_again(manager: PartitionManager) -> None:
    await manager.reconcile(MetadataSnapshot(), snapshot(SUSPENDED, 1))
    # Confirmed at 2 (as if the HW had moved above it between the controller's check and now).
    confirmed = msgspec.structs.replace(SUSPENDED, suspended="", leader_epoch=4, head_epoch=4, head_offset=2)
    await manager.reconcile(snapshot(SUSPENDED, 1), snapshot(confirmed, 2))
    resumed = manager.local("s", 0)
    assert resumed is not None and resumed.log_end == 5  # committed records are never cut
    with pytest.raises(PartitionSuspendedError, match="the head 2 confirmed by reset-head was not applied"):
        resumed.check_appendable()


async def test_a_restart_right_after_the_reset_does_not_find_the_old_evidence(
    manager: PartitionManager, tmp_path: Path
) -> None:
    directory = manager.path_of(STREAM, 0)
    await write_hw_checkpoint(directory, 7)  # the disk lost records 5 and 6, which were committed
    record = msgspec.structs.replace(SUSPENDED, suspended="")
    await manager.reconcile(MetadataSnapshot(), snapshot(record, 1))
    led = manager.local("s", 0)
    assert led is not None and "below its checkpointed high watermark 7" in led.safety.reason
    await led.checkpoint_hw()
    assert checkpointed_hw(led.log) == 7  # kept on disk as evidence while suspended

    confirmed = msgspec.structs.replace(record, leader_epoch=4, head_epoch=4, head_offset=5)
    await manager.reconcile(snapshot(record, 1), snapshot(confirmed, 2))
    resumed = manager.local("s", 0)
    assert resumed is not None and resumed.safety.reason == "" and checkpointed_hw(resumed.log) == 5
    await manager.close()

    restarted = PartitionManager("b", tmp_path, StubNats(), config, ack_timeout=BOUND)
    try:
        await restarted.reconcile(MetadataSnapshot(), snapshot(confirmed, 2))
        again = restarted.local("s", 0)
        assert again is not None and again.safety.reason == ""
    finally:
        await restarted.close()
