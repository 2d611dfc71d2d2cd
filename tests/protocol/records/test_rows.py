"""The consumer's record parser against the storage codec: the same records from every batch, the same refusals.

The parser decodes runs of records laid out alike column-wise (see ``tidelog.protocol.records.rows``), so besides random
shapes these build batches that are mostly such runs, with the run broken in every way it can be: a field's width
changing, a key or a tombstone appearing, offsets skipped by compaction, and bytes changed at random.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.batch_damage import damaged
from tidelog.client.records import FetchedBatch, batches_of
from tidelog.protocol.records import (
    HEADER_SIZE,
    BatchBuilder,
    BatchHeader,
    Codec,
    NewRecord,
    assign_offsets,
    build_batch,
    decode_records,
    parse_header,
    rebuild_batch,
)
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.rows import ConsumerRecord

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


def check(data: bytes, start: int = 0) -> list[ConsumerRecord]:
    """The records of ``data`` as the consumer decodes them, checked against the storage codec's."""
    got = fetched(data, start).records()
    assert [tuple(r) for r in got] == reference(data)[max(0, start - parse_header(data).base_offset) :]
    assert all(type(r) is ConsumerRecord and type(r.value) in (bytes, type(None)) for r in got)
    return got


def producer_batch(count: int, size: int = 1024, *, gap: int = 15_000, first: int = NOW) -> bytes:
    """Records as the producer writes them: stamped in ns as they are sent, no key, no headers."""
    builder = BatchBuilder(first)
    for i in range(count):
        builder.append(os.urandom(size), timestamp=first + i * gap)
    return builder.build(base_offset=1000)


@pytest.mark.parametrize("count", [1, 7, 8, 9, 63, 64, 65, 100, 513, 1100])
@pytest.mark.parametrize("gap", [0, 15_000, 3_000_000])
def test_producer_shaped_batches(count: int, gap: int) -> None:
    """Runs begin and end where the offset delta's varint grows (at 64) and where the timestamp delta's does."""
    records = check(producer_batch(count, gap=gap))
    assert [r.offset for r in records] == list(range(1000, 1000 + count))
    assert [r.timestamp for r in records] == [NOW + i * gap for i in range(count)]


def test_runs_of_small_records_past_two_byte_offset_deltas() -> None:
    check(producer_batch(8300, size=3, gap=1))


@pytest.mark.parametrize("first", [0, -(10**18), NOW])
@pytest.mark.parametrize("sign", [1, -1])
def test_runs_with_timestamps_before_the_first_or_before_the_epoch(first: int, sign: int) -> None:
    builder = BatchBuilder(first)
    for i in range(40):
        builder.append(b"v" * 100, timestamp=first + sign * (10_000_000 + i))  # four bytes each: one run
    check(builder.build())


