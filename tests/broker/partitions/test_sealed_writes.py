"""The leader's write path on an encrypted stream: batches are sealed where they enter, refused without a key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.write_path import WriteRefused
from tidelog.metadata.records import PartitionRecord, StreamConfig, StreamRecord
from tidelog.protocol.errors import EncryptionError, ErrorCode
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import ENCRYPTED_FLAG, NewRecord, build_batch, check_batch, iter_batches
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.encryption import Keyring, open_batches
from tidelog.storage.log import Log

MAX_BATCH = 4096
TS = 1_700_000_000_000_000_000


async def _partition(tmp_path: Path, keyring: Keyring | None) -> Partition:
    config = LogConfig(segment_max_bytes=1 << 20, max_batch_bytes=MAX_BATCH, flush_policy=FlushPolicy.NEVER)
    log = await Log.open_async(tmp_path, config)
    log.keyring = keyring
    stream = StreamRecord("s", "s", "", 1, 1, 0, StreamConfig(encryption=True))
    record = PartitionRecord("s", 0, ("b",), "b", ("b",), data_keys=(b"wrapped",))
    return Partition(stream, record, log, "b", min_isr=1)


def _batch_of_exactly(size: int) -> bytes:
    """A one-record batch of ``size`` bytes: the largest the log takes from a client when ``size`` is its limit."""
    value = b"v" * (size - len(build_batch([NewRecord(value=b"")], timestamp=TS)))
    while len(batch := build_batch([NewRecord(value=value)], timestamp=TS)) != size:
        value = value[: len(value) - (len(batch) - size)]
    return batch


async def test_a_batch_of_the_largest_size_is_sealed_and_stored(tmp_path: Path) -> None:
    ring = Keyring([os.urandom(32)])
    partition = await _partition(tmp_path, ring)
    try:
        batch = _batch_of_exactly(MAX_BATCH)
        await partition.append(batch, Acks.ALL, 5)
        stored = partition.log.read(0, 1 << 20)
        assert [h.attributes & ENCRYPTED_FLAG for _, h in iter_batches(stored)] == [ENCRYPTED_FLAG]
        assert check_batch(open_batches(stored, ring)).size == MAX_BATCH
        assert partition.read_committed(0, 1 << 20) == open_batches(stored, ring)
    finally:
        await partition.close()


async def test_a_leader_without_the_key_refuses_and_stores_nothing(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, None)
    try:
        status = await partition.write(build_batch([NewRecord(value=b"x")], timestamp=TS), Acks.ALL, 5)
        assert isinstance(status, WriteRefused) and status.code is ErrorCode.ENCRYPTION
        assert "master key" in status.message
        assert partition.log.end_offset == 0
    finally:
        await partition.close()


@pytest.mark.parametrize("sealed", [True, False])
async def test_reads_without_the_key_are_refused_only_when_sealed(tmp_path: Path, sealed: bool) -> None:
    partition = await _partition(tmp_path, Keyring([os.urandom(32)]))
    try:
        await partition.append(build_batch([NewRecord(value=b"x")], timestamp=TS), Acks.ALL, 5)
        partition.log.keyring = None  # the broker lost the key (restarted without it)
        if not sealed:
            partition.stream = StreamRecord("s", "s", "", 1, 1, 0)
            assert partition.read_committed(0, 1 << 20)  # a plain stream reads its bytes as they are
            return
        with pytest.raises(EncryptionError, match="master key"):
            partition.read_committed(0, 1 << 20)
    finally:
        await partition.close()
