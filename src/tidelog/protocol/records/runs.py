"""Runs: records laid out alike, cut into byte columns and checked column by column. The one run machinery of the
fast decoders (the consumer's rows, :mod:`tidelog.protocol.records.rows`; the Spark source's columns,
:mod:`tidelog.spark.columns`; the produce-time validator, :mod:`tidelog.protocol.records.check`).

A producer's records are laid out alike (no headers, a key and a value of one size each, timestamp and offset
deltas of one width), so once one record's length is known, so are the positions of all its fields and of the
next record's. A decoder that meets a record without headers followed by records beginning as it does asks
:func:`read_layout` for that record's layout, then :func:`run_length` for how many of the records after it share
it: each byte position that must hold the same byte in all of them (the lengths of the record, its key and its
value, the zero header count) is gathered by one extended slice ``data[i::stride]`` and compared at once with
the bytes it must hold, as are the offset deltas (counting up one by one) and the continuation bits of both
deltas' varints. Every check made here is one the record-by-record parsers make of each record, with the same
outcome, so a record joins a run exactly when those parsers would accept it with the same fields; the run ends
before the first record that differs, which the decoder parses alone. What a decoder makes of a run (rows, Arrow
columns, a verdict) is its own: it gets the layout and the timestamp deltas' columns, decoded by
:mod:`tidelog.protocol.records.lanes`.
"""

from __future__ import annotations

import array
from typing import NamedTuple, TypeAlias

from tidelog.protocol.records.lanes import agreeing, zigzag_lanes

Buffer: TypeAlias = bytes | memoryview

MIN_RUN = 16  # records a run must hold: its fixed cost is that of parsing about this many one by one
RETRY_AFTER = 16  # records parsed one by one after a run that did not form, doubling after each miss
MAX_CHUNK = 4096  # the most records one call of run_length checks
_MAX_FIELD_LENGTH_BYTES = 3  # key and value lengths below 2**20 bytes; longer ones: records parsed one by one

_HIGH_BITS = bytes(b & 0x80 for b in range(256))  # each byte's continuation bit
_LOW_BIT = bytes(b & 1 for b in range(256))  # a zig-zag varint's first byte: its sign
_DELTA_1 = bytes(range(0, 128, 2))  # offset deltas 0..63 as one-byte zig-zag varints
_DELTA_2_LOW = bytes(((d << 1) & 0x7F) | 0x80 for d in range(8192))  # deltas 0..8191 as two-byte varints
_DELTA_2_HIGH = bytes(d >> 6 for d in range(8192))
_CONTINUED = b"\x80" * MAX_CHUNK
_LAST = bytes(MAX_CHUNK)


class Layout(NamedTuple):
    """Where the fields of a headerless record lie, as offsets from its first byte."""

    stride: int  # the record's size, length field included: where the next record of a run begins
    length_width: int  # bytes of its length varint
    ts_at: int  # its timestamp delta's varint
    ts_width: int
    delta_at: int  # its offset delta's varint
    delta_width: int
    constants: list[int]  # after the length: positions holding the same byte in every record of a run
    key: tuple[int, int] | None  # (position, size) of the key; None when null
    value: tuple[int, int] | None


def read_layout(data: Buffer, q: int, end: int, *, max_ts_width: int, max_delta_width: int) -> Layout | None:
    """The layout of the record at ``data[q:end]``, whose length is checked and whose last byte is a zero header
    count; None when no run can start with it (deltas wider than the caller decodes, a key or value length that
    is negative or runs past the record, anything between the value and the header count)."""
    p = q
    while data[p] >= 0x80:  # the length, already decoded
        p += 1
    p += 1
    length_width = p - q
    p += 1  # the attributes: read by no decoder
    ts_at = p - q
    while p < end and data[p] >= 0x80:
        p += 1
    p += 1
    delta_at = p - q
    while p < end and data[p] >= 0x80:
        p += 1
    p += 1
    ts_width, delta_width = delta_at - ts_at, p - q - delta_at
    if ts_width > max_ts_width or delta_width > max_delta_width:
        return None
    constants: list[int] = []
    fields: list[tuple[int, int] | None] = []
    for _field in range(2):  # the key, then the value
        if p >= end - 1:
            return None
        at = p - q
        if data[p] == 1:  # -1: null (every decoder reads null only as this one byte)
            constants.append(at)
            fields.append(None)
            p += 1
            continue
        z = shift = 0
        while True:
            byte = data[p]
            p += 1
            z |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
            if shift >= 7 * _MAX_FIELD_LENGTH_BYTES or p >= end:
                return None
        size = z >> 1
        if z & 1 or p + size > end - 1:  # negative, or past the record
            return None
        constants += range(at, p - q)
        fields.append((p - q, size))
        p += size
    if p != end - 1:  # the header count, zero (the caller checked), must be all that is left
        return None
    constants.append(end - 1 - q)
    key, value = fields
    return Layout(end - q, length_width, ts_at, ts_width, delta_at, delta_width, constants, key, value)


