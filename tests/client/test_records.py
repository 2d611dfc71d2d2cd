"""The consumer's record parser against the storage codec: the same records from every batch, the same refusals."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.client.records import FetchedBatch, batches_of
from tidelog.storage.batch import (
    HEADER_SIZE,
    BatchBuilder,
    Codec,
    NewRecord,
    assign_offsets,
    build_batch,
    decode_records,
    parse_header,
    rebuild_batch,
)
from tidelog.storage.errors import CorruptBatchError

NOW = 1_700_000_000_000_000_000
blobs = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=3)
timestamps = st.none() | st.integers(min_value=0, max_value=1 << 62)
records = st.lists(st.builds(NewRecord, value=blobs, key=blobs, headers=headers, timestamp=timestamps), min_size=1)


def fetched(data: bytes, start: int = 0) -> FetchedBatch:
    (batch,) = batches_of(memoryview(data), "s", 3, start)
    return batch


def reference(data: bytes) -> list[tuple[object, ...]]:
    return [("s", 3, r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(data)]


@settings(max_examples=300, deadline=None)
@given(records, st.sampled_from(Codec), st.integers(0, 1 << 40))
def test_the_same_records_as_the_storage_codec(new: list[NewRecord], codec: Codec, base: int) -> None:
    data = build_batch(new, timestamp=NOW, codec=codec, base_offset=base)
    assert [tuple(r) for r in fetched(data).records()] == reference(data)


def test_producer_stamped_timestamps_and_large_values() -> None:
    builder = BatchBuilder(time.time_ns())
    for i in range(300):
        builder.append(os.urandom(1024 + i), None if i % 3 else b"k%d" % i, (), time.time_ns() + i * 10**9)
    data = builder.build()
    assert [tuple(r) for r in fetched(data).records()] == reference(data)


def test_timestamp_deltas_of_every_varint_length() -> None:
    """The timestamp delta's varint is decoded unrolled up to five bytes, then by a loop: every length, both signs."""
    deltas = [0, 1, -1, 63, -64, 64, 8191, 8192, 1 << 20, 1 << 27, 1 << 34, -(1 << 34), 1 << 40, 1 << 55, 1 << 62]
    deltas += [(1 << shift) - 1 for shift in range(1, 63, 7)] + [-(1 << shift) for shift in range(1, 63, 7)]
    new = [NewRecord(b"v%d" % i, timestamp=NOW + delta) for i, delta in enumerate(deltas)]
    data = build_batch(new, timestamp=NOW)
    assert [tuple(r) for r in fetched(data).records()] == reference(data)
    assert [r.timestamp for r in fetched(data).records()] == [NOW + delta for delta in deltas]


def test_records_before_the_start_offset_are_left_out() -> None:
    data = bytearray(build_batch([NewRecord(b"%d" % i) for i in range(10)], timestamp=NOW))
    assign_offsets(data, 0, 100, 0)
    batch = fetched(bytes(data), start=104)
    assert [r.offset for r in batch.records()] == list(range(104, 110))
    assert batch.record_count == 6


def test_a_compacted_batch_straddling_the_start_is_counted_by_decoding() -> None:
    data = build_batch([NewRecord(b"%d" % i, key=b"k") for i in range(10)], timestamp=NOW)
    header = parse_header(data)
    kept = [r for r in decode_records(data) if r.offset % 3 == 0]  # offsets 0, 3, 6, 9
    batch = fetched(rebuild_batch(header, kept), start=4)
    assert batch.record_count == 2
    assert [r.offset for r in batch.records()] == [6, 9]


def corrupt(data: bytes, position: int, value: int) -> bytes:
    """``data`` with one byte of its record section changed (the CRC is not rechecked by the parser)."""
    changed = bytearray(data)
    changed[HEADER_SIZE + position] = value
    return bytes(changed)


@pytest.mark.parametrize(
    ("position", "value"),
    [
        (0, 0x7F),  # record length far beyond the batch
        (0, 0x02),  # record length 1: too short for its fields
        (3, 0x08),  # offset delta 4 in a batch of two
        (4, 0x7E),  # key length beyond the record
        (2, 0xFF),  # the timestamp delta's varint runs on into the fields after it
    ],
)
def test_damaged_records_are_refused_like_the_storage_codec_refuses_them(position: int, value: int) -> None:
    data = corrupt(build_batch([NewRecord(b"abc"), NewRecord(b"de")], timestamp=NOW), position, value)
    batch = FetchedBatch("s", 3, parse_header(data), memoryview(data), 0)
    with pytest.raises(CorruptBatchError):
        batch.records()
    with pytest.raises(CorruptBatchError):
        decode_records(data)
