"""The leader epoch cache: Kafka's semantics (KIP-101, KIP-279), persistence, and worked failover scenarios."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.storage.checkpoint import CheckpointFile, seal
from tidelog.storage.epoch_cache import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEntry,
    LeaderEpochCache,
)
from tidelog.storage.errors import CheckpointError
from tidelog.storage.log import Log

from .logutil import make_batch, small_config

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
FILE = LEADER_EPOCH_CHECKPOINT_FILE


def cache_with(path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(path / LEADER_EPOCH_CHECKPOINT_FILE)
    for epoch, start in entries:
        cache.assign(epoch, start)
    return cache


def pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries]


def reopened(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return pairs(LeaderEpochCache(cache.path))


# --------------------------------------------------------------------------------------------- basics


def test_empty_cache(tmp_path: Path) -> None:
    cache = cache_with(tmp_path)
    assert cache.entries == ()
    assert cache.latest_epoch == UNDEFINED_EPOCH
    assert cache.latest_entry is None and cache.earliest_entry is None
    assert cache.end_offset_for_epoch(0, 10) == UNDEFINED
    assert cache.end_offset_for_epoch(UNDEFINED_EPOCH, 10) == UNDEFINED
    assert not cache.path.exists()  # nothing is written until something changes


def test_assign_appends_new_epochs_and_persists(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 10))
    assert pairs(cache) == [(1, 0), (3, 10)]
    assert cache.latest_epoch == 3
    assert cache.latest_entry == EpochEntry(3, 10)
    assert cache.earliest_entry == EpochEntry(1, 0)
    assert reopened(cache) == [(1, 0), (3, 10)]
    assert cache.path.read_text().splitlines()[:4] == ["tidelog leader-epoch 1", "2", "1 0", "3 10"]


def test_assign_is_a_cheap_no_op_while_the_latest_epoch_grows(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 5))
    before = cache.path.stat().st_mtime_ns
    for offset in (5, 6, 100):
        assert cache.assign(2, offset) is False
    assert pairs(cache) == [(1, 0), (2, 5)]
    assert cache.path.stat().st_mtime_ns == before


def test_assign_ignores_an_existing_epoch_with_the_same_start(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 5), (4, 9))
    assert cache.assign(2, 5) is False
    assert cache.assign(1, 0) is False
    assert pairs(cache) == [(1, 0), (2, 5), (4, 9)]


@pytest.mark.parametrize(("epoch", "start"), [(3, 12), (2, 6), (1, 20), (0, 0), (2, 4)])
def test_assign_refuses_an_epoch_older_than_the_latest(tmp_path: Path, epoch: int, start: int) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 5), (4, 9))
    with pytest.raises(ValueError, match="older than the latest"):
        cache.assign(epoch, start)
    assert pairs(cache) == [(1, 0), (2, 5), (4, 9)]


def test_assign_refuses_negative_values(tmp_path: Path) -> None:
    cache = cache_with(tmp_path)
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -1)


def test_a_new_epoch_below_existing_starts_removes_them(tmp_path: Path) -> None:
    """As when a follower truncated its log and now appends what the leader wrote in a newer epoch."""
    cache = cache_with(tmp_path, (1, 0), (2, 5), (3, 9))
    assert cache.assign(5, 7) is True
    assert pairs(cache) == [(1, 0), (2, 5), (5, 7)]
    assert cache.assign(6, 5) is True  # an entry starting exactly there goes too
    assert pairs(cache) == [(1, 0), (6, 5)]
    assert cache.assign(7, 0) is True
    assert pairs(cache) == [(7, 0)]
    assert reopened(cache) == [(7, 0)]


def test_the_latest_epoch_at_an_earlier_start_replaces_its_entry(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.assign(2, 6) is True
    assert pairs(cache) == [(1, 0), (2, 6)]
    assert cache.assign(2, 0) is True
    assert pairs(cache) == [(2, 0)]


# --------------------------------------------------------------------------------------------- end offsets


@pytest.mark.parametrize(
    ("epoch", "answer"),
    [
        (5, (5, 30)),  # the latest epoch: still being written, ends at the log end
        (3, (3, 20)),  # an older epoch: ends where the next one starts
        (1, (1, 10)),
        (4, (3, 20)),  # never seen here: the largest epoch below it, and where that one ended
        (2, (1, 10)),
        (0, UNDEFINED),  # below every entry (KIP-279)
        (6, UNDEFINED),  # above the latest
        (UNDEFINED_EPOCH, UNDEFINED),
    ],
)
def test_end_offset_for_epoch(tmp_path: Path, epoch: int, answer: tuple[int, int]) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    assert cache.end_offset_for_epoch(epoch, log_end_offset=30) == answer


def test_end_offset_of_the_only_epoch_is_the_log_end(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (0, 0))
    assert cache.end_offset_for_epoch(0, 7) == (0, 7)
    assert cache.end_offset_for_epoch(0, 7).end_offset == 7


# --------------------------------------------------------------------------------------------- truncation


@pytest.mark.parametrize(
    ("end_offset", "left"),
    [
        (30, [(1, 0), (3, 10), (5, 20)]),
        (21, [(1, 0), (3, 10), (5, 20)]),
        (20, [(1, 0), (3, 10)]),
        (15, [(1, 0), (3, 10)]),
        (10, [(1, 0)]),
        (1, [(1, 0)]),
        (0, []),
    ],
)
def test_truncate_from_end(tmp_path: Path, end_offset: int, left: list[tuple[int, int]]) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    cache.truncate_from_end(end_offset)
    assert pairs(cache) == left
    assert reopened(cache) == left


@pytest.mark.parametrize(
    ("start_offset", "left"),
    [
        (0, [(1, 0), (3, 10), (5, 20)]),
        (4, [(1, 4), (3, 10), (5, 20)]),  # the epoch holding the new start is kept, moved up to it
        (10, [(3, 10), (5, 20)]),
        (19, [(3, 19), (5, 20)]),
        (20, [(5, 20)]),
        (25, [(5, 25)]),
        (40, [(5, 40)]),
    ],
)
def test_truncate_from_start(tmp_path: Path, start_offset: int, left: list[tuple[int, int]]) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 10), (5, 20))
    cache.truncate_from_start(start_offset)
    assert pairs(cache) == left
    assert reopened(cache) == left


def test_truncate_from_start_before_the_first_entry_changes_nothing(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (2, 100), (3, 150))
    before = cache.path.stat().st_mtime_ns
    cache.truncate_from_start(50)
    assert pairs(cache) == [(2, 100), (3, 150)]
    assert cache.path.stat().st_mtime_ns == before


def test_clear(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 4))
    cache.clear()
    assert cache.entries == ()
    assert reopened(cache) == []


# --------------------------------------------------------------------------------------------- persistence


def test_a_failed_write_leaves_memory_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = cache_with(tmp_path, (1, 0))

    def failing_write(self: CheckpointFile, entries: object) -> None:
        raise OSError(28, "ENOSPC")

    monkeypatch.setattr(CheckpointFile, "write", failing_write)
    with pytest.raises(OSError):
        cache.assign(2, 5)
    with pytest.raises(OSError):
        cache.truncate_from_end(0)
    assert pairs(cache) == [(1, 0)]


@pytest.mark.parametrize(
    "content",
    [
        b"garbage",
        b"0\n1\n1 0\n",  # Kafka's format, not ours
    ],
)
def test_damaged_file_raises(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_bytes(content)
    with pytest.raises(CheckpointError):
        LeaderEpochCache(path)


@pytest.mark.parametrize(
    "entries",
    [
        [(1, 0), (1, 5)],  # epoch repeats
        [(2, 0), (1, 5)],  # epoch goes back
        [(1, 5), (2, 5)],  # start repeats
        [(1, 5), (2, 3)],  # start goes back
        [(-1, 0)],
    ],
)
def test_a_well_formed_file_with_non_monotonic_entries_raises(tmp_path: Path, entries: list[tuple[int, int]]) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    CheckpointFile(path, LeaderEpochCache.KIND, 2).write(entries)
    with pytest.raises(CheckpointError, match=r"increase strictly|negative"):
        LeaderEpochCache(path)


def test_repr(tmp_path: Path) -> None:
    assert repr(cache_with(tmp_path, (1, 0), (4, 7))) == "LeaderEpochCache([1@0, 4@7])"


# --------------------------------------------------------------------------------------------- model check

operations = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 12), st.integers(0, 60)),
        st.tuples(st.just("truncate_from_end"), st.integers(0, 60), st.just(0)),
        st.tuples(st.just("truncate_from_start"), st.integers(0, 60), st.just(0)),
    ),
    max_size=25,
)


def brute_force_end_offset(entries: list[tuple[int, int]], epoch: int, log_end: int) -> tuple[int, int]:
    """KIP-279's rule written the slow, obvious way."""
    if not entries or epoch == UNDEFINED_EPOCH:
        return UNDEFINED
    if epoch == entries[-1][0]:
        return (epoch, log_end)
    lower = [e for e in entries if e[0] <= epoch]
    higher = [e for e in entries if e[0] > epoch]
    if not lower or not higher:
        return UNDEFINED
    return (max(lower)[0], min(higher)[1])


