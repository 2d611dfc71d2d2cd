"""Producer state (KIP-98 idempotence): each verdict alone, reservations, truncation, expiry, snapshots, the log
scan, and a stateful comparison against a model that derives everything from the list of stored batches."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.clock import ManualClock
from tidelog.protocol.records import CONTROL_FLAG, BatchHeader, NewRecord, build_batch
from tidelog.replication.idempotence.producer_snapshot import (
    ProducerSnapshots,
    decode_snapshot,
    encode_snapshot,
    iter_log_headers,
    load_producer_state,
    read_snapshot,
    write_snapshot,
)
from tidelog.replication.idempotence.producer_state import (
    IN_FLIGHT,
    MAX_SEQUENCE,
    NEW,
    UNKNOWN_PRODUCER,
    WINDOW,
    BatchMetadata,
    Duplicate,
    Fenced,
    Invalid,
    OutOfOrder,
    ProducerEntry,
    ProducerStateTable,
    Verdict,
    last_sequence,
    next_sequence,
)
from tidelog.storage.checkpoint import encode_checkpoint
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.errors import CheckpointError
from tidelog.storage.log import Log

T0 = 1_700_000_000_000_000_000
HOUR_NS = 3_600 * 1_000_000_000


def hdr(
    pid: int, epoch: int, seq: int, count: int = 1, offset: int = 0, *, ts: int = T0, attributes: int = 0
) -> BatchHeader:
    """A batch header as the log stores it (only the fields producer state reads matter)."""
    return BatchHeader(offset, 100, 0, 1, 0, attributes, count - 1, ts, ts, pid, epoch, seq, count)


class Writer:
    """A partition leader's append path over a table and an in-memory log: check, then write and record."""

    def __init__(self, table: ProducerStateTable | None = None) -> None:
        self.table = table if table is not None else ProducerStateTable(clock=ManualClock(T0))
        self.log: list[BatchHeader] = []
        self.end = 0

    def send(self, pid: int, epoch: int, seq: int, count: int = 1, *, ts: int = T0) -> Verdict:
        header = hdr(pid, epoch, seq, count, ts=ts)
        verdict = self.table.reserve(header)
        if verdict is NEW:
            stored = header._replace(base_offset=self.end)
            self.log.append(stored)
            self.end = stored.next_offset
            self.table.record(stored)
        return verdict


# ------------------------------------------------------------------------------------------------- sequences


def test_sequences_wrap_from_int32_max_to_zero() -> None:
    assert next_sequence(5) == 6
    assert next_sequence(MAX_SEQUENCE) == 0
    assert last_sequence(MAX_SEQUENCE - 1, 2) == 0
    assert last_sequence(MAX_SEQUENCE, 0) == MAX_SEQUENCE


def test_batches_without_a_producer_id_and_control_batches_are_always_new() -> None:
    w = Writer()
    for _ in range(3):
        assert w.send(-1, -1, -1, 2) is NEW
    control = hdr(7, 0, 5, attributes=CONTROL_FLAG)
    assert w.table.check(control) is NEW
    w.table.record(control)
    assert len(w.table) == 0


def test_a_new_producer_starts_at_sequence_zero() -> None:
    w = Writer()
    assert w.table.check(hdr(1, 0, 3)) is UNKNOWN_PRODUCER
    assert w.send(1, 0, 0, 3) is NEW
    assert w.send(1, 0, 3, 2) is NEW
    entry = w.table.entry(1)
    assert entry is not None and entry.last_sequence == 4 and entry.last_offset == 4


def test_a_gap_or_an_overlap_is_out_of_order_with_the_expected_sequence() -> None:
    w = Writer()
    w.send(1, 0, 0, 3)
    assert w.send(1, 0, 4) == OutOfOrder(3)
    assert w.send(1, 0, 2, 2) == OutOfOrder(3)  # overlaps the written batch without being it
    assert w.end == 3


