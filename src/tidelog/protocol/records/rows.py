"""The consumer's row decoder: a record section becomes :class:`ConsumerRecord` tuples, as fast as Python allows.

Decoding is the consumer's per-record hot path, so :func:`parse_records` reads the record format
(:mod:`tidelog.protocol.records.layout`) with every varint decoded inline, values sliced from one ``bytes`` of the
section, and records built as tuples (``tuple.__new__`` over a NamedTuple subclass). It validates at least what
:func:`~tidelog.protocol.records.decode.decode_records` validates; ``tests/protocol/records/test_agreement.py``
checks they agree on every record shape and codec.

Runs of records laid out alike (the producer's common case) are found and checked by
:mod:`tidelog.protocol.records.runs`; this module decodes a run without a per-record Python step: timestamps from
the lanes of one big int (:func:`~tidelog.protocol.records.lanes.timestamp_lanes`), keys and values by
``Struct.iter_unpack``, records by ``map(tuple.__new__, repeat(ConsumerRecord), zip(...))``. Where the layout
changes (the offset delta's varint grows at 64, the timestamp delta's at about 1 ms) a run ends, the record is
parsed alone, and the next run begins. Why each of these choices: ``docs/performance.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import islice, repeat
from operator import itemgetter
from struct import Struct
from typing import NamedTuple

from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.lanes import timestamp_lanes
from tidelog.protocol.records.layout import INT64_MAX, INT64_MIN, BatchHeader
from tidelog.protocol.records.runs import RETRY_AFTER, read_layout, run_length
from tidelog.protocol.records.varint import decode_varint


class ConsumerRecord(NamedTuple):
    """One record as a consumer sees it. ``timestamp`` is ns since the Unix epoch."""

    stream: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


def parse_records(data: bytes, header: BatchHeader, stream: str, partition: int) -> list[ConsumerRecord]:
    """The records of an uncompressed record section (see the module docstring for why it looks like this)."""
    try:
        return _parse(data, header, stream, partition)
    except IndexError:
        raise CorruptBatchError("a record runs past the end of its batch") from None


def _parse(data: bytes, header: BatchHeader, stream: str, partition: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    append = out.append
    new, cls = tuple.__new__, ConsumerRecord  # ConsumerRecord._make minus a Python-level call per record
    base, first_ts, last_delta = header.base_offset, header.first_timestamp, header.last_offset_delta
    ts_low, ts_high = INT64_MIN - first_ts, INT64_MAX - first_ts  # timestamp deltas whose timestamp fits int64
    total = len(data)
    previous = -1
    p = 0
    count = header.record_count
    records = iter(range(count))  # a run takes several at once
    retry, backoff = 0, RETRY_AFTER  # no run is tried before record ``retry``: bounds the work misses waste
    # Each field is a zig-zag varint ``z``. One- and two-byte varints are decoded inline (lengths, offset deltas
    # and values up to 8 KiB), longer ones by _rest (nanosecond timestamp deltas, large values). Checks against
    # ``end`` come after each field, as in the storage codec; an index past the data raises IndexError.
    for k in records:
        q = p
        z = data[p]
        if z < 0x80:
            p += 1
        elif (byte := data[p + 1]) < 0x80:
            z = (z & 0x7F) | (byte << 7)
            p += 2
        else:
            z, p = _rest(data, p + 1, z)
        length = (z >> 1) ^ -(z & 1)
        end = p + length
        if length < 6 or end > total:  # 6: _MIN_RECORD_BODY, a constant rather than a global lookup
            raise CorruptBatchError(f"record length {length} is impossible here")
        # A record without headers (its last byte a zero header count) with records beginning as it does after
        # it and 15 records on (MIN_RUN - 1, inlined) may start a run of records laid out alike: the
        # producer's common case, decoded column-wise by _run. Only ints are compared: this runs per record.
        if (
            k >= retry
            and data[end - 1] == 0
            and (last := q + 15 * (end - q)) < total
            and data[last] == data[q] == data[end]
        ):
            n = _run(data, q, end, k, count, previous, last_delta, base, first_ts, stream, partition, out)
            if n:
                next(islice(records, n - 2, None), None)  # the run's records after this one
                p = q + n * (end - q)
                previous += n
                backoff = RETRY_AFTER
                continue
            retry = k + backoff  # no run here: parse one by one for a while, longer after each miss
            backoff += backoff
        z = data[p + 1]  # data[p] holds the attributes; then the timestamp delta, 3 to 5 bytes when stamped in ns
        if z < 0x80:
            p += 2
        else:  # unrolled up to five bytes (deltas below 2**34 ns, about 17 s): a loop costs twice as much
            byte = data[p + 2]
            z = (z & 0x7F) | ((byte & 0x7F) << 7)
            if byte < 0x80:
                p += 3
            else:
                byte = data[p + 3]
                z |= (byte & 0x7F) << 14
                if byte < 0x80:
                    p += 4
                else:
                    byte = data[p + 4]
                    z |= (byte & 0x7F) << 21
                    if byte < 0x80:
                        p += 5
                    else:
                        byte = data[p + 5]
                        z |= (byte & 0x7F) << 28
                        p += 6
                        if byte >= 0x80:
                            z, p = _rest_from(data, p, z, 35)
        ts = (z >> 1) ^ -(z & 1)
        if not ts_low <= ts <= ts_high:  # as the run path (int64 lanes) and the canonical decoder refuse it
            raise CorruptBatchError(f"record timestamp {first_ts} + {ts} is outside int64")
        z = data[p]
        if z < 0x80:
            p += 1
        elif (byte := data[p + 1]) < 0x80:
            z = (z & 0x7F) | (byte << 7)
            p += 2
        else:
            z, p = _rest(data, p + 1, z)
        delta = (z >> 1) ^ -(z & 1)
        if not previous < delta <= last_delta:
            raise CorruptBatchError(f"record offset delta {delta} out of order or outside the batch")
        previous = delta
        z = data[p]
        if z == 1:  # -1: no key
            key = None
            p += 1
        else:
            if z < 0x80:
                p += 1
            else:
                z, p = _rest(data, p + 1, z)
            size = (z >> 1) ^ -(z & 1)
            if size < 0 or p + size > end:
                raise CorruptBatchError(f"key of {size} bytes runs past its record")
            key = data[p : p + size]
            p += size
        z = data[p]
        if z == 1:  # -1: no value (a tombstone)
            value = None
            p += 1
        else:
            if z < 0x80:
                p += 1
            elif (byte := data[p + 1]) < 0x80:
                z = (z & 0x7F) | (byte << 7)
                p += 2
            else:
                z, p = _rest(data, p + 1, z)
            size = (z >> 1) ^ -(z & 1)
            if size < 0 or p + size > end:
                raise CorruptBatchError(f"value of {size} bytes runs past its record")
            value = data[p : p + size]
            p += size
        if data[p] == 0:
            headers: tuple[tuple[str, bytes], ...] = ()
            p += 1
        else:
            headers, p = _headers(data, p, end)
        if p != end:
            raise CorruptBatchError("record length does not match its fields")
        append(new(cls, (stream, partition, base + delta, first_ts + ts, key, value, headers)))
    if p != total:
        raise CorruptBatchError(f"{total - p} stray bytes after the last record")
    return out


def _rest(data: bytes, p: int, first: int) -> tuple[int, int]:
    """Finish a varint whose first byte ``first`` had its continuation bit set; returns the zig-zag value."""
    return _rest_from(data, p, first & 0x7F, 7)


def _rest_from(data: bytes, p: int, z: int, shift: int) -> tuple[int, int]:
    """Finish a varint whose low ``shift`` bits ``z`` are decoded and whose next byte is at ``p``."""
    while True:
        byte = data[p]
        p += 1
        z |= (byte & 0x7F) << shift
        if byte < 0x80:
            if shift == 63 and byte > 1:
                raise CorruptBatchError("varint overflows 64 bits")
            return z, p
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint longer than ten bytes")


def _headers(data: bytes, p: int, end: int) -> tuple[tuple[tuple[str, bytes], ...], int]:
    count, p = decode_varint(data, p, end)
    if count < 0 or count * 2 > end - p:
        raise CorruptBatchError(f"impossible header count {count}")
    headers = []
    for _ in range(count):
        fields: list[bytes] = []
        for field in range(2):
            size, p = decode_varint(data, p, end)
            if size < -field or p + size > end:  # a name is never null (< 0); a value of -1 reads as empty
                raise CorruptBatchError(f"header field of {size} bytes runs past its record")
            fields.append(data[p : p + size] if size > 0 else b"")
            p += max(size, 0)
        try:
            name = fields[0].decode()
        except UnicodeDecodeError as exc:
            raise CorruptBatchError("header name is not UTF-8") from exc
        headers.append((name, fields[1]))
    return tuple(headers), p


_RUN_CHUNK = 512  # records checked at a time: bounds the work a run that breaks early wastes
_FIRST = itemgetter(0)
_new = tuple.__new__


def _run(
    data: bytes,
    q: int,
    end: int,
    k: int,
    count: int,
    previous: int,
    last_delta: int,
    base: int,
    first_ts: int,
    stream: str,
    partition: int,
    out: list[ConsumerRecord],
) -> int:
    """Decode the records from ``q`` on laid out exactly as the one at ``data[q:end]`` and carrying the offset
    deltas after ``previous`` one by one (:mod:`tidelog.protocol.records.runs`); return how many (none when fewer
    than MIN_RUN are). Each passes exactly the checks _parse would make of it, with the same fields."""
    layout = read_layout(data, q, end, max_ts_width=5, max_delta_width=2)
    if layout is None:
        return 0
    stride = layout.stride
    d0 = previous + 1
    n = min(count - k, (len(data) - q) // stride, last_delta - previous, _RUN_CHUNK)
    n, columns = run_length(data, q, layout, n, d0)
    if not n:
        return 0
    keys = None if layout.key is None else _field_struct(*layout.key, stride)
    values = None if layout.value is None else _field_struct(*layout.value, stride)
    view = memoryview(data)[q : q + n * stride]
    out += map(
        _new,
        repeat(ConsumerRecord, n),
        zip(
            repeat(stream, n),
            repeat(partition, n),
            range(base + d0, base + d0 + n),
            _timestamps(columns, n, first_ts),
            repeat(None, n) if keys is None else map(_FIRST, keys.iter_unpack(view)),
            repeat(None, n) if values is None else map(_FIRST, values.iter_unpack(view)),
            repeat((), n),
            strict=True,
        ),
    )
    return n


def _timestamps(columns: list[bytes], n: int, first_ts: int) -> Sequence[int]:
    """The timestamps of ``n`` records whose timestamp deltas' varint bytes (checked) are ``columns``
    (:func:`~tidelog.protocol.records.lanes.timestamp_lanes`, read back by one ``struct.unpack``)."""
    return _int64s(n)(timestamp_lanes(columns, n, first_ts)[0])


_int64_structs: dict[int, Callable[[bytes], tuple[int, ...]]] = {}


def _int64s(n: int) -> Callable[[bytes], tuple[int, ...]]:
    r"""The unpacker of ``n`` little-endian ``int64``\ s."""
    unpack = _int64_structs.get(n)
    if unpack is None:
        if len(_int64_structs) >= 64:
            _int64_structs.clear()
        unpack = _int64_structs[n] = Struct(f"<{n}q").unpack
    return unpack


_field_structs: dict[tuple[int, int, int], Struct] = {}


def _field_struct(at: int, size: int, stride: int) -> Struct:
    """Unpacks the ``size`` bytes at ``at`` of each ``stride``-byte record: the keys or values of a run."""
    key = (at, size, stride)
    field = _field_structs.get(key)
    if field is None:
        if len(_field_structs) >= 64:
            _field_structs.clear()
        field = _field_structs[key] = Struct(f"<{at}x{size}s{stride - at - size}x")
    return field
