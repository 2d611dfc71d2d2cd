"""Writing to a led partition: acks ALL answers once the append is fsynced and committed, or times out."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.broker.helpers import until
from tidelog.broker.partitions.partition import Partition
from tidelog.clock import ManualClock
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.errors import InvalidArgumentError, RequestTimeoutError, TidelogError
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.replication.hw_checkpoint import checkpointed_hw
from tidelog.replication.leader.ack_poll import LoopPoller, poller_for
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.file_writes import Buffer
from tidelog.storage.flush import FlushMode
from tidelog.storage.log import Log
from tidelog.testing.small_disk import Ballast, mount_small_disk


async def _partition(tmp_path: Path, isr: tuple[str, ...]) -> Partition:
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, len(isr), 0)
    return Partition(stream, PartitionRecord("s", 0, isr, "b", isr), log, "b", min_isr=1)


def _batch(n: int) -> bytes:
    return build_batch([NewRecord(value=b"v%d" % i) for i in range(n)], timestamp=1_700_000_000_000_000_000)


async def test_acks_all_on_a_sole_replica_returns_fsynced_and_committed(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, ("b",))
    for expected_base in (0, 3, 6):
        appended = await partition.append(_batch(3), Acks.ALL, 5)
        assert (appended.base_offset, appended.last_offset) == (expected_base, expected_base + 2)
        assert partition.high_watermark == appended.last_offset + 1
        assert partition.log.flusher.durable == partition.log.flusher.written
    await partition.close()


async def test_acks_all_times_out_while_the_isr_lags_and_keeps_the_write(tmp_path: Path) -> None:
    partition = await _partition(tmp_path, ("b", "c"))  # "c" never fetches: the HW cannot move
    with pytest.raises(RequestTimeoutError):
        await partition.append(_batch(2), Acks.ALL, 0.05)
    assert partition.log_end == 2 and partition.high_watermark == 0
    assert not await partition.wait_for_data(0, 0.01)
    appended = await partition.append(_batch(1), Acks.LEADER, 5)  # LEADER: the leader's own (fsynced) log
    assert appended.base_offset == 2 and partition.high_watermark == 0
    await partition.close()


async def test_an_append_whose_caller_is_cancelled_mid_fsync_still_commits(tmp_path: Path) -> None:
    """A client gone while its batch is being fsynced: the batch is in the log, and the HW must still reach it
    without waiting for another write (a replicated leader fsyncs on the worker, so the caller really waits)."""
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, 2, 0)
    partition = Partition(stream, PartitionRecord("s", 0, ("b", "c"), "b", ("b",)), log, "b", min_isr=1)
    task = asyncio.ensure_future(partition.append(_batch(2), Acks.LEADER, 5))
    for _ in range(10_000):
        if partition.log_end:
            break
        await asyncio.sleep(0)
    assert partition.log_end == 2 and not task.done()  # written, the fsync still running
    task.cancel()
    assert await partition.wait_for_data(1, 5.0), "the cancelled append's records never committed"
    assert partition.high_watermark == 2
    await partition.close()


async def _polling_partition(tmp_path: Path, ack_poll_us: int) -> Partition:
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, 2, 0)
    record = PartitionRecord("s", 0, ("b", "c"), "b", ("b", "c"))
    return Partition(stream, record, log, "b", min_isr=1, ack_poll_us=ack_poll_us)


async def _written(partition: Partition, end: int) -> None:
    for _ in range(10_000):
        if partition.log.flusher.durable >= partition.log.flusher.written and partition.log_end >= end:
            return
        await asyncio.sleep(0)
    raise AssertionError("the append was not written and fsynced")


async def test_a_lone_acks_all_write_keeps_the_leader_polling_past_its_commit(tmp_path: Path) -> None:
    partition = await _polling_partition(tmp_path, 30_000_000)  # 30 s: the deadline cannot pass mid-test
    poller = poller_for(asyncio.get_running_loop())
    assert not poller.polling
    write = asyncio.ensure_future(partition.append(_batch(2), Acks.ALL, 5))
    await _written(partition, 2)
    await asyncio.sleep(0)
    assert poller.polling and not write.done()  # fsynced here, waiting for "c": polling, not sleeping
    partition.replica_fetched("c", 2)  # "c" acknowledges
    assert (await write).last_offset == 1
    assert poller.polling  # and on, for the next write of a producer that waits for each one
    await partition.close()


async def test_writes_waiting_together_do_not_push_the_polling_out(tmp_path: Path) -> None:
    partition = await _polling_partition(tmp_path, 30_000_000)
    poller = poller_for(asyncio.get_running_loop())
    first = asyncio.ensure_future(partition.append(_batch(1), Acks.ALL, 5))
    await _written(partition, 1)
    await asyncio.sleep(0)
    deadline = poller.deadline_ns
    assert poller.polling and deadline > 0
    second = asyncio.ensure_future(partition.append(_batch(1), Acks.ALL, 5))
    await _written(partition, 2)
    await asyncio.sleep(0)
    assert poller.deadline_ns == deadline  # pipelined writes: the loop is busy anyway
    partition.replica_fetched("c", 2)
    assert [(await w).last_offset for w in (first, second)] == [0, 1]
    await partition.close()


async def test_a_leader_set_not_to_poll_sleeps_while_it_waits(tmp_path: Path) -> None:
    partition = await _polling_partition(tmp_path, 0)
    write = asyncio.ensure_future(partition.append(_batch(1), Acks.ALL, 5))
    await _written(partition, 1)
    await asyncio.sleep(0)
    assert not poller_for(asyncio.get_running_loop()).polling
    partition.replica_fetched("c", 1)
    await write
    await partition.close()


class _ParkedFetch:
    """A follower's fetch waiting at the log end; notes the poller's deadline on the loop turn after the push."""

    def __init__(self, poller: LoopPoller) -> None:
        self._poller = poller
        self.deadlines: list[int] = []

    def written(self, batches: Sequence[Buffer] | None, size: int, log_end: int) -> None:
        asyncio.get_running_loop().call_soon(lambda: self.deadlines.append(self._poller.deadline_ns))

    def closed(self, error: TidelogError) -> None:
        raise AssertionError(f"closed: {error}")


async def test_handing_the_next_write_to_waiting_followers_ends_the_polling(tmp_path: Path) -> None:
    """The followers woken by a write need the CPUs for their own write and fsync; the leader polls again once
    its own fsync of that write is done."""
    partition = await _polling_partition(tmp_path, 30_000_000)
    poller = poller_for(asyncio.get_running_loop())
    first = asyncio.ensure_future(partition.append(_batch(1), Acks.ALL, 5))
    await _written(partition, 1)
    await asyncio.sleep(0)
    partition.replica_fetched("c", 1)
    await first
    assert poller.polling and poller.deadline_ns > 0  # lingering for the next write
    parked = _ParkedFetch(poller)
    partition.park_at_log_end(1, parked)  # "c" waits at the log end for the next write
    second = asyncio.ensure_future(partition.append(_batch(1), Acks.ALL, 5))
    await _written(partition, 2)
    assert parked.deadlines == [0]  # stopped as the write went to the follower
    await asyncio.sleep(0)
    assert poller.polling  # fsynced: polling again for the acknowledgement
    partition.replica_fetched("c", 2)
    await second
    await partition.close()


async def test_a_replicated_leader_fsyncs_on_threads_and_gives_the_log_back_as_it_found_it(tmp_path: Path) -> None:
    """Its own fsync should start before the followers' (FlushMode.WORKER); a sole replica may fsync inline."""
    partition = await _polling_partition(tmp_path / "replicated", 0)
    flusher = partition.log.flusher
    assert flusher.mode is FlushMode.WORKER
    write = asyncio.ensure_future(partition.append(_batch(1), Acks.ALL, 5))
    await _written(partition, 1)
    partition.replica_fetched("c", 1)
    await write
    assert flusher.inline_rounds == 0 and flusher.fsync_rounds >= 1
    await partition.close(close_log=False)
    assert flusher.mode is FlushMode.ADAPTIVE  # the log's next role (a follower) starts from the defaults
    await partition.log.close()
    sole = await _partition(tmp_path / "sole", ("b",))
    assert sole.log.flusher.mode is FlushMode.ADAPTIVE
    await sole.close()