def test_a_retry_in_the_window_returns_the_original_offsets_and_writes_nothing() -> None:
    w = Writer()
    w.send(9, 0, 0)  # another producer's batch first, so offsets and sequences differ
    for i in range(WINDOW):
        assert w.send(1, 0, 2 * i, 2) is NEW
    end = w.end
    for i in range(WINDOW):
        assert w.send(1, 0, 2 * i, 2) == Duplicate(1 + 2 * i, 2 + 2 * i)
    assert w.end == end
    assert w.send(1, 0, 2 * WINDOW, 2) is NEW
    assert w.send(1, 0, 0, 2) == OutOfOrder(2 * WINDOW + 2)  # left the window: refused, never rewritten
    assert w.send(1, 0, 2, 2) == Duplicate(3, 4)


def test_sequences_continue_across_the_wrap() -> None:
    table = ProducerStateTable(clock=ManualClock(T0))
    table.record(hdr(1, 0, MAX_SEQUENCE - 1, 2, offset=0))  # recorded as a follower: MAX-1, MAX
    assert table.check(hdr(1, 0, 0)) is NEW
    assert table.check(hdr(1, 0, MAX_SEQUENCE)) == OutOfOrder(0)
    table.record(hdr(2, 0, MAX_SEQUENCE - 1, 3, offset=2))  # straddles the wrap: MAX-1, MAX, 0
    assert table.check(hdr(2, 0, 1)) is NEW
    assert table.check(hdr(2, 0, MAX_SEQUENCE - 1, 3)) == Duplicate(2, 4)
    assert table.check(hdr(2, 0, MAX_SEQUENCE - 1, 2)) == OutOfOrder(1)


def test_an_older_epoch_is_fenced_and_a_new_epoch_starts_at_zero() -> None:
    w = Writer()
    w.send(1, 3, 0, 2)
    assert w.send(1, 2, 2) == Fenced(3)
    assert w.send(1, 4, 2) == OutOfOrder(0)
    assert w.send(1, 4, 0) is NEW
    assert w.send(1, 3, 0, 2) == Fenced(4)  # a retry of the old epoch's batch, from the fenced instance
    entry = w.table.entry(1)
    assert entry is not None and entry.epoch == 4 and len(entry.batches) == 1 and not entry.complete


@pytest.mark.parametrize(
    ("header", "word"),
    [
        (hdr(-2, 0, 0), "producer id"),
        (hdr(1, -1, 0), "epoch"),
        (hdr(1, 40000, 0), "epoch"),
        (hdr(1, 0, -1), "sequence"),
    ],
)
def test_impossible_producer_fields_are_invalid_and_never_recorded(header: BatchHeader, word: str) -> None:
    table = ProducerStateTable()
    verdict = table.check(header)
    assert isinstance(verdict, Invalid) and word in verdict.reason
    table.record(header)
    assert len(table) == 0


# ------------------------------------------------------------------------------------------------- reservations


def test_pipelined_batches_are_checked_against_those_in_flight() -> None:
    table = ProducerStateTable()
    first, second = hdr(1, 0, 0, 3), hdr(1, 0, 3, 3)
    assert table.reserve(first) is NEW
    assert table.reserve(second) is NEW
    assert table.check(first) is IN_FLIGHT
    assert table.check(hdr(1, 0, 7)) == OutOfOrder(6)
    assert table.check(hdr(1, 1, 0)) is NEW  # an epoch bump may overtake
    table.record(second._replace(base_offset=3))  # finished first
    table.record(first._replace(base_offset=0))
    assert not table.has_reservations
    entry = table.entry(1)
    assert entry is not None and [b.base_offset for b in entry.batches] == [0, 3]
    assert table.check(first) == Duplicate(0, 2)


def test_a_released_reservation_is_expected_again() -> None:
    table = ProducerStateTable()
    table.record(hdr(1, 0, 0, 2))
    batch = hdr(1, 0, 2)
    assert table.reserve(batch) is NEW
    assert table.check(hdr(1, 0, 3)) is NEW
    assert table.release(batch)
    assert not table.release(batch)
    assert table.check(hdr(1, 0, 3)) == OutOfOrder(2)
    assert table.reserve(batch) is NEW
    table.release_all()
    assert not table.has_reservations and table.check(batch) is NEW