@settings(max_examples=60, deadline=None)
@given(operations)
def test_invariants_under_random_operations(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]
) -> None:
    cache = LeaderEpochCache(tmp_path_factory.mktemp("epochs") / LEADER_EPOCH_CHECKPOINT_FILE)
    for name, a, b in ops:
        before = pairs(cache)
        if name == "assign":
            try:
                changed = cache.assign(a, b)
            except ValueError:
                assert before and a < before[-1][0]
                assert pairs(cache) == before
                continue
            assert changed == (pairs(cache) != before)
            if changed:
                assert pairs(cache)[-1] == (a, b)
                assert pairs(cache)[:-1] == [e for e in before if e[1] < b]
            else:  # the latest epoch growing, or an epoch already recorded at that start
                assert (before[-1][0] == a and before[-1][1] <= b) or (a, b) in before
        elif name == "truncate_from_end":
            cache.truncate_from_end(a)
            assert all(start < a for _, start in pairs(cache))
            assert pairs(cache) == [e for e in before if e[1] < a]
        else:
            cache.truncate_from_start(a)
            covering = [e for e in before if e[1] <= a]
            expected = [(covering[-1][0], a)] if covering else []
            assert pairs(cache) == expected + [e for e in before if e[1] > a]
        now = pairs(cache)
        assert all(x[0] < y[0] and x[1] < y[1] for x, y in itertools.pairwise(now))
        for epoch in range(-1, 14):
            assert tuple(cache.end_offset_for_epoch(epoch, 99)) == brute_force_end_offset(now, epoch, 99)
    assert reopened(cache) == pairs(cache)


