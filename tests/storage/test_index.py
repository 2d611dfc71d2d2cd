"""Sparse offset and time indexes: lookups against a sorted-map model, persistence, and damage detection."""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.storage.index import OFFSET_ENTRY, DamagedIndexError, OffsetIndex, TimeIndex

BASE = 1000


def _entries(draw_gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Strictly increasing (offset, position) pairs from positive gaps."""
    out = []
    offset, position = BASE, 0
    for doff, dpos in draw_gaps:
        offset += doff
        position += dpos
        out.append((offset, position))
    return out


gaps = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 5000)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(gaps, st.lists(st.integers(BASE - 5, BASE + 3000), max_size=30))
def test_offset_lookup_matches_sorted_map_model(
    tmp_path_factory: pytest.TempPathFactory, g: list, probes: list
) -> None:
    entries = _entries(g)
    index = OffsetIndex(tmp_path_factory.mktemp("i") / "x.index", BASE)
    for offset, position in entries:
        index.append(offset, position)
    keys = [o for o, _ in entries]
    for probe in probes:
        i = bisect_right(keys, probe) - 1
        expected = entries[i] if i >= 0 else (BASE, 0)
        assert index.lookup(probe) == expected


def test_offset_index_refuses_entries_that_do_not_increase(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", BASE)
    index.append(BASE + 5, 100)
    with pytest.raises(ValueError):
        index.append(BASE + 5, 200)
    with pytest.raises(ValueError):
        index.append(BASE + 6, 100)


def test_offset_index_persists_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path, BASE)
    for i in range(1, 11):
        index.append(BASE + i * 10, i * 4096)
    index.write_pending()
    assert path.stat().st_size == 10 * OFFSET_ENTRY.size
    index.append(BASE + 200, 99_000)
    index.write_pending(fsync=True)
    loaded = OffsetIndex.load(path, BASE, segment_size=100_000)
    assert list(loaded.keys) == list(index.keys) and list(loaded.values) == list(index.values)
    assert loaded.lookup(BASE + 55) == (BASE + 50, 5 * 4096)


def test_truncate_drops_entries_in_memory_and_file(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path, BASE)
    for i in range(1, 11):
        index.append(BASE + i * 10, i * 100)
    index.write_pending()
    index.truncate_to(BASE + 50)
    assert len(index) == 4 and index.last() == (BASE + 40, 400)
    assert path.stat().st_size == 4 * OFFSET_ENTRY.size
    index.append(BASE + 45, 450)  # appending continues after a truncation
    index.write_pending()
    assert len(OffsetIndex.load(path, BASE, 1000)) == 5


def test_write_atomic_replaces_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    path.write_bytes(b"garbage!" * 3)
    index = OffsetIndex(path, BASE)
    index.append(BASE + 1, 10)
    index.write_atomic()
    assert OffsetIndex.load(path, BASE, 100).entry(0) == (1, 10)
    assert not (tmp_path / "a.index.tmp").exists()


@pytest.mark.parametrize(
    ("content", "size", "reason"),
    [
        (None, 100, "missing"),
        (b"\x00" * 7, 100, "whole number"),
        (OFFSET_ENTRY.pack(5, 10) + OFFSET_ENTRY.pack(4, 20), 100, "does not increase"),
        (OFFSET_ENTRY.pack(5, 10) + OFFSET_ENTRY.pack(6, 10), 100, "does not increase"),
        (OFFSET_ENTRY.pack(5, 10) + OFFSET_ENTRY.pack(6, 200), 100, "past the segment"),
    ],
)
def test_damaged_offset_index_is_detected(tmp_path: Path, content: bytes | None, size: int, reason: str) -> None:
    path = tmp_path / "a.index"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DamagedIndexError, match=reason):
        OffsetIndex.load(path, BASE, size)


def test_time_index_keeps_running_maximum_only(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex", BASE)
    index.maybe_append(100, BASE + 0)
    index.maybe_append(90, BASE + 5)  # not a new maximum: ignored
    index.maybe_append(100, BASE + 6)  # equal: ignored
    index.maybe_append(150, BASE + 10)
    assert list(index.keys) == [100, 150] and list(index.values) == [0, 10]
    assert index.last_timestamp() == 150


def test_time_lookup_starts_before_first_batch_that_could_match(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex", BASE)
    for ts, off in [(100, 0), (200, 10), (300, 20)]:
        index.maybe_append(ts, BASE + off)
    assert index.lookup(50) == BASE  # nothing indexed before: scan from the segment start
    assert index.lookup(100) == BASE
    assert index.lookup(150) == BASE + 0  # batches up to the (100, 0) entry are all below 150
    assert index.lookup(250) == BASE + 10
    assert index.lookup(10_000) == BASE + 20


def test_time_index_roundtrip_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "a.timeindex"
    index = TimeIndex(path, BASE)
    index.maybe_append(-5, BASE)
    index.maybe_append(7, BASE + 3)
    index.write_pending()
    loaded = TimeIndex.load(path, BASE)
    assert list(loaded.keys) == [-5, 7] and list(loaded.values) == [0, 3]
    raw = bytearray(path.read_bytes())
    raw[12:20] = (-10).to_bytes(8, "big", signed=True)  # second timestamp below the first
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedIndexError):
        TimeIndex.load(path, BASE)


def test_time_index_truncate(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex", BASE)
    for ts, off in [(100, 0), (200, 10), (300, 20)]:
        index.maybe_append(ts, BASE + off)
    index.truncate_to(BASE + 10)
    assert list(index.keys) == [100]
