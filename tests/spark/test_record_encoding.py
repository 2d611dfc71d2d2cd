"""The sink's bulk encoder writes exactly the bytes the appender's record-at-a-time builder writes for the same rows.

The reference is :class:`~tidelog.protocol.records.BatchBuilder`, fed as the sink fed it before the bulk encoder
(a null header value written empty): every shape of key, value and headers, nulls and empty strings, values of
one size and of many, large values, offset deltas across the varint widths, slices cut small.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from tidelog.protocol.records import BatchBuilder, EncodedRecords, encode_varint
from tidelog.spark.record_encoding import RowEncodingError, encode_rows
from tidelog.spark.varint_columns import Varints
from tidelog.spark.writing import ROWS_SCHEMA

HEADERS = ROWS_SCHEMA.field("headers").type
Header = tuple[str, bytes | None]
Row = tuple[bytes | None, bytes | None, list[Header] | None]


def table(rows: list[Row]) -> pa.Table:
    values, keys, headers = zip(*rows, strict=True) if rows else ((), (), ())
    header_column = [None if pairs is None else [{"key": k, "value": v} for k, v in pairs] for pairs in headers]
    return pa.Table.from_arrays(
        [pa.array(list(values), pa.binary()), pa.array(list(keys), pa.binary()), pa.array(header_column, HEADERS)],
        schema=ROWS_SCHEMA,
    )


def reference(rows: list[Row]) -> bytes:
    """The record section the builder writes, record by record, for records without a timestamp."""
    builder = BatchBuilder(1_700_000_000_000_000_000)
    for value, key, pairs in rows:
        builder.append(value, key, [(name, v or b"") for name, v in pairs] if pairs else ())
    return builder.drain()


def encoded(rows: list[Row], chunk_bytes: int = 1 << 20) -> bytes:
    chunks = encode_rows(table(rows), chunk_bytes)
    delta = 0
    for chunk in chunks:  # the chunks follow each other: each starts where the last ended
        assert chunk.first_delta == delta
        delta += chunk.count
    assert delta == len(rows)
    return b"".join(chunk.section for chunk in chunks)


def test_plain_values_of_one_size() -> None:
    rows: list[Row] = [(bytes([i % 251]) * 100, None, None) for i in range(20_000)]  # deltas of 1, 2 and 3 bytes
    assert encoded(rows) == reference(rows)
    assert encoded(rows, chunk_bytes=50_000) == reference(rows)  # many slices, cut across width bands


def test_keys_values_and_headers_of_every_kind() -> None:
    rows: list[Row] = [
        (b"v", b"k", [("h", b"1"), ("h", None)]),  # a repeated name; a null header value is written empty
        (None, None, None),  # a tombstone without a key
        (b"", b"", []),  # empty value and key; an empty header list: no headers
        (b"x" * 300_000, None, [("", b"")]),  # a large value (a 3-byte size), an empty header name
        (None, b"k" * 200, [("größe", b"\x00\xff" * 70)]),  # a tombstone with a key; UTF-8 names
        (b"tail", None, None),
    ]
    assert encoded(rows) == reference(rows)
    assert encoded(rows, chunk_bytes=1) == reference(rows)  # a slice a row


def test_sizes_of_mixed_varint_widths() -> None:
    sizes = [0, 1, 63, 64, 65, 127, 128, 8191, 8192, 8193, 70_000, 3, 200]
    rows: list[Row] = [(b"v" * size, b"k" * (size % 97) if size % 2 else None, None) for size in sizes]
    assert encoded(rows) == reference(rows)


def test_a_table_of_several_chunks_and_a_sliced_one() -> None:
    rows: list[Row] = [(b"%d" % i, None, [("n", b"%d" % i)] if i % 3 else None) for i in range(300)]
    whole = table(rows)
    chunked = pa.concat_tables([whole.slice(0, 100), whole.slice(100, 7), whole.slice(107)])
    assert b"".join(c.section for c in encode_rows(chunked)) == reference(rows)
    assert b"".join(c.section for c in encode_rows(whole.slice(50, 60))) == reference(rows[50:110])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.binary(max_size=300),
            st.none() | st.binary(max_size=40),
            st.none() | st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=20)), max_size=3),
        ),
        max_size=80,
    ),
    st.integers(min_value=1, max_value=2000),
)
def test_any_rows_encode_as_the_builder_encodes_them(rows: list[Row], chunk_bytes: int) -> None:
    assert encoded(rows, chunk_bytes) == reference(rows)


def test_a_null_header_is_refused() -> None:
    headers = pa.array([[None]], HEADERS)
    rows = pa.Table.from_arrays([pa.array([b"v"]), pa.nulls(1, pa.binary()), headers], schema=ROWS_SCHEMA)
    with pytest.raises(RowEncodingError, match="header"):
        encode_rows(rows)


def test_varint_columns_match_the_scalar_encoder() -> None:
    values = [0, 1, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**35 - 1, 5, 300]
    mixed = Varints.of(pa.array(values, pa.uint64()))
    assert mixed.width == 0
    unsigned = [encode_varint(v >> 1) if v % 2 == 0 else encode_varint(-(v + 1) // 2) for v in values]  # zig-zag back
    assert mixed.column().to_pylist() == unsigned
    for value in (0, 200, 20_000, 2**30):
        same = Varints.of(pa.array([value] * 5, pa.uint64()))
        assert same.width and same.fixed() == encode_varint(value // 2) * 5  # even: zig-zag of value / 2
    with pytest.raises(ValueError, match="too large"):
        Varints.of(pa.array([2**35], pa.uint64()))


def test_the_builder_takes_bulk_records_only_at_their_own_offset_deltas() -> None:
    rows: list[Row] = [(b"a", None, None), (b"b", None, None)]
    builder = BatchBuilder(0)
    builder.append(b"first")
    with pytest.raises(ValueError, match="offset delta 0"):
        builder.extend(EncodedRecords(encoded(rows), 2, 0))
    builder = BatchBuilder(0)
    for chunk in encode_rows(table(rows), chunk_bytes=1):
        builder.extend(chunk)
    assert builder.count == 2 and builder.drain() == reference(rows)