def test_reserve_all_takes_every_batch_or_none() -> None:
    table = ProducerStateTable()
    assert table.reserve_all([hdr(1, 0, 0, 2), hdr(2, 0, 0), hdr(1, 0, 2)]) is NEW
    table.record_appended([hdr(1, 0, 0, 2), hdr(2, 0, 0), hdr(1, 0, 2)], 10)
    assert not table.has_reservations
    assert table.check(hdr(1, 0, 2)) == Duplicate(13, 13)
    assert table.reserve_all([hdr(1, 0, 3), hdr(3, 0, 5)]) is UNKNOWN_PRODUCER
    assert not table.has_reservations
    assert table.reserve_all([hdr(1, 0, 0, 2), hdr(1, 0, 2)]) == Duplicate(10, 13)
    mixed = table.reserve_all([hdr(1, 0, 2), hdr(1, 0, 3)])
    assert isinstance(mixed, Invalid) and not table.has_reservations


def test_out_of_order_recording_equals_recording_in_offset_order() -> None:
    batches = [hdr(1, 0, 2 * i, 2, offset=2 * i, ts=T0 + i) for i in range(WINDOW + 2)]
    batches.insert(3, hdr(1, 1, 0, 1, offset=100))  # never mind: offsets order the log, not the list
    in_order = ProducerStateTable()
    in_order.rebuild(sorted(batches, key=lambda h: h.base_offset))
    for permutation in (batches[::-1], batches[1::2] + batches[::2]):
        table = ProducerStateTable()
        table.rebuild(permutation)
        assert table.entries() == in_order.entries()


# ------------------------------------------------------------------------------------------------- truncation


def test_truncation_of_a_complete_producer_is_exact() -> None:
    w = Writer()
    w.send(1, 0, 0, 2)
    w.send(2, 0, 0)
    w.send(1, 0, 2, 2)
    assert w.table.truncate_to(3)
    assert w.table.entry(1) == ProducerEntry(1, 0, (BatchMetadata(0, 1, 0, 1, T0),), True)
    assert w.table.entry(2) is not None
    assert w.table.truncate_to(0)
    assert len(w.table) == 0


def test_truncation_inside_a_batch_drops_the_whole_batch() -> None:
    w = Writer()
    w.send(1, 0, 0, 4)
    assert w.table.truncate_to(2)
    assert w.table.entry(1) is None


def test_truncation_past_the_window_asks_for_a_rebuild() -> None:
    w = Writer()
    for i in range(WINDOW + 1):
        w.send(1, 0, i)
    w.send(2, 0, 0)
    assert w.table.truncate_to(w.end)
    assert not w.table.truncate_to(w.end - 2)
    rebuilt = ProducerStateTable()
    rebuilt.rebuild(h for h in w.log if h.last_offset < w.end - 2)
    short, full = w.table.entry(1), rebuilt.entry(1)
    assert short is not None and full is not None
    assert len(short.batches) == WINDOW - 1 and len(full.batches) == WINDOW  # why the rebuild was asked for
    assert short.last_sequence == full.last_sequence == WINDOW - 1
    assert rebuilt.check(hdr(1, 0, 0)) == Duplicate(0, 0)


# ------------------------------------------------------------------------------------------------- expiry


