"""The partition manager deletes the copy of a partition reassigned away from its broker: at once while it runs
(the record's replicas no longer name it), and at start-up when that happened while it was down. Metadata
snapshots are handed to the manager directly, as the mirror would; NATS is a stub."""

from __future__ import annotations

from pathlib import Path

from tests.broker.test_manager_damaged import BROKERS, StubNats, config
from tidelog.broker.manager import PartitionManager
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot

STREAM = StreamRecord("s", "s", "", 2, 1, 1)
HERE = (PartitionRecord("s", 0, ("b",), "b", ("b",), leader_epoch=1), PartitionRecord("s", 1, ("b",), "b", ("b",)))


def _snapshot(*parts: PartitionRecord) -> MetadataSnapshot:
    return MetadataSnapshot(streams={"s": STREAM}, partitions={(p.stream, p.id): p for p in parts}, brokers=BROKERS)


async def test_a_partition_reassigned_away_is_deleted_while_running_and_at_start(tmp_path: Path) -> None:
    manager = PartitionManager("b", tmp_path, StubNats(), config, ack_timeout=5.0)
    before = _snapshot(*HERE)
    await manager.reconcile(before, before)
    assert manager.path_of(STREAM, 0).is_dir() and manager.path_of(STREAM, 1).is_dir()
    away = PartitionRecord("s", 0, ("c",), "c", ("c",), leader_epoch=2)
    after = _snapshot(away, HERE[1])
    await manager.reconcile(before, after)
    assert not manager.path_of(STREAM, 0).exists()  # moved off this broker: its copy goes
    assert manager.path_of(STREAM, 1).is_dir()
    await manager.close()

    restarted = PartitionManager("b", tmp_path, StubNats(), config, ack_timeout=5.0)
    gone = PartitionRecord("s", 1, ("c",), "c", ("c",))  # reassigned away while the broker was down
    removed = await restarted.remove_orphans(_snapshot(away, gone))
    assert removed == [restarted.path_of(STREAM, 1)]
    assert not restarted.path_of(STREAM, 1).exists()
