"""Checking a record section where it enters the broker: every record decodes, none is too large, and the
span of its timestamps.

A batch a client built is stored as it arrived, so one record that the readers cannot decode would stop every
consumer at that offset for good. :func:`check_records` accepts only what every decoder accepts: the rules of
:func:`tidelog.protocol.records.decode_records` and the stricter ones of the consumer's decoder
(:mod:`tidelog.client.records`: a null key or value is the one byte of -1, any other length at least 0; header
names UTF-8), with offset deltas running on one by one from ``first_delta``. It measures each record as
``max_message_bytes`` counts a message everywhere in tidelog (its key, value, header names and header values)
and returns the smallest and largest timestamp delta, for the caller to bound.

Runs. One record at a time costs ~3 µs of Python. A producer's records are laid out alike (no headers, a key and
a value of one size each, timestamp and offset deltas of one width), so, as the consumer's decoder does, a
record without headers followed by records beginning as it does starts a run: up to :data:`RUN_CHUNK` records
checked column by column — each byte position that must hold the same byte in all of them gathered by one
extended slice and compared at once, the varints' continuation bits likewise, the offset deltas against the
bytes they must be — and the bounds of their timestamp deltas found from their raw bytes in the lanes of one
big int (:func:`_ts_bounds`). A run takes
a record only when every byte it checks is one the record-by-record check accepts; the first record that differs
ends the run and is checked alone, which names what is wrong with it or starts the next run.
"""

from __future__ import annotations

import array
from typing import NamedTuple, TypeAlias

from tidelog.protocol.records.lanes import agreeing, zigzag_lanes
from tidelog.protocol.records.layout import MIN_RECORD_SIZE
from tidelog.protocol.records.varint import decode_varint
from tidelog.storage.errors import CorruptBatchError, RecordTooLargeError

Buffer: TypeAlias = bytes | memoryview

RUN_CHUNK = 4096  # records a run checks at a time: bounds the work a run that breaks early wastes
_MIN_RUN = 16  # a run's fixed cost pays off from about this many records
_RETRY_AFTER = 16  # records checked alone after a run that did not form, doubling after each miss
_COPY_BELOW = 4096  # record size below which a run copies its section first (see check_records)
_MAX_LANE_BYTES = 8  # varints wider than this do not fit a 64-bit lane: checked alone
_MIN_BODY = MIN_RECORD_SIZE - 1  # a record after its length: attributes, two deltas, two lengths, header count
_HIGH_BITS = bytes(b & 0x80 for b in range(256))  # each byte's continuation bit
_LOW_BIT = bytes(b & 1 for b in range(256))  # a zig-zag varint's first byte: its sign
_DELTA_1 = bytes(range(0, 128, 2))  # offset deltas 0..63 as one-byte zig-zag varints
_DELTA_2 = (  # offset deltas 0..8191 as two-byte zig-zag varints: their first bytes, their second bytes
    bytes(((d << 1) & 0x7F) | 0x80 for d in range(8192)),
    bytes(d >> 6 for d in range(8192)),
)
_CONTINUED = b"\x80" * RUN_CHUNK
_LAST = bytes(RUN_CHUNK)


class IrregularRecords(Exception):
    """More records than the caller's budget would have to be checked one by one (their layouts differ): the
    caller may check them again where a long check blocks nobody."""


class CheckedRecords(NamedTuple):
    """What a checked record section holds."""

    records: int
    min_timestamp_delta: int  # 0 when there are no records
    max_timestamp_delta: int


