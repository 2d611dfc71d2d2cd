"""The partition manager and a log that start-up recovery found damaged in the middle: a single-replica partition
is not opened (requests get CORRUPT_DATA naming the damage), nothing is cut, and deleting its stream still deletes
its files. Metadata snapshots are handed to ``reconcile`` directly, as the mirror would; NATS is a stub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidelog.broker.manager import PartitionManager
from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import CorruptDataError
from tidelog.protocol.records import NewRecord, build_batch, iter_batches
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

STREAM = StreamRecord("s", "s", "", 1, 1, 1)
RECORD = PartitionRecord("s", 0, ("b",), "b", ("b",), leader_epoch=1)
BROKERS = {"b": BrokerRecord("b", "127.0.0.1", 1, 1, 0)}


class StubNats:
    async def subscribe(self, *args: Any, **kwargs: Any) -> StubNats:
        return self

    async def unsubscribe(self) -> None:
        pass


def config(_: StreamRecord) -> LogConfig:
    return LogConfig(flush_policy=FlushPolicy.NEVER)


async def test_a_refused_partition_serves_nothing_keeps_its_bytes_and_is_deleted_with_its_stream(
    tmp_path: Path,
) -> None:
    manager = PartitionManager("b", tmp_path, StubNats(), config, ack_timeout=5.0)
    directory = manager.path_of(STREAM, 0)
    log = Log.open(directory, config(STREAM))
    for i in range(6):
        await log.append(build_batch([NewRecord(value=b"v%d" % i)], timestamp=1), leader_epoch=1)
    await log.close()
    (segment,) = directory.glob("*.log")
    data = bytearray(segment.read_bytes())
    position, header = list(iter_batches(bytes(data)))[1]
    data[position + header.size - 1] ^= 0x01
    segment.write_bytes(bytes(data))
    (directory / "clean-shutdown").unlink()  # as after a crash: the active segment is scanned

    empty = MetadataSnapshot()
    await manager.reconcile(empty, MetadataSnapshot(1, {"s": STREAM}, {("s", 0): RECORD}, BROKERS))
    assert manager.local("s", 0) is None
    with pytest.raises(CorruptDataError, match=r"offsets 1\.\.1 unreadable, followed by 4 intact"):
        manager.leader_of("s", 0)
    assert segment.read_bytes() == bytes(data)

    await manager.reconcile(empty, MetadataSnapshot(2, {}, {}, BROKERS))  # the stream is deleted
    assert not directory.exists()
    await manager.close()
