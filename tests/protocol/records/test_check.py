"""The record check at the broker's door: it accepts exactly records every reader decodes, through its runs as
one record at a time, and it measures records and timestamps right."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.records import (
    RUN_CHUNK,
    BatchBuilder,
    BatchHeader,
    IrregularRecords,
    NewRecord,
    check_records,
    decode_records,
    frame,
    parse_header,
)
from tidelog.protocol.records.errors import CorruptBatchError, RecordTooLargeError
from tidelog.protocol.records.rows import parse_records

FIRST = 1_700_000_000_000_000_000
NO_LIMIT = 1 << 40

record = st.builds(
    NewRecord,
    st.none() | st.binary(max_size=300),
    st.none() | st.binary(max_size=20),
    st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3),
    st.none() | st.integers(FIRST - 10**9, FIRST + 10**12),
)


def section(records: list[NewRecord], first: int = FIRST) -> bytes:
    builder = BatchBuilder(first)
    for r in records:
        builder.append(r.value, r.key, r.headers, r.timestamp)
    return builder.drain()


def producer_section(count: int, size: int, step_ns: int, key: bytes | None = None) -> bytes:
    """What a producer sends: no headers, values of one size, stamped as sent."""
    builder = BatchBuilder(FIRST)
    for i in range(count):
        builder.append(os.urandom(size), key, (), FIRST + i * step_ns)
    return builder.drain()


def as_batch(data: bytes, count: int) -> bytes:
    return frame(
        data,
        base_offset=0,
        leader_epoch=0,
        attributes=0,
        last_offset_delta=max(count - 1, 0),
        first_timestamp=FIRST,
        max_timestamp=FIRST,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        record_count=count,
    )


def decoded_by_both(data: bytes, count: int) -> list[int]:
    """The timestamps both readers decode from ``data`` as a batch of ``count`` records (raising if either fails)."""
    batch = as_batch(data, count)
    header: BatchHeader = parse_header(batch)
    stored = decode_records(batch)
    consumed = parse_records(data, header, "s", 0)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in stored] == [
        (r.offset, r.timestamp, r.key, r.value) for r in consumed
    ]
    return [r.timestamp for r in stored]


@settings(max_examples=200)
@given(st.lists(record, min_size=1, max_size=30))
def test_any_records_are_accepted_and_measured_like_the_decoders(records: list[NewRecord]) -> None:
    data = section(records)
    checked = check_records(data, 0, NO_LIMIT)
    timestamps = decoded_by_both(data, checked.records)
    assert checked.records == len(records)
    assert FIRST + checked.min_timestamp_delta == min(timestamps)
    assert FIRST + checked.max_timestamp_delta == max(timestamps)


@pytest.mark.parametrize(
    ("count", "size", "step_ns", "key"),
    [
        (500, 1024, 2000, None),
        (4800, 100, 700, None),
        (RUN_CHUNK * 2 + 300, 10, 300, b"k"),  # several chunks, offset deltas past 8191 (three-byte varints)
        (300, 50, 0, b""),  # every timestamp the same
        (80, 5000, 20_000, None),  # large records: a view is read in place, not copied
    ],
)
@pytest.mark.parametrize("as_view", [False, True], ids=["bytes", "view"])
def test_producer_batches_go_through_runs_and_agree(
    count: int, size: int, step_ns: int, key: bytes | None, as_view: bool
) -> None:
    data = producer_section(count, size, step_ns, key)
    checked = check_records(memoryview(bytearray(data)).toreadonly() if as_view else data, 0, NO_LIMIT)
    assert checked.records == count
    assert checked.min_timestamp_delta == 0 and checked.max_timestamp_delta == (count - 1) * step_ns


def test_timestamps_out_of_order_are_bounded_exactly() -> None:
    rng = random.Random(7)
    stamps = [FIRST + rng.randrange(0, 10**6) for _ in range(400)]
    builder = BatchBuilder(FIRST)
    for ts in stamps:
        builder.append(b"v" * 30, None, (), ts)
    checked = check_records(builder.drain(), 0, NO_LIMIT)
    assert (FIRST + checked.min_timestamp_delta, FIRST + checked.max_timestamp_delta) == (min(stamps), max(stamps))


def test_a_negative_timestamp_delta_inside_a_run_is_measured() -> None:
    builder = BatchBuilder(FIRST)
    for i in range(200):
        builder.append(b"v" * 30, None, (), FIRST - 5 if i == 150 else FIRST + 1000 * i)
    checked = check_records(builder.drain(), 0, NO_LIMIT)
    assert checked.min_timestamp_delta == -5 and checked.max_timestamp_delta == 199_000


@pytest.mark.parametrize("size", [12, 5000])  # small records are copied before their runs, large ones are not
def test_single_byte_damage_of_a_long_run_is_refused_or_read_alike_by_every_reader(size: int) -> None:
    """Damage anywhere in runs of records: refused, or accepted only as both readers read it."""
    data = producer_section(120 if size < 100 else 40, size, 1500)
    rng = random.Random(3)
    positions = range(len(data)) if size < 100 else sorted(rng.sample(range(len(data)), 2000))
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= rng.choice((0x01, 0x80, 0xFF, 0x40))
        try:
            checked = check_records(memoryview(damaged).toreadonly(), 0, NO_LIMIT)
        except CorruptBatchError:
            continue
        decoded_by_both(bytes(damaged), checked.records)


def test_garbage_is_refused() -> None:
    with pytest.raises(CorruptBatchError):
        check_records(b"\xff" * 1000, 0, NO_LIMIT)


def test_a_cut_record_is_refused() -> None:
    data = producer_section(40, 100, 1000)
    with pytest.raises(CorruptBatchError, match="record 39"):
        check_records(data[:-1], 0, NO_LIMIT)


def test_offset_deltas_must_run_on_from_the_first() -> None:
    data = section([NewRecord(b"a"), NewRecord(b"b")])
    assert check_records(data, 0, NO_LIMIT).records == 2
    with pytest.raises(CorruptBatchError, match="offset delta 0, expected 5"):
        check_records(data, 5, NO_LIMIT)


@pytest.mark.parametrize(
    "field",
    [
        b"\x03",  # length -2
        b"\x81\x00",  # -1 spelled in two bytes: the consumer's decoder reads null only as one byte
    ],
)
def test_a_null_is_one_byte_and_no_length_is_below_minus_one(field: bytes) -> None:
    # length, attributes, timestamp delta 0, offset delta 0, key, value of 1 byte, no headers
    body = b"\x00\x00\x00" + field + b"\x02v\x00"
    data = bytes([len(body) << 1]) + body
    with pytest.raises(CorruptBatchError, match="key"):
        check_records(data, 0, NO_LIMIT)


def test_a_header_name_must_be_utf8() -> None:
    data = section([NewRecord(b"v", headers=[("ab", b"x")])])
    damaged = data.replace(b"ab", b"\xff\xfe")
    with pytest.raises(CorruptBatchError, match="UTF-8"):
        check_records(damaged, 0, NO_LIMIT)


def test_records_are_measured_by_key_value_and_headers() -> None:
    exact = section([NewRecord(b"v" * 90, key=b"k" * 5, headers=[("n", b"hh"), ("m", b"")])])  # 90+5+1+2+1
    assert check_records(exact, 0, 99).records == 1
    with pytest.raises(RecordTooLargeError, match=r"record 0 is 99 bytes .* above max_message_bytes \(98\)"):
        check_records(exact, 0, 98)


def test_one_large_record_in_a_run_is_refused() -> None:
    builder = BatchBuilder(FIRST)
    for i in range(300):
        builder.append(b"x" * (5000 if i == 250 else 100), None, (), FIRST + i)
    with pytest.raises(RecordTooLargeError, match="record 250 is 5000 bytes"):
        check_records(builder.drain(), 0, 4096)


def test_a_budget_bounds_the_records_checked_one_by_one() -> None:
    irregular = section([NewRecord(b"v" * (i % 7)) for i in range(100)])
    with pytest.raises(IrregularRecords):
        check_records(irregular, 0, NO_LIMIT, alone_budget=50)
    assert check_records(irregular, 0, NO_LIMIT).records == 100
    assert check_records(producer_section(3000, 20, 100), 0, NO_LIMIT, alone_budget=50).records == 3000  # runs
