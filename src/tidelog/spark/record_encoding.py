"""A sink task's rows → record sections, in bulk: the executors' hot path, with no Python object per row.

The appender encodes a record at a time (:class:`~tidelog.protocol.records.BatchBuilder`), microseconds of
Python each: for a Spark task writing hundreds of thousands of rows that was most of the task
(``docs/performance.md``). Here a slice of a partition's rows (:data:`~tidelog.spark.writing.ROWS_SCHEMA`)
becomes the records' bytes with a fixed number of Arrow kernels and byte-slice copies, whatever its row count,
as :class:`~tidelog.protocol.records.EncodedRecords` the appender sends as they are.

The bytes are exactly those the builder writes for the same rows given no timestamp (the layout is drawn in
:mod:`tidelog.protocol.records.layout`; ``tests/spark/test_record_encoding.py`` compares the two on every
shape). Record ``k`` of an append is ::

    varint(length)  00  00  varint(k)  key field  value field  header section
                    │   └ timestamp delta 0: every record takes the batch's first timestamp
                    └ attributes

a field being ``varint(size)`` and its bytes, or ``01`` (-1) for a null key or value; the header section
``varint(count)`` then per header ``varint(size)`` + UTF-8 name, ``varint(size)`` + value (a null header value
is written empty, as the sink always did). Varints are zig-zag: a size ``s`` is the unsigned varint of ``2 s``.

How. A record is a row of *parts*: constants, varint columns (:mod:`~tidelog.spark.varint_columns`) and
binary columns (keys, values, header sections). :func:`assemble` lays them end to end, row after row. Constants
and varints of one width that follow each other become one fixed-width column, written by byte-slice copies
(``head[i::width] = ...``: every row's ``i``-th byte at once); the remaining columns are concatenated and one
``take`` kernel gathers them in record order, whose data buffer *is* the record section. (Arrow's
``binary_join_element_wise`` does the same but costs several times more per row and argument.) Header sections
are built the same way over the flattened headers and cut per row by offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.protocol.records import EncodedRecords
from tidelog.spark.varint_columns import U64, Varints, ramp

CHUNK_BYTES = 1024 * 1024
"""Bytes of keys and values encoded at once: the appender's chunk size, so a chunk goes out as it is ready."""
MAX_CHUNK_ROWS = 1 << 16
"""Rows encoded at once at most."""

Part: TypeAlias = bytes | Varints | pa.Array  # a constant, a varint column, or a binary column

_NULL_FIELD = b"\x01"  # zig-zag -1: a null key or value
_NO_HEADERS = b"\x00"
_RECORD_HEAD = b"\x00\x00"  # attributes, timestamp delta 0
_TWO = pa.scalar(2, U64)


class RowEncodingError(ValueError):
    """Rows the record format cannot carry (a null header, or one without a name)."""


def encode_rows(table: pa.Table, chunk_bytes: int = CHUNK_BYTES) -> list[EncodedRecords]:
    """The rows of ``table`` (:data:`~tidelog.spark.writing.ROWS_SCHEMA`) as one append's records, in chunks of
    about ``chunk_bytes`` of keys and values, the first at offset delta 0."""
    out: list[EncodedRecords] = []
    delta = 0
    for batch in table.combine_chunks().to_batches():  # a task's groups come in many small chunks: slices of one size
        for piece in _slices(batch, chunk_bytes):
            out.append(encode_batch(piece, delta))
            delta += piece.num_rows
    return out