def run_length(
    data: Buffer, q: int, layout: Layout, n: int, d0: int, *, nonnegative_ts: bool = False
) -> tuple[int, list[bytes]]:
    """How many of the (at most ``n``, at most :data:`MAX_CHUNK`) records from ``q`` on are laid out as
    ``layout`` and carry the offset deltas ``d0, d0 + 1, …`` (0 when fewer than :data:`MIN_RUN`), and the columns
    of their timestamp deltas' varints (checked; they may run past that many records). ``nonnegative_ts`` also
    ends the run before a negative timestamp delta."""
    stride, delta_width = layout.stride, layout.delta_width
    if delta_width <= 2:  # the deltas' varints widen at 64 and at 8192: the run ends there
        n = min(n, (64 if delta_width == 1 else 8192) - d0)
    if n < MIN_RUN:
        return 0, []
    for at in range(layout.length_width):
        # First how far the records share this one's length, which ends most runs (a wider timestamp delta makes
        # a longer record): the other positions are sliced only that far.
        column = _cut(data, q + at, n * stride, stride)
        same = bytes((data[q + at],)) * n
        if column != same:
            n = agreeing(column, same)
            if n < MIN_RUN:
                return 0, []
    step = n * stride
    found = [_cut(data, q + at, step, stride) for at in layout.constants]
    wanted = [bytes((data[q + at],)) * n for at in layout.constants]
    ts_columns = [_cut(data, q + layout.ts_at + i, step, stride) for i in range(layout.ts_width)]
    delta_columns = [_cut(data, q + layout.delta_at + i, step, stride) for i in range(delta_width)]
    if delta_width == 1:
        found.append(delta_columns[0])
        wanted.append(_DELTA_1[d0 : d0 + n])
    elif delta_width == 2:
        found += delta_columns
        wanted += (_DELTA_2_LOW[d0 : d0 + n], _DELTA_2_HIGH[d0 : d0 + n])
    else:
        found += [column.translate(_HIGH_BITS) for column in delta_columns]
        wanted += [_CONTINUED[:n]] * (delta_width - 1)
        wanted.append(_LAST[:n])
    found += [column.translate(_HIGH_BITS) for column in ts_columns]
    wanted += [_CONTINUED[:n]] * (layout.ts_width - 1)
    wanted.append(_LAST[:n])
    if nonnegative_ts:
        found.append(ts_columns[0].translate(_LOW_BIT))
        wanted.append(_LAST[:n])
    if found != wanted:
        n = min(agreeing(f, w) for f, w in zip(found, wanted, strict=True) if f != w)  # up to the first failure
        if n < MIN_RUN:
            return 0, []
    if delta_width > 2:
        deltas, ones = zigzag_lanes(delta_columns, n)
        expected = 2 * d0 * ones + 2 * _ramp(n)  # the zig-zag varint of d0 + i in lane i
        if deltas != expected:
            n = _first_lane(deltas ^ expected)
            if n < MIN_RUN:
                return 0, []
    return n, ts_columns


def _cut(data: Buffer, start: int, length: int, stride: int) -> bytes:
    """Every ``stride``-th byte of ``data[start : start + length]``."""
    column = data[start : start + length : stride]
    return column if isinstance(column, bytes) else column.tobytes()


def _first_lane(x: int) -> int:
    """The index of the lowest 64-bit lane of ``x`` that is not 0."""
    return ((x & -x).bit_length() - 1) >> 6


_ramps: dict[int, int] = {}


def _ramp(n: int) -> int:
    """``i`` in lane ``i`` of ``n`` 64-bit lanes."""
    ramp = _ramps.get(n)
    if ramp is None:
        if len(_ramps) >= 64:
            _ramps.clear()
        ramp = _ramps[n] = int.from_bytes(array.array("q", range(n)).tobytes(), "little")
    return ramp