def test_idle_producers_expire_into_tombstones_that_let_them_resume() -> None:
    clock = ManualClock(T0)
    w = Writer(ProducerStateTable(clock=clock, producer_expiry_ms=3_600_000))
    w.send(1, 2, 0, 5)
    w.send(2, 0, 0)
    clock.advance(ns=HOUR_NS // 2)
    w.send(2, 0, 1, ts=clock.now_ns())
    clock.advance(ns=HOUR_NS // 2)
    assert w.table.remove_expired() == 1
    assert w.table.entry(1) is None and w.table.entry(2) is not None
    assert w.table.check(hdr(1, 2, 17)) is NEW  # its state expired: any sequence of its epoch
    assert w.table.check(hdr(1, 1, 0)) == Fenced(2)
    assert w.table.check(hdr(1, 3, 4)) == OutOfOrder(0)
    assert w.send(1, 2, 17, ts=clock.now_ns()) is NEW
    assert not w.table.expired()
    assert w.table.check(hdr(1, 2, 19)) == OutOfOrder(18)


def test_tombstones_go_after_another_expiry_period_and_reservations_keep_a_producer() -> None:
    clock = ManualClock(T0)
    table = ProducerStateTable(clock=clock, producer_expiry_ms=1000)
    table.record(hdr(1, 0, 0))
    table.record(hdr(2, 0, 0, offset=1))
    table.reserve(hdr(2, 0, 1))
    clock.advance(1.0)
    assert table.remove_expired() == 1 and set(table.expired()) == {1} and table.entry(2) is not None
    clock.advance(1.0)
    table.remove_expired()
    assert not table.expired()
    assert table.check(hdr(1, 0, 5)) is UNKNOWN_PRODUCER


def test_expiry_must_be_positive() -> None:
    with pytest.raises(ValueError, match="producer_expiry_ms"):
        ProducerStateTable(producer_expiry_ms=0)


# ------------------------------------------------------------------------------------------------- snapshots


def busy_table() -> ProducerStateTable:
    clock = ManualClock(T0)
    w = Writer(ProducerStateTable(clock=clock, producer_expiry_ms=1000))
    w.send(5, 0, 0)
    clock.advance(2.0)
    for i in range(WINDOW + 2):
        w.send(1, 3, 2 * i, 2, ts=clock.now_ns() + i)
    w.send(2, 0, 0, 4, ts=clock.now_ns())
    w.table.remove_expired()
    assert w.table.expired() and w.table.entries()
    return w.table


def test_snapshot_round_trip(tmp_path: Path) -> None:
    table = busy_table()
    write_snapshot(tmp_path / "s", table, 40)
    loaded, offset = read_snapshot(tmp_path / "s", clock=table.clock, producer_expiry_ms=1000)
    assert offset == 40
    assert loaded.entries() == table.entries() and loaded.expired() == table.expired()
    assert loaded.producer_expiry_ms == 1000
    assert (tmp_path / "s").read_bytes().startswith(b"tidelog producer-state 1\n")


def test_a_damaged_snapshot_is_refused_with_the_reason(tmp_path: Path) -> None:
    data = bytearray(encode_snapshot(busy_table(), 40))
    data[data.index(b"\n2 ") + 5] ^= 0x01
    (tmp_path / "s").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"/s: checksum mismatch"):
        read_snapshot(tmp_path / "s")
    with pytest.raises(CheckpointError, match="'high-watermark' checkpoint, expected 'producer-state'"):
        decode_snapshot(encode_checkpoint("high-watermark", 1, [(4,)]))


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([[2, 1, 0, 0, 0, 0, 0, 0]], "outside its producer"),
        ([[1, 1, 0, 1, 0, 0, 0, 0]], "has 0 batches"),
        ([[1, 1, 0, 1, 0, 0, 0, 0], [2, 1, 0, 0, 0, 0, 50, 0]], "impossible below 40"),
        ([[1, 1, 0, 1, 0, 0, 0, 0], [2, 1, 0, -1, 0, 0, 0, 0]], "sequence out of range"),
        ([[1, 1, 0, 1, 0, 0, 0, 0], [2, 1, 0, 0, 0, 5, 5, 0], [2, 1, 0, 1, 1, 3, 3, 0]], "out of offset order"),
        ([[1, 1, 0, 1, 0, 0, 0, 0], [2, 1, 0, 0, 0, 0, 0, 0], [3, 1, 0, 0, 0, 0, 0, 0]], "appears twice"),
        ([[1, 1, 0, 2, 0, 0, 0, 0]], "malformed producer row"),
        ([[7, 1, 0, 0, 0, 0, 0, 0]], "unknown row type"),
        ([[1, -4, 0, 1, 0, 0, 0, 0]], "out of range"),
    ],
)
def test_a_snapshot_that_breaks_an_invariant_is_refused(rows: list[list[int]], reason: str) -> None:
    data = encode_checkpoint("producer-state", 8, [[0, 40, 0, 0, 0, 0, 0, 0], *rows])
    with pytest.raises(CheckpointError, match=reason):
        decode_snapshot(data)
    with pytest.raises(CheckpointError, match="snapshot offset"):
        decode_snapshot(encode_checkpoint("producer-state", 8, rows))


def test_the_snapshot_directory_keeps_serves_and_skips(tmp_path: Path) -> None:
    snapshots = ProducerSnapshots(tmp_path)
    table = busy_table()
    for offset in (20, 30, 40):
        snapshots.write(table, offset)
    (tmp_path / "unrelated.txt").write_text("x")
    assert snapshots.offsets() == [20, 30, 40]
    found = snapshots.latest(35)
    assert found is not None and found[1] == 30
    snapshots.path_for(30).write_bytes(b"garbage")
    found = snapshots.latest(35)
    assert found is not None and found[1] == 20
    assert snapshots.delete_above(30) == [40]
    assert snapshots.retain(1) == [20]
    assert snapshots.offsets() == [30]
    assert snapshots.latest() is None