def check_records(
    data: bytes | memoryview, first_delta: int, max_message_bytes: int, alone_budget: int | None = None
) -> CheckedRecords:
    """Check that ``data`` is whole, decodable records with offset deltas ``first_delta, first_delta + 1, …``,
    none above ``max_message_bytes``.

    Raises :class:`CorruptBatchError` naming the record and what is wrong with it, and
    :class:`RecordTooLargeError` for a record above the limit. With ``alone_budget``, raises
    :class:`IrregularRecords` instead of checking more than that many records one by one (~4 µs each).
    """
    # Not copied when records are large: a copy of a produced batch (just off the socket, not in the CPU's cache)
    # costs more than the strided reads of each record's first bytes. Small records are copied (_COPY_BELOW).
    view: Buffer = data if isinstance(data, bytes) else memoryview(data).cast("B")
    total = len(view)
    p = k = 0
    low = high = 0
    retry, backoff = 0, _RETRY_AFTER
    alone = 0
    while p < total:
        alone += 1
        if alone_budget is not None and alone > alone_budget:
            raise IrregularRecords(f"more than {alone_budget} records to check one by one")
        try:
            end, ts, headerless = _one(view, p, total, first_delta + k, max_message_bytes)
        except CorruptBatchError as exc:  # a varint that does not decode: say whose
            if str(exc).startswith("record "):
                raise
            raise CorruptBatchError(f"record {first_delta + k}: {exc}") from None
        if not k or ts < low:
            low = ts
        if not k or ts > high:
            high = ts
        stride = end - p
        if headerless and k >= retry and (last := p + (_MIN_RUN - 1) * stride) < total and view[last] == view[p]:
            if stride < _COPY_BELOW and not isinstance(view, bytes):
                view = view.tobytes()  # small records: strided slices of bytes (~2 ns a byte, not ~13) pay for it
            run = _run(view, p, stride, total, first_delta + k)
            if run is not None:
                n, run_low, run_high = run
                low, high = min(low, run_low), max(high, run_high)
                k += n
                p += n * stride
                backoff = _RETRY_AFTER
                continue
            retry = k + backoff
            backoff += backoff
        k += 1
        p = end
    return CheckedRecords(k, low, high)


def _one(view: Buffer, p: int, total: int, delta: int, max_message_bytes: int) -> tuple[int, int, bool]:
    """Check the record at ``p``; return where it ends, its timestamp delta, and whether it has no headers."""
    z = view[p]
    if z < 0x80:  # one-byte varints inline: a function call per field doubles this record-by-record check
        length, p = (z >> 1) ^ -(z & 1), p + 1
    else:
        length, p = decode_varint(view, p, total)
    end = p + length
    if length < _MIN_BODY or end > total:
        raise CorruptBatchError(f"record {delta}: length {length} is impossible with {total - p} bytes left")
    p += 1  # attributes
    ts, p = decode_varint(view, p, end)
    z = view[p]
    if z < 0x80:
        offset_delta, p = (z >> 1) ^ -(z & 1), p + 1
    else:
        offset_delta, p = decode_varint(view, p, end)
    if offset_delta != delta:
        raise CorruptBatchError(f"record {delta}: offset delta {offset_delta}, expected {delta}")
    key, p = _field(view, p, end, delta, "key")
    value, p = _field(view, p, end, delta, "value")
    size = key + value
    if view[p] == 0 and p + 1 == end:  # no headers
        if size > max_message_bytes:
            raise RecordTooLargeError(_too_large(delta, size, max_message_bytes))
        return end, ts, True
    count, p = decode_varint(view, p, end)
    if count < 0 or count * 2 > end - p:
        raise CorruptBatchError(f"record {delta}: impossible header count {count}")
    for _ in range(count):
        name, q = decode_varint(view, p, end)
        if name < 0 or q + name > end:
            raise CorruptBatchError(f"record {delta}: header name of {name} bytes runs past its record")
        try:
            str(view[q : q + name], "utf-8")
        except UnicodeDecodeError:
            raise CorruptBatchError(f"record {delta}: header name is not UTF-8") from None
        header_value, p = decode_varint(view, q + name, end)
        if header_value < -1 or p + max(header_value, 0) > end:
            raise CorruptBatchError(f"record {delta}: header value of {header_value} bytes runs past its record")
        p += max(header_value, 0)
        size += name + max(header_value, 0)
    if p != end:
        raise CorruptBatchError(f"record {delta}: length does not match its fields")
    if size > max_message_bytes:
        raise RecordTooLargeError(_too_large(delta, size, max_message_bytes))
    return end, ts, not count


