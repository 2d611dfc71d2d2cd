"""Fail to safety on the leader: the evidence that suspends appends, what stays open while suspended, and the
confirmed head applied when the next leadership starts. A real ``Partition`` over a real ``Log``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from tests.helpers import BOUND
from tidelog.broker.partitions.followed import FollowedPartition
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.safety import apply_confirmed_head, epoch_end_after_reset, start_evidence
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import FencedLeaderEpochError, PartitionSuspendedError, UnavailableError
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.replication.hw_checkpoint import checkpointed_hw, write_hw_checkpoint
from tidelog.replication.idempotence.producer_state import ProducerStateTable
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.epoch_cache import UNDEFINED, EpochEndOffset
from tidelog.storage.log import Log

STREAM = StreamRecord("s", "s", "", 1, 2, 0)
RECORD = PartitionRecord("s", 0, ("a", "b"), "a", ("a", "b"), leader_epoch=3)


def batch(n: int = 1) -> bytes:
    return build_batch([NewRecord(value=b"v%d" % i) for i in range(n)], timestamp=1_700_000_000_000_000_000)


async def open_log(path: Path, records: int = 0, epoch: int = 3) -> Log:
    log = await Log.open_async(path, LogConfig(flush_policy=FlushPolicy.NEVER))
    for _ in range(records):
        await log.append(batch(), epoch)
    return log


class Reports:
    """A ``report_suspension`` hook that records what it is asked and fails as told first."""

    def __init__(self, *failures: Exception) -> None:
        self.calls: list[tuple[PartitionRecord, str]] = []
        self._failures = list(failures)
        self.done = asyncio.Event()

    async def __call__(self, record: PartitionRecord, reason: str) -> None:
        self.calls.append((record, reason))
        if self._failures:
            raise self._failures.pop(0)
        self.done.set()


def lead(log: Log, record: PartitionRecord = RECORD, **options: object) -> Partition:
    return Partition(STREAM, record, log, "a", min_isr=1, **options)  # type: ignore[arg-type]


async def test_a_log_ending_below_its_checkpointed_hw_suspends_appends_but_not_reads(tmp_path: Path) -> None:
    log = await open_log(tmp_path, records=5)
    await write_hw_checkpoint(tmp_path, 8)  # what this replica knew committed: 8 records; its log holds 5
    reports = Reports()
    partition = lead(log, initial_hw=checkpointed_hw(log), report_suspension=reports)
    try:
        with pytest.raises(PartitionSuspendedError) as info:
            await partition.append(batch(), Acks.LEADER, BOUND)
        message = info.value.message
        assert "its log ends at 5, below its checkpointed high watermark 8" in message
        assert "tidelog partition reset-head s 0" in message
        assert log.end_offset == 5  # nothing stored
        assert partition.high_watermark == 5 and partition.read_committed(0, 1 << 20)  # reads go on

        await asyncio.wait_for(reports.done.wait(), BOUND)
        assert reports.calls == [(RECORD, partition.safety.reason)]
        await partition.checkpoint_hw()
        assert checkpointed_hw(log) == 8  # the evidence stays on disk while suspended
    finally:
        await partition.close(close_log=False)
    assert checkpointed_hw(log) == 8
    await log.close()


async def test_a_checkpoint_at_the_log_end_is_no_evidence(tmp_path: Path) -> None:
    log = await open_log(tmp_path, records=5)
    partition = lead(log, initial_hw=5)
    try:
        assert (await partition.append(batch(), Acks.LEADER, BOUND)).base_offset == 5
        assert partition.safety.reason == ""
    finally:
        await partition.close()


async def test_a_follower_fetching_beyond_the_log_end_suspends_appends(tmp_path: Path) -> None:
    partition = lead(await open_log(tmp_path, records=5))
    try:
        assert partition.replica_fetched("b", 5)  # at the end: an ordinary fetch
        assert not partition.replica_fetched("z", 9)  # no replica of ours: no evidence
        partition.check_appendable()
        assert partition.replica_fetched("b", 7)
        assert "replica b fetched from offset 7, beyond the log end 5 of leader a (epoch 3)" in partition.safety.reason
        follower = partition.followers.state("b")
        assert follower is not None and follower.log_end == 5  # the offset beyond is not taken as an ack
        with pytest.raises(PartitionSuspendedError):
            partition.check_appendable()
        with pytest.raises(PartitionSuspendedError):
            await partition.append(batch(), Acks.LEADER, BOUND)
    finally:
        await partition.close()


async def test_beyond_the_head_confirmed_for_this_leadership_is_expected(tmp_path: Path) -> None:
    confirmed = msgspec.structs.replace(RECORD, head_epoch=3, head_offset=5)
    partition = lead(await open_log(tmp_path, records=5), confirmed)
    try:
        assert partition.replica_fetched("b", 9)
        partition.check_appendable()  # the operator gave those offsets up: the follower will cut them
    finally:
        await partition.close()


async def test_the_record_suspends_every_leader_until_it_is_cleared(tmp_path: Path) -> None:
    suspended = msgspec.structs.replace(RECORD, suspended="found by the previous leader")
    partition = lead(await open_log(tmp_path, records=1), suspended)
    try:
        with pytest.raises(PartitionSuspendedError, match="found by the previous leader"):
            await partition.append(batch(), Acks.LEADER, BOUND)
        partition.update_record(RECORD)
        assert (await partition.append(batch(), Acks.LEADER, BOUND)).base_offset == 1
    finally:
        await partition.close()


async def test_its_own_finding_holds_until_the_record_shows_a_suspension(tmp_path: Path) -> None:
    partition = lead(await open_log(tmp_path, records=2))
    try:
        partition.replica_fetched("b", 4)
        reason = partition.safety.reason
        partition.update_record(msgspec.structs.replace(RECORD, isr=("a",)))  # an ISR change, not yet the suspension
        assert partition.safety.reason == reason
        partition.update_record(msgspec.structs.replace(RECORD, isr=("a",), suspended=reason))
        assert partition.safety.reason == reason
        partition.update_record(msgspec.structs.replace(RECORD, isr=("a",)))  # cleared in etcd: cleared here
        partition.check_appendable()
    finally:
        await partition.close()


async def test_the_suspension_is_reported_until_the_controller_takes_it(tmp_path: Path) -> None:
    reports = Reports(UnavailableError("no controller"), ConnectionResetError("gone"))
    partition = lead(await open_log(tmp_path, records=1), report_suspension=reports)
    try:
        partition.replica_fetched("b", 3)
        await asyncio.wait_for(reports.done.wait(), BOUND)
        assert len(reports.calls) == 3
    finally:
        await partition.close()


async def test_a_deposed_leader_stops_reporting(tmp_path: Path) -> None:
    reports = Reports(UnavailableError("no controller"), FencedLeaderEpochError("stale epoch"), UnavailableError("x"))
    partition = lead(await open_log(tmp_path, records=1), report_suspension=reports)
    try:
        partition.replica_fetched("b", 3)
        reporting = next(t for t in asyncio.all_tasks() if t.get_name() == "suspend-s/0")
        await asyncio.wait_for(reporting, BOUND)  # ends on the refusal: the successor's leadership decides
        assert len(reports.calls) == 2
        with pytest.raises(PartitionSuspendedError):
            partition.check_appendable()  # still refused here: this leadership is about to be closed
    finally:
        await partition.close()


async def test_a_follower_restarted_with_a_short_log_and_promoted_before_catching_up_suspends(
    tmp_path: Path,
) -> None:
    log = await open_log(tmp_path, records=3)
    await write_hw_checkpoint(tmp_path, 6)
    follower = FollowedPartition(STREAM, RECORD, log)
    assert (follower.known_committed, follower.high_watermark) == (6, 3)  # reads stay within the log
    partition = lead(log, initial_hw=follower.known_committed)  # elected from the ISR before it caught up
    try:
        assert "its log ends at 3, below its checkpointed high watermark 6" in partition.safety.reason
    finally:
        await partition.close()


async def test_what_a_follower_knows_committed_follows_its_leaders_word(tmp_path: Path) -> None:
    follower = FollowedPartition(STREAM, RECORD, await open_log(tmp_path, records=6))
    follower.high_watermark_moved(6)
    assert (follower.known_committed, follower.high_watermark) == (6, 6)
    follower.high_watermark_moved(2)  # its fetcher cut the log below it: the leader said so
    assert (follower.known_committed, follower.high_watermark) == (2, 2)
    await follower.log.close()


# ---- the confirmed head, applied before the next leadership ----


async def test_the_confirmed_head_cuts_the_uncommitted_tail_once(tmp_path: Path) -> None:
    log = await open_log(tmp_path, records=8)
    producers = ProducerStateTable()
    await write_hw_checkpoint(tmp_path, 11)  # the old evidence
    record = msgspec.structs.replace(RECORD, leader_epoch=4, head_epoch=4, head_offset=6)
    await apply_confirmed_head(record, log, 5, producers, rewrite_checkpoint=True)
    assert log.end_offset == 6
    assert checkpointed_hw(log) == 5  # rewritten from the exact HW, the evidence is gone
    assert start_evidence(record, "a", log, 5) is None

    await log.append(batch(3), 4)  # the new leadership appends: from now on the head is applied
    await apply_confirmed_head(record, log, 9, producers, rewrite_checkpoint=True)
    assert log.end_offset == 9
    await log.close()


async def test_the_confirmed_head_never_cuts_committed_records(tmp_path: Path) -> None:
    log = await open_log(tmp_path, records=8)
    record = msgspec.structs.replace(RECORD, leader_epoch=4, head_epoch=4, head_offset=6)
    await apply_confirmed_head(record, log, 7, ProducerStateTable(), rewrite_checkpoint=False)  # HW moved above
    assert log.end_offset == 8
    evidence = start_evidence(record, "a", log, 7)
    assert evidence is not None and "the head 6 confirmed by reset-head was not applied" in evidence.reason
    await apply_confirmed_head(record, log, None, ProducerStateTable(), rewrite_checkpoint=False)  # one replica
    assert log.end_offset == 8
    await log.close()


async def test_a_head_confirmed_for_another_leadership_is_ignored(tmp_path: Path) -> None:
    log = await open_log(tmp_path, records=8)
    record = msgspec.structs.replace(RECORD, leader_epoch=5, head_epoch=4, head_offset=2)
    await apply_confirmed_head(record, log, 0, ProducerStateTable(), rewrite_checkpoint=True)
    assert log.end_offset == 8 and start_evidence(record, "a", log, 8) is None
    await log.close()


def test_after_a_reset_an_unknown_epoch_ends_at_the_log_start() -> None:
    confirmed = msgspec.structs.replace(RECORD, head_epoch=3, head_offset=10)
    assert epoch_end_after_reset(confirmed, 2, UNDEFINED, 4) == EpochEndOffset(2, 4)
    known = EpochEndOffset(2, 7)
    assert epoch_end_after_reset(confirmed, 2, known, 4) == known
    assert epoch_end_after_reset(confirmed, -1, UNDEFINED, 4) == UNDEFINED
    assert epoch_end_after_reset(RECORD, 2, UNDEFINED, 4) == UNDEFINED  # no head confirmed: KIP-279 as ever
