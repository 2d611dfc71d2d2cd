"""The source's Arrow decoder against the consumer's record decoder: the same rows from every batch and range.

:class:`ColumnBuilder` reads runs of alike records column-wise and the rest one by one (see
``tidelog.spark.columns``), so besides random shapes these build batches that are mostly runs, broken in every
way a run can break, read from and to offsets inside them. The oracle is :meth:`FetchedBatch.records`, itself
checked against the canonical decoder by ``tests/protocol/records/test_rows.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

from tests.batch_damage import damaged  # noqa: E402
from tidelog.client.records import FetchedBatch, batches_of  # noqa: E402
from tidelog.protocol.liftbridge import REPLY, SUBJECT  # noqa: E402
from tidelog.protocol.records import (  # noqa: E402
    BatchBuilder,
    BatchHeader,
    Codec,
    NewRecord,
    build_batch,
    decode_records,
    parse_header,
    rebuild_batch,
)
from tidelog.protocol.records.errors import CorruptBatchError  # noqa: E402
from tidelog.spark.columns import ColumnBuilder  # noqa: E402
from tidelog.spark.schema import ARROW_SCHEMA, SPARK_SCHEMA  # noqa: E402

NOW = 1_700_000_000_000_000_000
SUBJECT_OF_PARTITION = "orders.3"
Row = tuple[object, ...]

blobs = st.none() | st.binary(max_size=300)
header_lists = st.lists(
    st.tuples(st.sampled_from(["a", "b", SUBJECT, REPLY, "_tl.x"]), st.binary(max_size=20)), max_size=3
)
timestamps = st.none() | st.integers(min_value=-(1 << 60), max_value=1 << 62)
record_lists = st.lists(
    st.builds(NewRecord, value=blobs, key=blobs, headers=header_lists, timestamp=timestamps), min_size=1, max_size=80
)


def expected(batches: Sequence[FetchedBatch], end: int, *, include_headers: bool) -> list[Row]:
    """The rows the source must produce, from the consumer's decoded records."""
    rows: list[Row] = []
    for batch in batches:
        for r in batch.records():
            if r.offset >= end:
                break
            subject = SUBJECT_OF_PARTITION
            user = []
            for name, value in r.headers:
                if name == SUBJECT:
                    subject = value.decode(errors="replace")
                elif not name.startswith("_tl."):
                    user.append({"key": name, "value": value})
            rows.append(
                (r.key, r.value, "s", 3, r.offset, r.timestamp // 1000, subject, user if include_headers else None)
            )
    return rows


def built(batches: Sequence[FetchedBatch], end: int, *, include_headers: bool) -> list[Row]:
    builder = ColumnBuilder("s", 3, SUBJECT_OF_PARTITION, include_headers=include_headers)
    for batch in batches:
        builder.add(batch, end)
    rows = builder.rows
    result = builder.build()
    assert result.schema.equals(ARROW_SCHEMA)
    assert result.num_rows == rows
    assert builder.rows == 0
    columns = [result.column(i).to_pylist() for i in range(result.num_columns)]
    columns[5] = result.column("timestamp").cast(pa.int64()).to_pylist()  # µs, not datetimes
    return list(zip(*columns, strict=True))


def check(
    data: bytes | Sequence[bytes], start: int = 0, end: int = 1 << 62, *, include_headers: bool = False
) -> list[Row]:
    """The rows of ``data`` (one batch or several, consecutive) in ``[start, end)``, checked against the oracle."""
    batches = [
        b
        for chunk in ([data] if isinstance(data, bytes) else data)
        for b in batches_of(memoryview(chunk), "s", 3, start)
    ]
    want = expected(batches, end, include_headers=include_headers)
    got = built(batches, end, include_headers=include_headers)
    assert got == want
    return got


def producer_batch(count: int, size: int = 100, *, gap: int = 15_000, first: int = NOW, base: int = 1000) -> bytes:
    """Records as the producer writes them: stamped in ns as they are sent, no key, no headers."""
    builder = BatchBuilder(first)
    for i in range(count):
        builder.append(os.urandom(size), timestamp=first + i * gap)
    return builder.build(base_offset=base)


def test_the_arrow_schema_is_the_one_pyspark_derives_from_the_spark_schema() -> None:
    """PySpark refuses a task's batches unless their schema equals this one exactly."""
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


@settings(max_examples=300, deadline=None)
@given(
    record_lists, st.sampled_from(Codec), st.integers(0, 1 << 40), st.integers(0, 90), st.integers(0, 90), st.booleans()
)
def test_random_records_and_ranges(
    new: list[NewRecord], codec: Codec, base: int, skip: int, stop: int, include_headers: bool
) -> None:
    data = build_batch(new, timestamp=NOW, codec=codec, base_offset=base)
    check(data, base + skip, base + stop, include_headers=include_headers)


@pytest.mark.parametrize("count", [1, 15, 16, 17, 63, 64, 65, 100, 513, 4097, 8300])
@pytest.mark.parametrize("gap", [0, 1, 15_000, 3_000_000])
def test_producer_shaped_batches(count: int, gap: int) -> None:
    """Runs begin and end where the offset delta's varint grows (at 64, 8192) and where the timestamp delta's does,
    and a run is checked 4096 records at a time."""
    rows = check(producer_batch(count, size=3 if count > 8192 else 100, gap=gap))
    assert [row[4] for row in rows] == list(range(1000, 1000 + count))
    assert [row[5] for row in rows] == [(NOW + i * gap) // 1000 for i in range(count)]


@pytest.mark.parametrize(("start", "end"), [(0, 1 << 62), (1005, 1090), (1063, 1064), (1064, 1065), (1099, 1100)])
@pytest.mark.parametrize("count", [100, 600])
def test_ranges_inside_runs(start: int, end: int, count: int) -> None:
    rows = check(producer_batch(count, gap=1), start, end)
    assert [row[4] for row in rows] == list(range(max(start, 1000), min(end, 1000 + count)))


@pytest.mark.parametrize("first", [0, -(10**18), NOW, -1])
@pytest.mark.parametrize("sign", [1, -1])
def test_timestamps_before_the_first_or_before_the_epoch_round_down_to_microseconds(first: int, sign: int) -> None:
    builder = BatchBuilder(first)
    for i in range(40):
        builder.append(b"v" * 100, timestamp=first + sign * (10_000_001 + i))  # four bytes each: one run
    builder.append(b"v" * 100, key=b"k", timestamp=first - 1)  # and one parsed alone
    check(builder.build())


SHAPES: list[Callable[[int], NewRecord]] = [
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
    lambda i: NewRecord(b"v" * 50, key=b"k" * 70),  # a key length of two bytes
    lambda i: NewRecord(b"v" * 20000),  # values longer than 8 KiB: a three-byte length
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("include_headers", [False, True])
def test_runs_of_other_shapes_and_what_ends_them(shape: Callable[[int], NewRecord], include_headers: bool) -> None:
    check(build_batch([shape(i) for i in range(150)], timestamp=NOW, base_offset=7), include_headers=include_headers)


@pytest.mark.parametrize("codec", list(Codec))
def test_compressed_batches(codec: Codec) -> None:
    builder = BatchBuilder(NOW)
    for i in range(200):
        builder.append(b"%04d" % i * 100, timestamp=NOW + i * 20_000)
    check(builder.build(codec=codec))


@pytest.mark.parametrize("keep", [lambda o: o != 20, lambda o: o % 2 == 0, lambda o: o < 30 or o > 70])
def test_compacted_batches_with_gaps_in_their_offsets(keep: Callable[[int], bool]) -> None:
    data = producer_batch(100, size=40)
    kept = [r for r in decode_records(data) if keep(r.offset - 1000)]
    rows = check(rebuild_batch(parse_header(data), kept), 1010, 1090)
    assert [row[4] for row in rows] == [r.offset for r in kept if 1010 <= r.offset < 1090]


def test_subjects_and_headers_of_nats_ingest_records() -> None:
    """A wildcard stream's records carry the subject they arrived on; reserved headers stay out of ``headers``."""
    new = [NewRecord(b"plain") for _ in range(20)]
    new += [NewRecord(b"wild", headers=[(SUBJECT, b"orders.eu"), ("trace", b"1"), (REPLY, b"_INBOX.1")])]
    new += [NewRecord(b"plain") for _ in range(20)]
    rows = check([build_batch(new, timestamp=NOW, base_offset=0), producer_batch(30, base=41)], include_headers=True)
    assert [row[6] for row in rows] == [SUBJECT_OF_PARTITION] * 20 + ["orders.eu"] + [SUBJECT_OF_PARTITION] * 50
    assert rows[20][7] == [{"key": "trace", "value": b"1"}]
    assert rows[0][7] == [] and rows[-1][7] == []
    assert [row[4] for row in rows] == list(range(71))


def test_several_batches_build_one_record_batch_and_the_builder_starts_over() -> None:
    chunks = [producer_batch(100, base=0), build_batch([NewRecord(b"x", key=b"k")], timestamp=NOW, base_offset=100)]
    chunks.append(producer_batch(300, base=101))
    rows = check(chunks, 50, 350)
    assert [row[4] for row in rows] == list(range(50, 350))


def test_control_batches_hold_no_rows() -> None:
    data = build_batch([NewRecord(b"marker")], timestamp=NOW, base_offset=5, control=True)
    assert built(batches_of(memoryview(data), "s", 3, 0), 1 << 62, include_headers=False) == []


def outcome(data: bytes, header: BatchHeader) -> list[Row] | str:
    """The builder's rows for ``data`` under ``header``, or "corrupt"; never other rows than the consumer's."""
    batch = FetchedBatch("s", 3, header, memoryview(data), 0)
    try:
        mine: list[Row] | str = built([batch], 1 << 62, include_headers=True)
    except CorruptBatchError:
        mine = "corrupt"
    try:
        theirs: list[Row] | str = expected([batch], 1 << 62, include_headers=True)
    except CorruptBatchError:
        theirs = "corrupt"
    assert mine in (theirs, "corrupt")
    return mine


FUZZ_BATCHES = [
    producer_batch(90, size=30, gap=9_000),
    build_batch([NewRecord(b"v" * 20, key=b"kk") for _ in range(30)], timestamp=NOW),
    build_batch([NewRecord(None) for _ in range(30)], timestamp=NOW),
    build_batch([NewRecord(b"v", headers=[("h", b"x")]) for _ in range(30)], timestamp=NOW),
]


@settings(max_examples=1000, deadline=None)
@given(damaged(FUZZ_BATCHES))
def test_damaged_batches_are_refused_or_read_as_the_consumer_reads_them(case: tuple[bytes, BatchHeader]) -> None:
    outcome(*case)
