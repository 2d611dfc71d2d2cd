"""Segment: appending placed batches, finding and reading whole batches, truncation, and rebuilding state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidelog.protocol.records import iter_batches
from tidelog.storage.errors import CorruptSegmentError
from tidelog.storage.segment import NO_TIMESTAMP, Placed, Segment

from .logutil import BASE_TS, make_batch, stored

BASE = 100


def _fill(segment: Segment, batches: int, *, count: int = 3, size: int = 40) -> list[bytes]:
    """Append ``batches`` batches one by one; returns each batch as stored."""
    out = []
    for i in range(batches):
        offset = segment.next_offset
        data = stored(make_batch(count, size=size, tag=f"b{i}", timestamp=BASE_TS + i * 10), offset, 1)
        segment.append([data], [Placed(offset, offset + count, len(data), BASE_TS + i * 10)], now_ns=BASE_TS)
        out.append(data)
    return out


@pytest.fixture
def segment(tmp_path: Path) -> Segment:
    seg = Segment.create(tmp_path, BASE, index_interval_bytes=300)
    yield seg
    seg.close()


def test_append_tracks_size_offsets_and_timestamps(segment: Segment) -> None:
    batches = _fill(segment, 10)
    assert segment.size == sum(map(len, batches)) == os.path.getsize(segment.path)
    assert segment.next_offset == BASE + 30
    assert segment.max_timestamp == BASE_TS + 90
    assert segment.first_append_ns == BASE_TS
    assert 0 < len(segment.offset_index) < 10  # sparse: about one entry per 300 bytes of log


def test_find_returns_the_batch_containing_an_offset(segment: Segment) -> None:
    batches = _fill(segment, 20)
    position = 0
    for i, data in enumerate(batches):
        for offset in range(BASE + 3 * i, BASE + 3 * i + 3):
            found = segment.find(offset)
            assert found is not None
            assert found[0] == position and found[1].base_offset == BASE + 3 * i
        position += len(data)
    assert segment.find(BASE + 60) is None
    assert segment.find(0)[0] == 0  # type: ignore[index]  # before the segment: its first batch


def test_plan_and_read_return_whole_batches(segment: Segment) -> None:
    batches = _fill(segment, 20)
    size = len(batches[0])
    plan = segment.plan(0, size * 5 + 10, max_offset=10**9)
    assert plan is not None and plan.end == 5 * size and plan.next_offset == BASE + 15
    assert segment.read(plan) == b"".join(batches[:5])
    one = segment.plan(0, 1, max_offset=10**9)  # smaller than a batch: still one whole batch
    assert one is not None and segment.read(one) == batches[0]
    capped = segment.plan(0, 10**6, max_offset=BASE + 7)  # only batches ending below offset 107
    assert capped is not None and capped.next_offset == BASE + 6
    assert segment.plan(0, 10**6, max_offset=BASE + 2) is None


def test_truncate_to_drops_whole_batches_and_keeps_state_right(segment: Segment) -> None:
    batches = _fill(segment, 20)
    assert segment.truncate_to(BASE + 31)  # inside batch 10 (offsets 130..132): it goes whole
    assert segment.next_offset == BASE + 30
    assert segment.size == sum(map(len, batches[:10])) == os.path.getsize(segment.path)
    assert segment.max_timestamp == BASE_TS + 90
    assert all(p < segment.size for p in segment.offset_index.values)
    _fill(segment, 2)  # appends continue at the new end
    assert segment.next_offset == BASE + 36
    assert not segment.truncate_to(BASE + 36)


def test_truncate_everything(segment: Segment) -> None:
    _fill(segment, 5)
    segment.truncate_to(BASE)
    assert (segment.size, segment.next_offset, segment.max_timestamp) == (0, BASE, NO_TIMESTAMP)
    assert len(segment.offset_index) == 0 and len(segment.time_index) == 0


def test_loaded_state_equals_rebuilt_state(tmp_path: Path, segment: Segment) -> None:
    _fill(segment, 25)
    segment.seal_prepare()
    segment.persist_indexes()
    a = Segment.open(tmp_path, BASE, 300)
    a.load_indexes()
    b = Segment.open(tmp_path, BASE, 300)
    result = b.rebuild(verify=True, keep_tail=False)
    assert result.error is None and result.batches == 25
    for seg in (a, b):
        assert (seg.size, seg.next_offset, seg.max_timestamp) == (segment.size, segment.next_offset, BASE_TS + 240)
        assert seg.find(BASE + 40) == segment.find(BASE + 40)
    a.close()
    b.close()


def test_wrong_index_entry_is_noticed_and_rebuilt(segment: Segment) -> None:
    _fill(segment, 20)
    segment.offset_index.values[1] += 1  # now points into the middle of a batch
    found = segment.find(BASE + 50)
    assert found is not None and found[1].base_offset == BASE + 48


def test_bit_flip_in_a_batch_is_reported_with_its_offsets(segment: Segment) -> None:
    batches = _fill(segment, 10)
    position = sum(map(len, batches[:4])) + 70  # inside batch 4's records (offsets 112..114)
    with open(segment.path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x10]))
    plan = segment.plan(0, 10**6, 10**9)
    assert plan is not None
    with pytest.raises(CorruptSegmentError) as info:
        segment.read(plan)
    assert (info.value.first_offset, info.value.last_offset) == (BASE + 12, BASE + 14)
    good = segment.plan(sum(map(len, batches[:5])), 10**6, 10**9)  # the batches after it still read
    assert good is not None
    assert list(iter_batches(segment.read(good)))


def test_verify_range_reads_only_unverified_parts(tmp_path: Path, segment: Segment) -> None:
    _fill(segment, 10)
    segment.seal_prepare()
    segment.persist_indexes()
    reopened = Segment.open(tmp_path, BASE, 300)
    reopened.load_indexes()
    plan = reopened.plan(0, 10**6, 10**9)
    assert plan is not None
    assert reopened._verified.missing(0, plan.end) == [(0, plan.end)]
    reopened.verify_range(plan)
    assert reopened._verified.missing(0, plan.end) == []
    reopened.close()


def test_close_is_deferred_while_pinned(segment: Segment) -> None:
    segment.pin()
    segment.close()
    assert segment.closed
    segment.sync()  # the descriptor is still usable by the flush thread
    segment.unpin()
    with pytest.raises(ValueError):
        _ = segment.fd