async def test_a_full_disk_delays_the_high_watermark_checkpoint_and_never_stops_the_partitions_upkeep(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Writing the HW checkpoint on a full disk (a real tmpfs) is logged and retried at the next tick: the
    partition's upkeep (ISR shrinking, producer expiry, checkpoints) goes on, and the checkpoint lands once space
    is freed."""
    try:
        mounted = mount_small_disk(tmp_path / "disk", 1024 * 1024)
        disk = mounted.__enter__()
    except OSError as exc:
        pytest.skip(str(exc))
    try:
        partition = await _partition(disk / "log", ("b", "c"))
        await partition.append(_batch(2), Acks.LEADER, 5)
        ballast = Ballast(disk / "ballast")
        ballast.fill()
        partition.replica_fetched("c", 2)  # the HW moves to 2: the next tick checkpoints it, on a full disk
        await until(lambda: "cannot write the high-watermark checkpoint" in caplog.text, "the failed checkpoint")
        ballast.free()
        await until(lambda: checkpointed_hw(partition.log) == 2, "the checkpoint once space is freed")
        await partition.close()
    finally:
        mounted.__exit__(None, None, None)


async def test_a_follower_that_stops_fetching_leaves_the_isr_after_the_lag_time_on_the_partitions_clock(
    tmp_path: Path,
) -> None:
    """Lag, ISR shrink and record timestamps read the injected clock: no real time passes in this test."""
    clock = ManualClock()
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, 2, 0)
    record = PartitionRecord("s", 0, ("b", "c"), "b", ("b", "c"))
    proposed: list[tuple[str, ...]] = []

    async def alter_isr(_: PartitionRecord, isr: tuple[str, ...]) -> None:
        proposed.append(isr)

    partition = Partition(
        stream, record, log, "b", min_isr=1, alter_isr=alter_isr, replica_lag_time_max=10.0, clock=clock
    )
    appended = await partition.append(_batch(1), Acks.LEADER, 5)
    assert appended.received_ns == clock.now_ns()
    await until(lambda: clock.sleepers > 0, "the upkeep timer")
    clock.advance(5.0)  # within the lag time: "c" stays
    await until(lambda: clock.sleepers > 0, "the next tick")
    assert proposed == []
    clock.advance(6.0)  # 11 s without a fetch reaching the log end
    await until(lambda: proposed == [("b",)], "the ISR shrink")
    await partition.close()


async def test_records_committed_while_a_join_is_on_its_way_are_held_by_the_joining_follower(tmp_path: Path) -> None:
    """The long nemesis's seed 3311: d's ISR join was written, the leader went on committing with the ISR it
    knew, and the controller made d leader without the records committed meanwhile. A follower counts in the
    HW from the moment it is asked into the ISR; and once it stops fetching it stops holding the HW back, by an
    ISR change written without it (the lag time on the partition's clock)."""
    clock = ManualClock()
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, 3, 0)
    record = PartitionRecord("s", 0, ("b", "c", "d"), "b", ("b", "c"))
    proposed: list[tuple[str, ...]] = []

    async def alter_isr(_: PartitionRecord, isr: tuple[str, ...]) -> None:
        proposed.append(isr)  # written; its record has not reached this leader yet

    partition = Partition(
        stream, record, log, "b", min_isr=1, alter_isr=alter_isr, replica_lag_time_max=10.0, clock=clock
    )
    assert partition.replica_fetched("d", 0)  # at the HW: ready to join
    await until(lambda: proposed == [("b", "c", "d")], "the join asked")
    await partition.append(_batch(2), Acks.LEADER, 5)
    assert partition.replica_fetched("c", 2)
    assert partition.high_watermark == 0  # d, which the controller may already elect, has nothing
    assert partition.replica_fetched("d", 2)
    assert partition.high_watermark == 2

    await partition.append(_batch(1), Acks.LEADER, 5)
    assert partition.replica_fetched("c", 3)
    assert partition.high_watermark == 2  # d stopped fetching: it still holds the HW ...
    await until(lambda: clock.sleepers > 0, "the upkeep timer")
    clock.advance(6.0)
    assert partition.replica_fetched("c", 3)  # c keeps up
    await until(lambda: clock.sleepers > 0, "the next tick")
    clock.advance(5.0)  # d: 11 s behind
    await until(lambda: proposed[-1] == ("b", "c"), "an ISR without d")
    await until(lambda: partition.high_watermark == 3, "the HW without d")  # ... until that is written
    await partition.close()


async def test_a_follower_whose_join_is_refused_stops_holding_the_hw(tmp_path: Path) -> None:
    """A refusal writes nothing (a broker in controlled shutdown may not join): the follower stops counting at
    once, not after the lag time, so a rolling restart does not stall acknowledgements."""
    log = await Log.open_async(tmp_path, LogConfig(flush_policy=FlushPolicy.ALWAYS))
    stream = StreamRecord("s", "s", "", 1, 3, 0)
    record = PartitionRecord("s", 0, ("b", "c", "d"), "b", ("b", "c"))
    refused: list[tuple[str, ...]] = []

    async def alter_isr(_: PartitionRecord, isr: tuple[str, ...]) -> None:
        refused.append(isr)
        raise InvalidArgumentError("alter ISR refused (invalid-isr): it adds d, dead or shutting down")

    partition = Partition(stream, record, log, "b", min_isr=1, alter_isr=alter_isr, replica_lag_time_max=10.0)
    assert partition.replica_fetched("d", 0)
    await until(lambda: refused == [("b", "c", "d")], "the join asked and refused")
    await partition.append(_batch(2), Acks.LEADER, 5)
    assert partition.replica_fetched("c", 2)
    await until(lambda: partition.high_watermark == 2, "the HW without d")
    await partition.close()