@pytest.mark.parametrize(
    "shape",
    [
        lambda i: NewRecord(b"v" * 50, key=b"key-%03d" % i),  # a run with keys of one size
        lambda i: NewRecord(None, key=b"k%03d" % i),  # tombstones
        lambda i: NewRecord(None),  # not even a key
        lambda i: NewRecord(b"", key=b""),  # empty, not null
        lambda i: NewRecord(b"v" * 50, key=b"k" if i % 10 == 9 else None),  # runs broken by a key
        lambda i: NewRecord(b"v" * (50 + i // 12)),  # by the value's size
        lambda i: NewRecord(b"v" * 50, headers=[("h", b"")] if i % 11 == 10 else ()),  # by headers
        lambda i: NewRecord(b"v" * 50, timestamp=NOW + (1 << (i % 36))),  # by the timestamp delta's width
        lambda i: NewRecord(b"\x00" * 50, timestamp=NOW + 64 * (i % 9)),  # values of zeros, deltas of 1-2 bytes
        lambda i: NewRecord(b"v" * 50, headers=[("h", b"")]),  # headers ending in a zero byte, like no headers
        lambda i: NewRecord(b"v" * 50, headers=[("", b"")]),
        lambda i: NewRecord(b"v" * 50, key=b"k" * 70),  # a key length of two bytes
    ],
)
def test_runs_of_other_shapes_and_what_ends_them(shape: Callable[[int], NewRecord]) -> None:
    check(build_batch([shape(i) for i in range(150)], timestamp=NOW, base_offset=7))


@pytest.mark.parametrize("codec", list(Codec))
def test_runs_in_compressed_batches(codec: Codec) -> None:
    builder = BatchBuilder(NOW)
    for i in range(200):
        builder.append(b"%04d" % i * 100, timestamp=NOW + i * 20_000)
    check(builder.build(codec=codec))


@pytest.mark.parametrize("start", [0, 1005, 1063, 1064, 1095, 1099])
def test_runs_in_a_batch_starting_before_the_start_offset(start: int) -> None:
    records = check(producer_batch(100), start)
    assert [r.offset for r in records] == list(range(start or 1000, 1100))


@pytest.mark.parametrize("keep", [lambda o: o != 20, lambda o: o % 2 == 0, lambda o: o < 30 or o > 70])
def test_runs_in_compacted_batches_with_gaps_in_their_offsets(keep: Callable[[int], bool]) -> None:
    data = producer_batch(100, size=40)
    kept = [r for r in decode_records(data) if keep(r.offset - 1000)]
    check(rebuild_batch(parse_header(data), kept))


def outcome(data: bytes, header: BatchHeader) -> list[tuple[object, ...]] | str:
    """The records the consumer finds in ``data`` under ``header``, or "corrupt": what the storage codec finds,
    unless the consumer refuses it. It may refuse more (a length below -1, which the codec reads as null; no
    encoder writes one), never less, and never reads other records."""
    batch = FetchedBatch("s", 3, header, memoryview(data), 0)
    try:
        mine: list[tuple[object, ...]] | str = [tuple(r) for r in batch.records()]
    except CorruptBatchError:
        mine = "corrupt"
    try:
        theirs: list[tuple[object, ...]] | str = [
            ("s", 3, r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(data, header=header)
        ]
    except CorruptBatchError:
        theirs = "corrupt"
    assert mine in (theirs, "corrupt")
    return mine


FUZZ_BATCHES = [
    producer_batch(90, size=30, gap=9_000),
    build_batch([NewRecord(b"v" * 20, key=b"kk") for _ in range(30)], timestamp=NOW),
    build_batch([NewRecord(None) for _ in range(30)], timestamp=NOW),
]


@settings(max_examples=1000, deadline=None)
@given(damaged(FUZZ_BATCHES))
def test_damaged_batches_are_refused_or_read_as_the_storage_codec_reads_them(case: tuple[bytes, BatchHeader]) -> None:
    """Whatever bytes of the records (or the header's counts) are changed to: CorruptBatchError or the records
    the storage codec finds, never another exception or other records."""
    outcome(*case)


@pytest.mark.parametrize("index", range(len(FUZZ_BATCHES)))
def test_every_single_byte_change_is_refused_or_read_as_the_storage_codec_reads_it(index: int) -> None:
    """Exhaustively, for the bytes that matter most to a run: those of its records' first 12 and last."""
    data = FUZZ_BATCHES[index]
    header = parse_header(data)
    size = len(data) - HEADER_SIZE
    for position in range(HEADER_SIZE, len(data)):
        if (position - HEADER_SIZE) % (size // header.record_count) in (*range(12), size // header.record_count - 1):
            for value in (0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFF, data[position] ^ 0x80, data[position] ^ 1):
                changed = bytearray(data)
                changed[position] = value
                outcome(bytes(changed), header)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=400), st.integers(1, 40), st.integers(0, 40))
def test_random_bytes_are_refused_or_read_as_the_storage_codec_reads_them(body: bytes, count: int, extra: int) -> None:
    header = parse_header(FUZZ_BATCHES[0])._replace(record_count=count, last_offset_delta=count - 1 + extra)
    outcome(bytes(HEADER_SIZE) + body, header)


@pytest.mark.parametrize("length", [b"\x03", b"\x05", b"\x81\x00"])
def test_a_run_of_impossible_key_lengths_is_refused(length: bytes) -> None:
    """Negative key lengths other than -1 (or -1 written in two bytes) in every record, so in a whole run."""
    data = build_batch([NewRecord(b"vv", key=b"k") for _ in range(30)], timestamp=NOW)
    section = data[HEADER_SIZE:].replace(b"\x02k\x04vv", length + b"k\x04vv")
    if len(length) > 1:  # one byte longer: so is the record
        section = section.replace(b"\x12\x00", b"\x14\x00")
    header = parse_header(data)._replace(batch_length=HEADER_SIZE + len(section) - 12)
    data = data[:HEADER_SIZE] + section
    with pytest.raises(CorruptBatchError):
        FetchedBatch("s", 3, header, memoryview(data), 0).records()