def _too_large(delta: int, size: int, limit: int) -> str:
    return f"record {delta} is {size} bytes (key, value and headers), above max_message_bytes ({limit})"


def _field(view: Buffer, p: int, end: int, delta: int, name: str) -> tuple[int, int]:
    """Skip a key or value at ``p``; return its size (0 when null) and the position after it."""
    z = view[p]
    if z == 1:  # -1 as one byte: null (the consumer's decoder reads null only so)
        return 0, p + 1
    if z < 0x80 and not z & 1:
        size, p = z >> 1, p + 1
    else:
        size, p = decode_varint(view, p, end)
    if size < 0 or p + size > end:
        raise CorruptBatchError(f"record {delta}: {name} of {size} bytes runs past its record")
    return size, p + size


def _varint_end(view: Buffer, p: int) -> int:
    while view[p] >= 0x80:
        p += 1
    return p + 1


def _run(view: Buffer, q: int, stride: int, total: int, d0: int) -> tuple[int, int, int] | None:
    """Check the records from ``q`` on laid out as the (checked, headerless) one at ``q`` and carrying offset
    deltas ``d0, d0 + 1, …``; return how many and the least and greatest timestamp delta among them, or None
    when fewer than _MIN_RUN are."""
    p = _varint_end(view, q)
    constants = list(range(p - q))  # the length
    ts_at = p + 1 - q  # after the attributes, which readers ignore
    delta_at = _varint_end(view, q + ts_at) - q
    p = _varint_end(view, q + delta_at)
    ts_width, delta_width = delta_at - ts_at, p - q - delta_at
    if ts_width > _MAX_LANE_BYTES or delta_width > _MAX_LANE_BYTES:
        return None
    for _ in range(2):  # the key's length, then the value's: the same in every record of the run
        length_end = _varint_end(view, p)
        constants += range(p - q, length_end - q)
        if view[p] == 1:  # null
            p = length_end
        else:
            size, p = decode_varint(view, p, length_end)
            p += size
    if p != q + stride - 1:  # a header count of more than one byte
        return None
    constants.append(stride - 1)
    n = min((total - q) // stride, RUN_CHUNK)
    if delta_width <= 2:  # the deltas' varints widen at 64 and at 8192: the run ends there
        n = min(n, (64 if delta_width == 1 else 8192) - d0)
    for at in range(ts_at - 1):
        # First how far the records share this one's length, which ends most runs (a wider timestamp delta makes
        # a longer record): the other positions are sliced only that far.
        column = _cut(view, q + at, n * stride, stride)
        same = bytes((view[q + at],)) * n
        if column != same:
            n = agreeing(column, same)
            if n < _MIN_RUN:
                return None
    found: list[bytes] = []
    wanted: list[bytes] = []
    step = n * stride
    for at in constants:
        found.append(_cut(view, q + at, step, stride))
        wanted.append(bytes((view[q + at],)) * n)
    ts_columns = _columns(view, q + ts_at, ts_width, n, stride)
    delta_columns = _columns(view, q + delta_at, delta_width, n, stride)
    for columns in (ts_columns, delta_columns):
        found += [column.translate(_HIGH_BITS) for column in columns]
        wanted += [_CONTINUED[:n]] * (len(columns) - 1)
        wanted.append(_LAST[:n])
    found.append(ts_columns[0].translate(_LOW_BIT))  # a timestamp delta below 0: the run ends before it
    wanted.append(_LAST[:n])
    if delta_width == 1:
        found.append(delta_columns[0])
        wanted.append(_DELTA_1[d0 : d0 + n])
    elif delta_width == 2:
        found += delta_columns
        wanted += (_DELTA_2[0][d0 : d0 + n], _DELTA_2[1][d0 : d0 + n])
    if found != wanted:
        n = min(agreeing(f, w) for f, w in zip(found, wanted, strict=True) if f != w)  # up to the first failure
        if n < _MIN_RUN:
            return None
    if delta_width > 2:
        deltas, ones = zigzag_lanes(delta_columns, n)
        expected = 2 * d0 * ones + 2 * _ramp(n)  # the zig-zag varint of d0 + i in lane i
        if deltas != expected:
            n = _first_lane(deltas ^ expected)
            if n < _MIN_RUN:
                return None
    return n, *_ts_bounds(ts_columns, n)


def _columns(view: Buffer, start: int, width: int, n: int, stride: int) -> list[bytes]:
    step = n * stride
    return [_cut(view, start + i, step, stride) for i in range(width)]


def _cut(view: Buffer, start: int, length: int, stride: int) -> bytes:
    """Every ``stride``-th byte of ``view[start : start + length]``."""
    column = view[start : start + length : stride]
    return column if isinstance(column, bytes) else column.tobytes()


def _first_lane(x: int) -> int:
    """The index of the lowest 64-bit lane of ``x`` that is not 0."""
    return ((x & -x).bit_length() - 1) >> 6


def _ts_bounds(columns: list[bytes], n: int) -> tuple[int, int]:
    """The least and greatest of ``n`` non-negative timestamp deltas, given the columns of their varints (each
    with the same continuation bits, checked).

    Varints of one width order as their raw bytes do read as little-endian integers (both are positional, with
    7-bit digits), so each record's raw bytes go undecoded in a lane of one big int (32 bits wide for varints of
    up to four bytes, 64 otherwise). When the lanes never decrease (a producer stamps its records as it sends
    them) the first and last are the bounds; otherwise they are found lane by lane.
    """
    size = 4 if len(columns) <= 4 else 8
    bits = size << 3
    lanes = bytearray(n * size)
    for i, column in enumerate(columns):
        lanes[i::size] = column[:n]
    raw = int.from_bytes(lanes, "little")
    guards, below_last = _guards(n, size)
    # Lane i: 2**(bits-1) + raw[i + 1] - raw[i], which keeps its top bit exactly when raw[i + 1] >= raw[i] (every
    # lane's top bit is clear: the last byte of a varint is below 0x80, so none borrows from the next). The last
    # lane compares with 0 and is not looked at.
    if not ~(((raw >> bits) | guards) - (raw & below_last)) & guards:
        least, greatest = raw & ((1 << bits) - 1), raw >> ((n - 1) * bits)
    else:
        values = array.array("I" if size == 4 else "Q")
        values.frombytes(lanes)
        least, greatest = min(values), max(values)
    return _decode_raw(least), _decode_raw(greatest)


def _decode_raw(raw: int) -> int:
    return decode_varint(raw.to_bytes(8, "little"), 0, 8)[0]


_guards_cache: dict[tuple[int, int], tuple[int, int]] = {}


def _guards(n: int, size: int) -> tuple[int, int]:
    """For ``n`` lanes of ``size`` bytes: the top bit of each of the first ``n - 1``, and all their bits."""
    key = (n, size)
    cached = _guards_cache.get(key)
    if cached is None:
        if len(_guards_cache) >= 64:
            _guards_cache.clear()
        top = (1 << (size * 8 - 1)).to_bytes(size, "little")
        cached = _guards_cache[key] = (
            int.from_bytes(top * (n - 1), "little"),
            (1 << ((n - 1) * size * 8)) - 1,
        )
    return cached


_ramps: dict[int, int] = {}


def _ramp(n: int) -> int:
    """``i`` in lane ``i`` of ``n`` 64-bit lanes."""
    ramp = _ramps.get(n)
    if ramp is None:
        if len(_ramps) >= 64:
            _ramps.clear()
        ramp = _ramps[n] = int.from_bytes(array.array("q", range(n)).tobytes(), "little")
    return ramp