def _slices(batch: pa.RecordBatch, chunk_bytes: int) -> list[pa.RecordBatch]:
    """``batch`` cut into slices of about ``chunk_bytes`` of keys and values, and at most :data:`MAX_CHUNK_ROWS`."""
    n = batch.num_rows
    if n == 0:
        return []
    size = sum(int(pc.sum(pc.binary_length(batch.column(name))).as_py() or 0) for name in ("value", "key"))
    rows = max(1, min(MAX_CHUNK_ROWS, n * chunk_bytes // max(size, 1)))
    return [batch.slice(start, rows) for start in range(0, n, rows)]


def encode_batch(batch: pa.RecordBatch, first_delta: int) -> EncodedRecords:
    """The rows of ``batch`` as records at offset deltas ``first_delta``, ``first_delta + 1``, …"""
    n = batch.num_rows
    deltas = Varints.of(pc.multiply(pc.add(ramp(n), pa.scalar(first_delta, U64)), _TWO))
    key_parts, key_size = field(batch.column("key"))
    value_parts, value_size = field(batch.column("value"))
    header_parts, header_size = header_section(batch.column("headers"))
    length = pc.add(deltas.sizes(), pa.scalar(len(_RECORD_HEAD), U64))
    for size in (key_size, value_size, header_size):
        length = pc.add(length, size)
    if isinstance(length, pa.Scalar):  # every part of one size: records of one length
        length = pa.repeat(length, n)
    parts = [Varints.of(pc.multiply(length, _TWO)), _RECORD_HEAD, deltas, *key_parts, *value_parts, *header_parts]
    return EncodedRecords(assemble(n, parts), n, first_delta)


def field(column: pa.Array) -> tuple[list[Part], pa.Scalar | pa.Array]:
    """A key or value column as parts (its size varints, its bytes), and the bytes each row's field takes."""
    n = len(column)
    if column.null_count == n:
        return [_NULL_FIELD], pa.scalar(1, U64)
    sizes = pc.cast(pc.binary_length(column), U64)
    varints = Varints.of(pc.fill_null(pc.multiply(sizes, _TWO), pa.scalar(1, U64)))
    data = column.fill_null(b"") if column.null_count else column
    return [varints, data], pc.add(varints.sizes(), pc.fill_null(sizes, pa.scalar(0, U64)))


def header_section(headers: pa.Array) -> tuple[list[Part], pa.Scalar | pa.Array]:
    """Each row's header section as parts (the count's varint, then the headers' bytes), and its size."""
    n = len(headers)
    if headers.null_count == n:
        return [_NO_HEADERS], pa.scalar(1, U64)
    counts = pc.fill_null(pc.list_value_length(headers), 0)
    pairs = headers.flatten()  # every row's headers, in order (a null row has none)
    names = pairs.field("key")
    if pairs.null_count or names.null_count:
        raise RowEncodingError("a header is null or has no name")
    names = names.cast(pa.binary())  # UTF-8: the bytes the record carries
    values = pairs.field("value")
    name_sizes = pc.cast(pc.binary_length(names), U64)
    value_sizes = pc.fill_null(pc.cast(pc.binary_length(values), U64), pa.scalar(0, U64))  # null: empty
    name_varints, value_varints = Varints.of(pc.multiply(name_sizes, _TWO)), Varints.of(pc.multiply(value_sizes, _TWO))
    values = values.fill_null(b"") if values.null_count else values
    encoded = assemble(len(pairs), [name_varints, names, value_varints, values])
    sizes = pc.add(pc.add(name_varints.sizes(), name_sizes), pc.add(value_varints.sizes(), value_sizes))
    ends = pc.cumulative_sum(sizes)  # where each header ends in ``encoded``
    row_ends = pc.cumulative_sum(counts)  # headers up to the end of each row
    offsets = pa.concat_arrays(
        [pa.array([0], U64), pc.take(pa.concat_arrays([pa.array([0], U64), ends]), pc.cast(row_ends, U64))]
    )
    per_row = pa.Array.from_buffers(
        pa.binary(), n, [None, pc.cast(offsets, pa.int32()).buffers()[1], pa.py_buffer(encoded)]
    )
    count_varints = Varints.of(pc.multiply(pc.cast(counts, U64), _TWO))
    return [count_varints, per_row], pc.add(count_varints.sizes(), pc.cast(pc.binary_length(per_row), U64))


# -- laying parts end to end ---------------------------------------------------------------------------------------


def assemble(n: int, parts: Sequence[Part]) -> memoryview:
    """``n`` rows of ``parts`` laid end to end, row after row (see the module docstring)."""
    columns: list[pa.Array | bytes] = []
    fixed: list[bytes | Varints] = []  # constants and one-width varints waiting to become one column
    for part in parts:
        if isinstance(part, bytes) or (isinstance(part, Varints) and part.width):
            fixed.append(part)
            continue
        if fixed:
            columns.append(_fixed_column(n, fixed))
            fixed = []
        columns.append(part.column() if isinstance(part, Varints) else part)
    if fixed:
        columns.append(_fixed_column(n, fixed))
    return _gather(n, columns)


def _fixed_column(n: int, parts: Sequence[bytes | Varints]) -> pa.Array | bytes:
    """Constants and one-width varints as one fixed-width binary column (only constants: one constant)."""
    if all(isinstance(part, bytes) for part in parts):
        return b"".join(part for part in parts if isinstance(part, bytes))
    widths = [len(part) if isinstance(part, bytes) else part.width for part in parts]
    total = sum(widths)
    if len(parts) == 1 and isinstance(parts[0], Varints):
        data: bytes | bytearray = parts[0].fixed()
    else:
        data = bytearray(n * total)
        at = 0
        for part, width in zip(parts, widths, strict=True):
            source = bytes(part) * n if isinstance(part, bytes) else part.fixed()
            for i in range(width):  # byte ``at + i`` of every row at once
                data[at + i :: total] = source[i::width]
            at += width
    column = pa.Array.from_buffers(pa.binary(total), n, [None, pa.py_buffer(data)])
    return column.cast(pa.binary())


def _gather(n: int, columns: Sequence[pa.Array | bytes]) -> memoryview:
    """Row ``r`` of every column (a constant: itself) in turn, for every row: concatenated, then one ``take``."""
    if len(columns) == 1 and isinstance(columns[0], pa.Array):
        return _section(columns[0])
    arrays: list[pa.Array] = []
    starts: list[int] = []
    steps: list[int] = []
    at = 0
    for column in columns:
        starts.append(at)
        if isinstance(column, bytes):
            arrays.append(pa.array([column], pa.binary()))
            steps.append(0)
            at += 1
        else:
            arrays.append(column)
            steps.append(1)
            at += n
    return _section(pc.take(pa.concat_arrays(arrays), _interleaving(n, tuple(starts), tuple(steps))))


_interleavings: dict[tuple[int, tuple[int, ...], tuple[int, ...]], pa.Array] = {}


def _interleaving(n: int, starts: tuple[int, ...], steps: tuple[int, ...]) -> pa.Array:
    """The ``take`` indices of :func:`_gather`: for row ``r`` and column ``c``, ``starts[c] + steps[c] * r``."""
    key = (n, starts, steps)
    indices = _interleavings.get(key)
    if indices is None:
        k = len(starts)
        position = ramp(n * k)
        row = pc.divide(position, pa.scalar(k, U64))
        column = pc.subtract(position, pc.multiply(row, pa.scalar(k, U64)))
        indices = pc.add(
            pc.take(pa.array(starts, U64), column), pc.multiply(pc.take(pa.array(steps, U64), column), row)
        )
        if len(_interleavings) >= 16:  # a task's slices come in a few shapes and sizes
            _interleavings.clear()
        _interleavings[key] = indices
    return indices


def _section(column: pa.Array) -> memoryview:
    """A binary column's values end to end: its data buffer between its first and last offset (not copied)."""
    n = len(column)
    offsets = memoryview(column.buffers()[1]).cast("i")
    start, end = offsets[column.offset], offsets[column.offset + n]
    return memoryview(column.buffers()[2])[start:end] if end > start else memoryview(b"")
