"""Keeping producer state in step with a real log: replicated payloads, truncations exact and inexact (rebuilt
from a snapshot and the log), and resets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tidelog.protocol.records import BatchBuilder, parse_header
from tidelog.protocol.records.producers import WINDOW
from tidelog.replication.idempotence.producer_snapshot import ProducerSnapshots
from tidelog.replication.idempotence.producer_state import NEW, Duplicate, OutOfOrder, ProducerStateTable
from tidelog.replication.idempotence.producer_sync import (
    after_truncation,
    open_producer_state,
    record_replicated,
    take_snapshot,
)
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

pytestmark = pytest.mark.asyncio


def batch(sequence: int, *, pid: int = 7, epoch: int = 0, base_offset: int = 0) -> bytes:
    builder = BatchBuilder(time.time_ns())
    builder.append(b"v%d" % sequence)
    return builder.build(producer_id=pid, producer_epoch=epoch, base_sequence=sequence, base_offset=base_offset)


def open_log(path: Path) -> Log:
    return Log.open(path, LogConfig(segment_max_bytes=4096, flush_policy=FlushPolicy.NEVER))


async def test_a_follower_records_what_it_replicates_and_a_promotion_dedupes(tmp_path: Path) -> None:
    log = open_log(tmp_path / "f")
    table = ProducerStateTable()
    payload = b"".join(batch(seq, base_offset=seq) for seq in range(3))
    await log.append_as_follower(payload)
    record_replicated(table, log, payload)
    assert table.check(parse_header(batch(1), 0)) == Duplicate(1, 1)
    assert table.check(parse_header(batch(5), 0)) == OutOfOrder(3)
    await log.close()


async def test_replicated_batches_not_written_are_not_recorded(tmp_path: Path) -> None:
    log = open_log(tmp_path / "f")
    table = ProducerStateTable()
    record_replicated(table, log, batch(0, base_offset=0))  # as after an append cancelled before its write
    assert len(table) == 0
    await log.close()


async def test_an_exact_truncation_cuts_the_state(tmp_path: Path) -> None:
    log = open_log(tmp_path / "f")
    table = ProducerStateTable()
    payload = b"".join(batch(seq, base_offset=seq) for seq in range(3))
    await log.append_as_follower(payload)
    record_replicated(table, log, payload)
    await log.truncate_to(1)
    after_truncation(table, log, ProducerSnapshots(log.directory))
    assert table.check(parse_header(batch(0), 0)) == Duplicate(0, 0)
    assert table.check(parse_header(batch(1), 0)) == NEW  # the cut batch may be written again
    assert table.check(parse_header(batch(2), 0)) == OutOfOrder(1)
    await log.close()


async def test_an_inexact_truncation_is_rebuilt_from_a_snapshot_and_the_log(tmp_path: Path) -> None:
    log = open_log(tmp_path / "f")
    table = ProducerStateTable()
    count = WINDOW + 3  # older batches left the window: cutting the newest leaves an inexact state
    payload = b"".join(batch(seq, base_offset=seq) for seq in range(count))
    await log.append_as_follower(payload)
    record_replicated(table, log, payload)
    snapshots = ProducerSnapshots(log.directory)
    assert take_snapshot(table, snapshots, log.end_offset)  # above the cut: deleted by after_truncation
    await log.truncate_to(WINDOW)
    after_truncation(table, log, snapshots)
    assert snapshots.offsets() == []
    expected = open_producer_state(log)  # what a full scan of the shortened log gives
    assert table.entries() == expected.entries()
    assert table.check(parse_header(batch(WINDOW - 1), 0)) == Duplicate(WINDOW - 1, WINDOW - 1)
    assert table.check(parse_header(batch(WINDOW + 1), 0)) == OutOfOrder(WINDOW)  # the cut batches are gone
    await log.close()