# --------------------------------------------------------------------------------------------- failover scenarios


class Replica:
    """A replica reduced to what the epoch protocol sees: the epoch of each offset, and the cache."""

    def __init__(self, name: str, directory: Path) -> None:
        directory.mkdir()
        self.name = name
        self.log: list[int] = []  # log[offset] = leader epoch that wrote it
        self.cache = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT_FILE)

    @property
    def leo(self) -> int:
        return len(self.log)

    def append(self, epoch: int, count: int) -> None:
        """Write ``count`` records as leader of ``epoch`` (or copy them as a follower)."""
        self.cache.assign(epoch, self.leo)
        self.log.extend([epoch] * count)

    def truncate(self, offset: int) -> None:
        del self.log[offset:]
        self.cache.truncate_from_end(offset)

    def restart(self) -> None:
        """Lose memory, keep disk: the cache is re-read from its checkpoint file."""
        self.cache = LeaderEpochCache(self.cache.path)

    def divergence_point(self, leader: Replica) -> int:
        """The follower side of KIP-279: ask about our latest epoch, walk back until both sides know the epoch."""
        epoch = self.cache.latest_epoch
        while True:
            leader_epoch, leader_end = leader.cache.end_offset_for_epoch(epoch, leader.leo)
            assert leader_epoch != UNDEFINED_EPOCH, "these scenarios never fall back to the high watermark"
            own_epoch, own_end = self.cache.end_offset_for_epoch(leader_epoch, self.leo)
            if own_epoch == leader_epoch:
                return min(leader_end, own_end)
            epoch = own_epoch  # we never had the leader's epoch: ask about the largest one we have below it

    def become_follower_of(self, leader: Replica) -> int:
        point = self.divergence_point(leader)
        self.truncate(point)
        offset = self.leo
        while offset < leader.leo:  # fetch, one batch per epoch run
            epoch = leader.log[offset]
            end = offset
            while end < leader.leo and leader.log[end] == epoch:
                end += 1
            self.append(epoch, end - offset)
            offset = end
        return point


