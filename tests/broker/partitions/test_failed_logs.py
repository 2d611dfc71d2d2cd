"""A log whose disk failed a write or an fsync: its leader steps down (or, alone, says why it cannot), and the
log, opened again as a follower's, keeps only what its last good fsync made durable."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import msgspec
import pytest

from tidelog.broker.partitions.failed_logs import FailedLogs, close_failed
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.write_path import WriteRefused
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import ErrorCode, RequestTimeoutError
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.flush import FlushFailedError
from tidelog.storage.log import Log

KEY = ("s", 0)


def _batch(n: int = 1) -> bytes:
    return build_batch([NewRecord(value=b"v%d" % i) for i in range(n)], timestamp=time.time_ns())


async def _leader(tmp_path: Path, replicas: str, isr: str, failed: FailedLogs) -> Partition:
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS, preallocate_bytes=0))
    stream = StreamRecord("s", "s", "", 1, len(replicas), 0)
    record = msgspec.structs.replace(PartitionRecord("s", 0, tuple(replicas), "a", tuple(isr)), leader_epoch=3)
    return Partition(stream, record, log, "a", min_isr=1, on_log_failed=failed.leader_failed)


def _broken(fd: int) -> None:
    raise OSError(5, "Input/output error")


async def test_a_leader_whose_fsync_failed_refuses_and_steps_down_for_the_other_in_sync_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[int, tuple[str, ...]]] = []
    done = asyncio.Event()

    async def alter_isr(record: PartitionRecord, isr: tuple[str, ...]) -> None:
        asked.append((record.leader_epoch, isr))
        done.set()

    failed = FailedLogs("a", alter_isr=alter_isr)
    partition = await _leader(tmp_path, "abc", "abc", failed)
    partition._hw.set_isr(("a",))  # the followers' acks are not what this test is about
    monkeypatch.setattr(os, "fdatasync", _broken)
    with pytest.raises(RequestTimeoutError, match="may be stored"):  # in doubt, retriable: on the next leader
        await partition.write(_batch(), Acks.ALL, 5)
    monkeypatch.undo()
    refused = await partition.write(_batch(), Acks.ALL, 5)  # the disk "works" again: the log stays failed
    assert isinstance(refused, WriteRefused) and refused.code is ErrorCode.UNAVAILABLE
    await asyncio.wait_for(done.wait(), 10)
    await partition.maintain()  # asked once per record, however often the failure is met
    assert asked == [(3, ("b", "c"))]
    with pytest.raises(FlushFailedError):
        await partition.close()
    await failed.close()


async def test_a_failed_write_poisons_the_log_though_it_was_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[Partition] = []
    failed = FailedLogs("a", alter_isr=None)
    partition = await _leader(tmp_path, "a", "a", failed)
    partition._on_log_failed = told.append
    await partition.write(_batch(), Acks.ALL, 5)

    def eio(*_: object) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pwritev", eio)
    with pytest.raises(RequestTimeoutError, match="Input/output"):
        await partition.write(_batch(), Acks.ALL, 5)
    monkeypatch.undo()
    assert partition.log.flusher.failed is not None and told == [partition]
    assert partition.log_end == 1  # the write was undone; the disk is not trusted any more all the same
    refused = await partition.write(_batch(), Acks.ALL, 5)
    assert isinstance(refused, WriteRefused) and refused.code is ErrorCode.UNAVAILABLE
    await close_failed(partition.log)
    await partition.close()


async def test_a_single_replica_keeps_refusing_and_says_why_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def alter_isr(record: PartitionRecord, isr: tuple[str, ...]) -> None:
        raise AssertionError("nobody to step down for")

    failed = FailedLogs("a", alter_isr=alter_isr)
    partition = await _leader(tmp_path, "a", "a", failed)
    monkeypatch.setattr(os, "fdatasync", _broken)
    with caplog.at_level(logging.ERROR), pytest.raises(RequestTimeoutError):
        await partition.write(_batch(), Acks.ALL, 5)
    monkeypatch.undo()
    for _ in range(3):
        assert isinstance(await partition.write(_batch(), Acks.ALL, 5), WriteRefused)
    said = [r.getMessage() for r in caplog.records if "until broker a restarts" in r.getMessage()]
    assert len(said) == 1 and "it has one replica" in said[0]
    await close_failed(partition.log)
    await partition.close()
    await failed.close()


async def test_a_failed_log_opened_again_keeps_only_what_was_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LogConfig(flush_policy=FlushPolicy.ALWAYS, preallocate_bytes=0)
    log = await Log.open_async(tmp_path, config)
    await log.append(_batch(3), 1)
    monkeypatch.setattr(os, "fdatasync", _broken)
    with pytest.raises(FlushFailedError):
        await log.append(_batch(2), 1)
    monkeypatch.undo()
    failed = FailedLogs("a", alter_isr=None)
    failed.note(KEY, log)
    await close_failed(log)
    reopened = await Log.open_async(tmp_path, config)
    assert reopened.end_offset == 5  # the file (the page cache) still shows what the failed fsync left
    assert await failed.recover(KEY, reopened, leading=False)
    assert reopened.end_offset == reopened.durable_end == 3  # the rest is fetched again from the leader
    await reopened.append(_batch(1), 1)  # a new log: its own fsyncs, none of the failed one's retried
    await reopened.close()
    again = await Log.open_async(tmp_path, config)
    assert again.end_offset == 4 and await failed.recover(KEY, again, leading=False)  # recovered: nothing to cut
    await again.close()


async def test_a_recovery_whose_disk_still_fails_is_tried_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retried = asyncio.Event()

    async def retry(key: tuple[str, int]) -> None:
        retried.set()

    config = LogConfig(flush_policy=FlushPolicy.ALWAYS, preallocate_bytes=0)
    log = await Log.open_async(tmp_path, config)
    await log.append(_batch(3), 1)
    failed = FailedLogs("a", alter_isr=None, retry=retry)
    monkeypatch.setattr("tidelog.broker.partitions.failed_logs.RETRY_FIRST", 0.01)
    monkeypatch.setattr(os, "fdatasync", _broken)
    with pytest.raises(FlushFailedError):
        await log.append(_batch(2), 1)
    failed.note(KEY, log)
    await close_failed(log)
    assert await failed.opened(KEY, Log.open_async(tmp_path, config), leading=False) is None  # its scan's fsync
    await asyncio.wait_for(retried.wait(), 10)
    monkeypatch.undo()
    healed = await failed.opened(KEY, Log.open_async(tmp_path, config), leading=False)
    assert healed is not None and healed.end_offset == 3
    await healed.close()
    await failed.close()
