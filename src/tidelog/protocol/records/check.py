"""Checking a record section where it enters the broker: every record decodes, none is too large, and the
span of its timestamps.

A batch a client built is stored as it arrived, so one record that the readers cannot decode would stop every
consumer at that offset for good. :func:`check_records` accepts only what every decoder accepts: the rules of
:func:`tidelog.protocol.records.decode_records` and the stricter ones of the consumer's decoder
(:mod:`tidelog.protocol.records.rows`: a null key or value is the one byte of -1, any other length at least 0;
header names UTF-8), with offset deltas running on one by one from ``first_delta``. It measures each record as
``max_message_bytes`` counts a message everywhere in tidelog (its key, value, header names and header values)
and returns the smallest and largest timestamp delta, for the caller to bound.

Runs. A producer's records are laid out alike, so, as the other fast decoders do, a record without headers
followed by records beginning as it does starts a run (:mod:`tidelog.protocol.records.runs`): up to
:data:`RUN_CHUNK` records checked column by column, and the bounds of their timestamp deltas found from their raw
bytes in the lanes of one big int (:func:`_ts_bounds`). A run takes a record only when every byte it checks is
one the record-by-record check accepts; the first record that differs ends the run and is checked alone, which
names what is wrong with it or starts the next run.
"""

from __future__ import annotations

import array
from typing import NamedTuple, TypeAlias

from tidelog.protocol.records.errors import CorruptBatchError, RecordTooLargeError
from tidelog.protocol.records.layout import MIN_RECORD_SIZE
from tidelog.protocol.records.runs import MAX_CHUNK, MIN_RUN, RETRY_AFTER, read_layout, run_length
from tidelog.protocol.records.varint import decode_varint

Buffer: TypeAlias = bytes | memoryview

RUN_CHUNK = MAX_CHUNK  # records a run checks at a time: bounds the work a run that breaks early wastes
_COPY_BELOW = 4096  # record size below which a run copies its section first (see check_records)
_MAX_LANE_BYTES = 8  # varints wider than this do not fit a 64-bit lane: checked alone
_MIN_BODY = MIN_RECORD_SIZE - 1  # a record after its length: attributes, two deltas, two lengths, header count


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
    retry, backoff = 0, RETRY_AFTER
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
        except IndexError:  # a field's first byte past the section (read inline, unchecked: found by fuzzing)
            raise CorruptBatchError(f"record {first_delta + k} runs past the end of its batch") from None
        if not k or ts < low:
            low = ts
        if not k or ts > high:
            high = ts
        stride = end - p
        if headerless and k >= retry and (last := p + (MIN_RUN - 1) * stride) < total and view[last] == view[p]:
            if stride < _COPY_BELOW and not isinstance(view, bytes):
                view = view.tobytes()  # small records: strided slices of bytes (~2 ns a byte, not ~13) pay for it
            run = _run(view, p, stride, total, first_delta + k)
            if run is not None:
                n, run_low, run_high = run
                low, high = min(low, run_low), max(high, run_high)
                k += n
                p += n * stride
                backoff = RETRY_AFTER
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


def _run(view: Buffer, q: int, stride: int, total: int, d0: int) -> tuple[int, int, int] | None:
    """Check the records from ``q`` on laid out as the (checked, headerless) one at ``q`` and carrying offset
    deltas ``d0, d0 + 1, …`` (:mod:`tidelog.protocol.records.runs`); return how many and the least and greatest
    timestamp delta among them, or None when fewer than MIN_RUN are."""
    layout = read_layout(view, q, q + stride, max_ts_width=_MAX_LANE_BYTES, max_delta_width=_MAX_LANE_BYTES)
    if layout is None:
        return None
    n, ts_columns = run_length(view, q, layout, min((total - q) // stride, RUN_CHUNK), d0, nonnegative_ts=True)
    if not n:
        return None
    return n, *_ts_bounds(ts_columns, n)


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