def assert_in_sync(follower: Replica, leader: Replica) -> None:
    assert follower.log == leader.log
    assert follower.cache.entries == leader.cache.entries


def test_kip101_follower_keeps_data_that_truncating_to_the_high_watermark_would_lose(tmp_path: Path) -> None:
    """KIP-101 scenario 1: B has m2 but its HW (1) does not say so yet; truncating to HW would lose m2."""
    a, b = Replica("A", tmp_path / "a"), Replica("B", tmp_path / "b")
    a.append(0, 2)
    b.append(0, 2)  # B fetched both; the HW it knows is still 1
    b.restart()
    assert b.become_follower_of(a) == 2  # nothing truncated
    a.log.clear()  # A dies; B becomes leader with m2 intact
    b.append(1, 1)
    assert b.log == [0, 0, 1]


def test_kip101_replicas_do_not_diverge_after_a_double_failure(tmp_path: Path) -> None:
    """KIP-101 scenario 2: B returns first and writes a different record at offset 1 in epoch 1."""
    a, b = Replica("A", tmp_path / "a"), Replica("B", tmp_path / "b")
    a.append(0, 2)  # m1, m2 at offsets 0, 1
    b.append(0, 1)  # B has m1 only; then power fails on both
    b.restart()
    b.append(1, 1)  # B leads epoch 1, writes m3 at offset 1
    a.restart()
    assert b.cache.end_offset_for_epoch(0, b.leo) == (0, 1)
    assert a.become_follower_of(b) == 1  # A drops m2 instead of keeping a different record at offset 1
    assert_in_sync(a, b)
    assert pairs(a.cache) == [(0, 0), (1, 1)]


def test_kip279_fast_leader_changes(tmp_path: Path) -> None:
    """KIP-279: the follower holds an epoch the new leader never saw, and its own older epoch ended earlier.

    A leads epoch 1 and writes 0..3; B has 0..1. B leads epoch 2 briefly, writes offset 2, and dies. A leads
    epoch 3 from offset 4. B asks about epoch 2; A never saw it and answers (1, 4): epoch 1 ended at 4 on A.
    B's epoch 1 ended at 2, so B truncates to min(4, 2) = 2 — answering only "4" (KIP-101) would have left B
    with its epoch-2 record at offset 2 where A has an epoch-1 record.
    """
    a, b = Replica("A", tmp_path / "a"), Replica("B", tmp_path / "b")
    a.append(1, 4)
    b.append(1, 2)
    b.append(2, 1)
    a.append(3, 1)
    assert pairs(a.cache) == [(1, 0), (3, 4)]
    assert pairs(b.cache) == [(1, 0), (2, 2)]
    assert a.cache.end_offset_for_epoch(2, a.leo) == (1, 4)
    assert b.become_follower_of(a) == 2
    assert_in_sync(b, a)