def test_a_snapshot_below_a_recorded_batch_is_not_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not below the snapshot offset 10"):
        write_snapshot(tmp_path / "s", busy_table(), 10)
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------------- the log


async def produced_log(directory: Path) -> tuple[Log, list[tuple[int, int, int, int]]]:
    """A real log holding idempotent batches of two producers and a plain one; (pid, epoch, seq, count)."""
    log = Log.open(directory, LogConfig(segment_max_bytes=2048, flush_policy=FlushPolicy.NEVER))
    sent = [(1, 0, 0, 3), (2, 0, 0, 1), (-1, -1, -1, 2), (1, 0, 3, 2), (2, 1, 0, 4)]
    sent += [(1, 0, 5 + i, 1) for i in range(8)]
    for pid, epoch, seq, count in sent:
        records = [NewRecord(b"x" * 100) for _ in range(count)]
        batch = build_batch(records, timestamp=T0, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        await log.append(batch, leader_epoch=0)
    return log, sent


async def test_log_headers_are_read_without_records_and_from_any_offset(tmp_path: Path) -> None:
    log, sent = await produced_log(tmp_path)
    headers = list(iter_log_headers(log, 0, chunk_bytes=300))
    assert [(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count) for h in headers] == sent
    assert [h.base_offset for h in iter_log_headers(log, 5, 12)] == [4, 6, 8]  # from the batch holding 5
    assert [h.base_offset for h in iter_log_headers(log, 5, 11)] == [4, 6]  # wholly below the stop
    assert list(iter_log_headers(log, log.end_offset)) == []
    await log.close()


async def test_load_uses_the_newest_snapshot_then_the_log_after_it(tmp_path: Path) -> None:
    log, _ = await produced_log(tmp_path)
    clock = ManualClock(T0)
    full = ProducerStateTable()
    full.rebuild(iter_log_headers(log, 0))
    snapshots = ProducerSnapshots(tmp_path)
    partial = ProducerStateTable()
    partial.rebuild(iter_log_headers(log, 0, 10))
    snapshots.write(partial, 10)
    snapshots.write(full, 999)  # a snapshot of a tail the log no longer has
    loaded = load_producer_state(log, snapshots, clock=clock)
    assert loaded.entries() == full.entries()
    assert snapshots.offsets() == [10]
    await log.truncate_to(12)
    expected = ProducerStateTable()
    expected.rebuild(iter_log_headers(log, 0))
    assert load_producer_state(log, snapshots, clock=clock).entries() == expected.entries()
    assert load_producer_state(log, None, clock=clock).entries() == expected.entries()
    clock.advance(24 * 3600.0)  # a day after the batches' timestamps: every producer has expired
    assert len(load_producer_state(log, snapshots, clock=clock)) == 0
    await log.close()


# ------------------------------------------------------------------------------------------------- the model


def model_entries(log: list[BatchHeader]) -> dict[int, ProducerEntry]:
    """Producer state stated directly from the stored batches: per producer, the newest run of its latest
    epoch, the last WINDOW of them; complete when that is every batch it has."""
    out = {}
    for pid in {h.producer_id for h in log if h.producer_id >= 0}:
        mine = [h for h in log if h.producer_id == pid]
        epoch = mine[-1].producer_epoch
        start = len(mine)
        while start > 0 and mine[start - 1].producer_epoch == epoch:
            start -= 1
        tail = mine[start:][-WINDOW:]
        batches = tuple(
            BatchMetadata(
                h.base_sequence,
                last_sequence(h.base_sequence, h.last_offset_delta),
                h.base_offset,
                h.last_offset,
                h.max_timestamp,
            )
            for h in tail
        )
        out[pid] = ProducerEntry(pid, epoch, batches, len(tail) == len(mine))
    return out


def model_verdict(log: list[BatchHeader], header: BatchHeader) -> Verdict:
    entry = model_entries(log).get(header.producer_id)
    first = header.base_sequence
    if entry is None:
        return NEW if first == 0 else UNKNOWN_PRODUCER
    if header.producer_epoch < entry.epoch:
        return Fenced(entry.epoch)
    if header.producer_epoch > entry.epoch:
        return NEW if first == 0 else OutOfOrder(0)
    last = last_sequence(first, header.last_offset_delta)
    for b in entry.batches:
        if (b.first_sequence, b.last_sequence) == (first, last):
            return Duplicate(b.base_offset, b.last_offset)
    expected = next_sequence(entry.last_sequence)
    return NEW if first == expected else OutOfOrder(expected)


PIDS = st.sampled_from([1, 2, 3])
SEQ_CHOICES = st.sampled_from(["next", "next", "next", "retry", "gap", "zero", "back"])


class ProducerStateMachine(RuleBasedStateMachine):
    """A leader's table checked against :func:`model_verdict` on every send, with followers' records,
    truncation (exact, or rebuilt from the newest valid snapshot), snapshots and restarts."""

    def __init__(self) -> None:
        super().__init__()
        self.table = ProducerStateTable(clock=ManualClock(T0))
        self.log: list[BatchHeader] = []
        self.end = 0
        self.acked: dict[tuple[int, int, int, int], tuple[int, int]] = {}  # (pid, epoch, first, last) → offsets
        self.snapshots: list[tuple[int, bytes]] = []  # (offset, encoded), ascending offsets
        self.directory = Path(tempfile.mkdtemp(prefix="tidelog-producer-state-"))

    def _write(self, header: BatchHeader) -> BatchHeader:
        stored = header._replace(base_offset=self.end)
        self.log.append(stored)
        self.end = stored.next_offset
        self.table.record(stored)
        return stored

    @rule(pid=PIDS, choice=SEQ_CHOICES, count=st.integers(1, 3), bump=st.sampled_from([0, 0, 0, 0, 1, -1]))
    def send(self, pid: int, choice: str, count: int, bump: int) -> None:
        entry = model_entries(self.log).get(pid)
        epoch = max(0, (entry.epoch if entry else 0) + bump)
        expected = next_sequence(entry.last_sequence) if entry and bump == 0 else 0
        retryable = [k for k in self.acked if k[0] == pid]
        if choice == "retry" and retryable:
            _, epoch, seq, last = retryable[len(retryable) // 2]
            count = (last - seq) % (MAX_SEQUENCE + 1) + 1
        else:
            seq = {"next": expected, "gap": expected + 2, "zero": 0, "back": max(0, expected - 1)}.get(choice, expected)
        header = hdr(pid, epoch, seq % (MAX_SEQUENCE + 1), count, ts=T0 + self.end)
        expected_verdict = model_verdict(self.log, header)
        verdict = self.table.reserve(header)
        assert verdict == expected_verdict
        key = (pid, header.producer_epoch, header.base_sequence, last_sequence(header.base_sequence, count - 1))
        if verdict is NEW:
            assert key not in self.acked  # never written twice
            stored = self._write(header)
            self.acked[key] = (stored.base_offset, stored.last_offset)
        elif isinstance(verdict, Duplicate):
            assert self.acked[key] == (verdict.base_offset, verdict.last_offset)  # the original offsets

    @rule(pid=PIDS, batches=st.integers(WINDOW - 1, WINDOW + 2))
    def burst(self, pid: int, batches: int) -> None:
        """A producer's batches in sequence, enough to push its first ones out of the window."""
        for _ in range(batches):
            self.send(pid, "next", 1, 0)

    @rule(pid=PIDS, counts=st.tuples(st.integers(1, 3), st.integers(1, 3)))
    def pipelined(self, pid: int, counts: tuple[int, int]) -> None:
        """Two batches in flight at once, written in order, recorded as their appends finish: last first."""
        entry = model_entries(self.log).get(pid)
        epoch, seq = (entry.epoch, next_sequence(entry.last_sequence)) if entry else (0, 0)
        first = hdr(pid, epoch, seq, counts[0], ts=T0 + self.end)
        second = hdr(pid, epoch, last_sequence(seq, counts[0]), counts[1], ts=T0 + self.end)
        assert self.table.reserve(first) is NEW and self.table.reserve(second) is NEW
        assert self.table.check(first) is IN_FLIGHT and self.table.check(second) is IN_FLIGHT
        placed = []
        for header in (first, second):
            placed.append(header._replace(base_offset=self.end))
            self.log.append(placed[-1])
            self.end = placed[-1].next_offset
        for header in reversed(placed):
            self.table.record(header)
            key = (pid, epoch, header.base_sequence, last_sequence(header.base_sequence, header.last_offset_delta))
            self.acked[key] = (header.base_offset, header.last_offset)
        assert not self.table.has_reservations

    @rule(pid=PIDS, seq=st.sampled_from([MAX_SEQUENCE - 2, MAX_SEQUENCE, 1000]), count=st.integers(1, 3))
    def replicate(self, pid: int, seq: int, count: int) -> None:
        """A follower records whatever the leader wrote, gaps and wraps included (here: sequence jumps)."""
        entry = model_entries(self.log).get(pid)
        epoch = entry.epoch + 1 if entry else 0
        stored = self._write(hdr(pid, epoch, seq, count, ts=T0 + self.end))
        self.acked[(pid, epoch, seq, last_sequence(seq, count - 1))] = (stored.base_offset, stored.last_offset)

    @rule()
    def plain(self) -> None:
        self._write(hdr(-1, -1, -1, 2))

    @precondition(lambda self: self.log)
    @rule(keep=st.integers(0, 30))
    def truncate(self, keep: int) -> None:
        keep = min(keep, len(self.log) - 1)
        offset = self.log[keep].base_offset
        self.log = self.log[:keep]
        self.end = offset
        self.acked = {k: v for k, v in self.acked.items() if v[0] < offset}
        self.snapshots = [(o, s) for o, s in self.snapshots if o <= offset]
        if not self.table.truncate_to(offset):
            self._restart()

    @rule()
    def take_snapshot(self) -> None:
        self.snapshots.append((self.end, encode_snapshot(self.table, self.end)))

    def _restart(self) -> None:
        if self.snapshots:
            offset, data = self.snapshots[-1]
            self.table, stored = decode_snapshot(data, clock=self.table.clock)
            assert stored == offset
        else:
            self.table, offset = ProducerStateTable(clock=self.table.clock), 0
        self.table.rebuild(h for h in self.log if h.base_offset >= offset)

    @rule()
    def restart(self) -> None:
        self._restart()

    @rule()
    def snapshot_file_round_trip(self) -> None:
        path = self.directory / "snapshot"
        write_snapshot(path, self.table, self.end)
        loaded, offset = read_snapshot(path)
        assert offset == self.end and loaded.entries() == self.table.entries()

    @invariant()
    def matches_the_model(self) -> None:
        assert self.table.entries() == model_entries(self.log)

    def teardown(self) -> None:
        for path in self.directory.iterdir():
            path.unlink()
        self.directory.rmdir()


ProducerStateMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestProducerState = ProducerStateMachine.TestCase


@pytest.mark.parametrize(
    "damage", [b"", b"tidelog producer-state 1\n3\n", b"\x00\xff" * 40, b"tidelog producer-state 7\n"]
)
async def test_a_damaged_snapshot_on_restart_is_skipped_and_the_state_rebuilt_from_the_log(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    log, _ = await produced_log(tmp_path)
    expected = ProducerStateTable()
    expected.rebuild(iter_log_headers(log, 0))
    snapshots = ProducerSnapshots(tmp_path)
    older = ProducerStateTable()
    older.rebuild(iter_log_headers(log, 0, 10))
    snapshots.write(older, 10)
    snapshots.write(expected, log.end_offset)
    await log.close()
    snapshots.path_for(log.end_offset).write_bytes(damage)
    log = Log.open(tmp_path, LogConfig(segment_max_bytes=2048, flush_policy=FlushPolicy.NEVER))  # a restart
    with caplog.at_level(logging.WARNING):
        loaded = load_producer_state(log, snapshots, clock=ManualClock(T0))
    assert loaded.entries() == expected.entries()  # the older snapshot plus the log after it
    assert "skipping producer snapshot" in caplog.text and snapshots.path_for(log.end_offset).name in caplog.text
    snapshots.path_for(10).write_bytes(damage)  # every snapshot damaged: a full scan
    assert load_producer_state(log, snapshots, clock=ManualClock(T0)).entries() == expected.entries()
    await log.close()