def test_kip279_walks_back_over_several_unknown_epochs(tmp_path: Path) -> None:
    """Each side holds epochs the other never saw; the follower asks again until both know the epoch."""
    a, b = Replica("A", tmp_path / "a"), Replica("B", tmp_path / "b")
    a.append(1, 6)
    a.append(3, 6)
    a.append(5, 3)  # A: 1@0, 3@6, 5@12, LEO 15
    b.append(1, 4)
    b.append(2, 5)
    b.append(4, 2)  # B: 1@0, 2@4, 4@9, LEO 11
    assert a.cache.end_offset_for_epoch(4, a.leo) == (3, 12)  # B asks about 4; A knows 3 at most
    assert b.cache.end_offset_for_epoch(3, b.leo) == (2, 9)  # B never had 3: it asks about 2 next
    assert a.cache.end_offset_for_epoch(2, a.leo) == (1, 6)  # both know epoch 1
    assert b.become_follower_of(a) == 4  # B's epoch 1 ended at 4, A's at 6
    assert_in_sync(b, a)


def test_follower_ahead_within_the_same_epoch_truncates_to_the_leader_end(tmp_path: Path) -> None:
    """A former leader with unreplicated records of its last epoch drops exactly those."""
    a, b = Replica("A", tmp_path / "a"), Replica("B", tmp_path / "b")
    a.append(1, 5)  # A led epoch 1, wrote 0..4; B copied 0..2
    b.append(1, 3)
    b.append(2, 2)  # B leads epoch 2 from offset 3
    assert a.become_follower_of(b) == 3
    assert_in_sync(a, b)


def test_prefix_deletion_then_failover(tmp_path: Path) -> None:
    """Retention moved the leader's log start past epoch 1's start; the answers are unchanged."""
    a, b = Replica("A", tmp_path / "a"), Replica("B", tmp_path / "b")
    a.append(1, 10)
    a.append(2, 10)
    b.append(1, 10)
    b.append(2, 5)
    a.cache.truncate_from_start(5)
    assert pairs(a.cache) == [(1, 5), (2, 10)]
    assert a.cache.end_offset_for_epoch(1, a.leo) == (1, 10)
    assert b.divergence_point(a) == 15  # B is simply behind: nothing to truncate


# --------------------------------------------------------------------------------------------- a damaged file


@pytest.mark.parametrize(
    "damage",
    [
        b"",  # empty
        b"tidelog leader-epoch 1\n3\n0 0\n",  # torn: entries and checksum missing
        b"\x00\xff garbage \x13\x37" * 10,
        b"tidelog leader-epoch 9\n0\ncrc32c 00000000\n",  # another format version
        b"tidelog leader-epoch 1\n2\n5 0\n2 10\n",  # sealed below: entries out of order
    ],
    ids=["empty", "torn", "garbage", "version", "out-of-order"],
)
async def test_a_damaged_file_is_rebuilt_from_the_batch_headers(
    tmp_path: Path, damage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    log = Log.open(tmp_path, small_config(segment_max_bytes=1000))
    for epoch, batches in ((1, 3), (4, 5), (7, 4)):  # three leaderships, over several segments
        for i in range(batches):
            await log.append(make_batch(2, size=60, tag=f"{epoch}-{i}"), epoch)
    expected = pairs(LeaderEpochCache(tmp_path / FILE))
    assert expected == [(1, 0), (4, 6), (7, 16)]
    await log.close()
    if damage.endswith(b"10\n"):
        damage = seal(damage)
    (tmp_path / FILE).write_bytes(damage)
    with caplog.at_level(logging.WARNING, logger="tidelog.storage.epoch_cache"):
        log = Log.open(tmp_path, small_config(segment_max_bytes=1000))  # opened, not refused
    assert FILE in caplog.text and "rebuilt from the batch headers" in caplog.text
    assert log.latest_epoch == 7
    assert log.end_offset_for_epoch(4) == (4, 16) and log.end_offset_for_epoch(2) == (1, 6)
    await log.close()
    assert pairs(LeaderEpochCache(tmp_path / FILE)) == expected  # written back, valid
