"""What the consumer hands out: fetched batches, and records decoded from them on demand.

A fetch response's payload is whole record batches exactly as stored. :func:`batches_of` cuts it into
:class:`FetchedBatch` views (per-batch work: a header parse and a hardware CRC), and nothing is decoded until a
caller asks a batch for its records. Counting records, measuring throughput or forwarding batches elsewhere
therefore costs nothing per record.

The first batch of a response may begin before the offset that was asked for (a fetch returns the whole batch
holding the offset); a batch knows the consumer's position when it was fetched (``start``) and its records and
counts leave out what lies before it, so nothing is delivered twice.

Decoding is the consumer's per-record hot path, so the record section (decompressed first when the batch is
compressed: :func:`~tidelog.protocol.records.record_section`) is parsed here by :func:`_parse_records`, the
record format of :mod:`tidelog.protocol.records` with every varint decoded inline (a function call per field was
half the cost), values sliced from one ``bytes`` of the section, and records built as tuples: about twice as
fast as ``decode_records`` for 1 KiB records. It validates at least what
:func:`~tidelog.protocol.records.decode_records` validates, and ``tests/client/test_records.py`` checks the two
agree on every record shape and codec, and on damaged input (refused, or read as the codec reads it).

Runs. Even so a record cost ~1200 ns (1 KiB values, 100 a batch), most of it bytecode. But the producer's
records (no key, no headers, a value of one size, stamped in ns) are laid out alike: once a record's length is
known, so are the positions of all its fields, and of the next record's. So when a record without headers is
followed by records beginning as it does, :func:`_run` checks up to 512 of them at once, each byte position
that must match by one extended slice (``data[i::stride]``) compared against the bytes expected (the shared
length bytes, the offset deltas counting up, the timestamp delta's continuation bits), and decodes those that
pass without a per-record Python step: timestamps SWAR-wise in one big int, keys and values by
``Struct.iter_unpack``, records by ``map(tuple.__new__, repeat(ConsumerRecord), zip(...))``. Where the layout
changes (the offset delta's varint grows at 64, the timestamp delta's at about 1 ms) a run ends, the record is
parsed one by one, and the next run begins. Measured per record on the build machine (medians, loaded, 2
cores): the producer's shape 1220 -> ~720 ns at 100 records a batch, 1400 -> ~480 ns at 500; keyed records with
headers (never a run) ~4500 ns before and after.

What decided the details (per record, runs of 60-100 unless said):

- building records: ``map(tuple.__new__, ...)`` over a ``zip`` (whose tuple is reused) 144 ns; the per-record
  ``tuple.__new__(cls, (...))`` of the loop 172, ``starmap(ConsumerRecord, ...)`` 255, ``map(ConsumerRecord,
  ...)`` 280 (NamedTuple's ``__new__`` is Python). Plain tuples would be 51: the subclass is the floor.
- values: ``Struct("<{at}x{size}s{rest}x").iter_unpack`` 86 ns, a comprehension of slices 126, ``map`` over
  ``slice`` objects 190; one Struct for the whole run 58 but compiled per run length (2.7 µs per 100).
- timestamp deltas: SWAR in 64-bit lanes (a lane per record, each varint byte's 7 bits masked and shifted into
  place for all lanes at once, the first timestamp added per lane, read back by one ``struct.unpack``) 41 ns at
  500, 79 at 62, 270 at 9; a comprehension over the byte columns 126-177; 32-bit lanes plus ``map(int.__add__)``
  for the first timestamp 66-100.
- a run's fixed cost (its layout read, ~10 slices compared, the big-int setup) is 7-10 µs, so a run must hold
  16 records (_MIN_RUN) to beat parsing them one by one (~1.2 µs each); the test that may start one compares
  only ints, and after a miss the next try waits 16 records, doubling each time (a shape that never forms runs
  pays only the test). GC: ConsumerRecords are GC-tracked either way; timings with ``gc`` disabled were within
  noise of enabled ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from itertools import islice, repeat
from operator import itemgetter
from struct import Struct
from typing import NamedTuple

from tidelog.protocol.records import BatchHeader, decode_varint, iter_batches, record_section
from tidelog.protocol.records.lanes import agreeing, timestamp_lanes
from tidelog.storage.errors import CorruptBatchError

_MIN_RECORD_BODY = 6  # attributes, two deltas, key length, value length, header count: a byte each at least


class ConsumerRecord(NamedTuple):
    """One record as a consumer sees it. ``timestamp`` is ns since the Unix epoch."""

    stream: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


class FetchedBatch:
    """One record batch of a partition, as fetched; records are decoded only when asked for."""

    __slots__ = ("data", "header", "partition", "start", "stream")

    def __init__(self, stream: str, partition: int, header: BatchHeader, data: memoryview, start: int) -> None:
        self.stream = stream
        self.partition = partition
        self.header = header
        self.data = data  # the whole batch, header included: a view into the response
        self.start = start  # records below this offset were delivered before

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def next_offset(self) -> int:
        """The offset after the batch's last one: where reading continues."""
        return self.header.next_offset

    @property
    def record_count(self) -> int:
        """Records of this batch at or after ``start``; decodes only a batch that straddles ``start`` and was
        compacted (its offsets are not dense)."""
        header = self.header
        if header.base_offset >= self.start:
            return header.record_count
        if header.record_count == header.last_offset_delta + 1:
            return max(0, header.next_offset - self.start)
        return len(self.records())

    def records(self) -> list[ConsumerRecord]:
        """The decoded records at or after ``start``, in offset order."""
        header = self.header
        section = record_section(self.data, 0, header=header)
        records = _parse_records(
            section if isinstance(section, bytes) else bytes(section), header, self.stream, self.partition
        )
        if header.base_offset < self.start:
            return [r for r in records if r.offset >= self.start]
        return records

    def __repr__(self) -> str:
        h = self.header
        offsets = f"{h.base_offset}..{h.last_offset}"
        return f"FetchedBatch({self.stream}/{self.partition}, offsets={offsets}, records={h.record_count})"


def batches_of(
    payload: memoryview, stream: str, partition: int, start: int, *, verify: bool = True
) -> list[FetchedBatch]:
    """Cut a fetch payload into batches, checking each one's CRC when ``verify`` (raises ``CorruptBatchError``)."""
    return [
        FetchedBatch(stream, partition, header, payload[position : position + header.size], start)
        for position, header in iter_batches(payload, verify=verify)
        if header.next_offset > start
    ]


def batches_before_corruption(payload: memoryview, stream: str, partition: int, start: int) -> list[FetchedBatch]:
    """The batches of a fetch payload that precede its first torn or CRC-failing batch (after
    :func:`batches_of` raised): what can still be delivered before the damage."""
    good: list[FetchedBatch] = []
    with contextlib.suppress(CorruptBatchError):
        for position, header in iter_batches(payload, verify=True):
            if header.next_offset > start:
                good.append(FetchedBatch(stream, partition, header, payload[position : position + header.size], start))
    return good


def _parse_records(data: bytes, header: BatchHeader, stream: str, partition: int) -> list[ConsumerRecord]:
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
    total = len(data)
    previous = -1
    p = 0
    count = header.record_count
    records = iter(range(count))  # a run takes several at once
    retry, backoff = 0, _RETRY_AFTER  # no run is tried before record ``retry``: bounds the work misses waste
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
        # it and 15 records on (_MIN_RUN - 1, inlined) may start a run of records laid out alike: the
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
                backoff = _RETRY_AFTER
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
        for _field in range(2):
            size, p = decode_varint(data, p, end)
            if p + size > end:
                raise CorruptBatchError(f"header field of {size} bytes runs past its record")
            fields.append(data[p : p + size] if size > 0 else b"")
            p += max(size, 0)
        try:
            name = fields[0].decode()
        except UnicodeDecodeError as exc:
            raise CorruptBatchError("header name is not UTF-8") from exc
        headers.append((name, fields[1]))
    return tuple(headers), p


_MIN_RUN = 16  # records a run must hold to be decoded column-wise: fewer are parsed faster one by one
_RUN_CHUNK = 512  # records checked at a time: bounds the work a run that breaks early wastes
_RETRY_AFTER = 16  # records parsed one by one after a missed run before trying again (doubling after each miss)

_HIGH_BITS = bytes(b & 0x80 for b in range(256))  # each byte's continuation bit
_DELTA_1 = bytes(range(0, 128, 2))  # offset deltas 0..63 as one-byte zig-zag varints
_DELTA_2 = (  # offset deltas 0..8191 as two-byte zig-zag varints: their first bytes, their second bytes
    bytes(((d << 1) & 0x7F) | 0x80 for d in range(8192)),
    bytes(d >> 6 for d in range(8192)),
)
_CONTINUED = b"\x80" * _RUN_CHUNK
_LAST = bytes(_RUN_CHUNK)
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
    deltas after ``previous`` one by one; return how many (none when fewer than _MIN_RUN are).

    Only the record's length is known valid. Its layout is read here; then for up to _RUN_CHUNK records each
    byte position that must hold the same byte in all of them (lengths of the record, key and value, the zero
    header count) is gathered by an extended slice and compared at once, as are the continuation bits of the
    timestamp delta and the offset delta bytes expected. Every check that holds for a record is one that _parse
    would have made of it, with the same outcome, so a record passes exactly when _parse would decode it to the
    same fields; the run ends before the first that does not (_parse takes it from there).
    """
    stride = end - q
    total = len(data)
    n = min(count - k, (total - q) // stride, last_delta - previous, _RUN_CHUNK)
    # First how far records share this one's length (the first bytes of each), which ends most runs.
    p = q
    while data[p] >= 0x80:  # the length, already decoded
        p += 1
    p += 1
    for at in range(p - q):
        column = data[q + at : q + at + n * stride : stride]
        if column != data[q + at : q + at + 1] * n:
            n = agreeing(column, data[q + at : q + at + 1] * n)
    if n < _MIN_RUN:
        return 0
    p += 1  # the attributes
    ts_at = p - q
    while p < end and data[p] >= 0x80:
        p += 1
    p += 1
    delta_at = p - q
    while p < end and data[p] >= 0x80:
        p += 1
    p += 1
    ts_width, delta_width = delta_at - ts_at, p - q - delta_at
    if ts_width > 5 or delta_width > 2 or p >= end:
        return 0
    constants = []  # positions holding the same byte in every record of the run
    fields: list[Struct | None] = []
    for _field in range(2):  # the key, then the value
        at = p - q
        if data[p] == 1:  # null
            constants.append(at)
            fields.append(None)
            p += 1
        else:
            z = shift = 0
            while p < end and shift < 21:
                byte = data[p]
                p += 1
                z |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            else:
                return 0
            if z & 1 or p + (z >> 1) > end:  # negative, or past the record: _parse refuses it
                return 0
            constants += range(at, p - q)
            fields.append(_field_struct(p - q, z >> 1, stride))
            p += z >> 1
    if p != end - 1:  # anything but a one-byte header count, zero as the gate in _parse found
        return 0
    constants.append(p - q)
    keys, values = fields
    n = min(n, (64 if delta_width == 1 else 8192) - previous - 1)
    if n < _MIN_RUN:
        return 0
    # The other checks at once: the bytes at each checked position of the n records, and what they must be.
    step = n * stride
    found = [data[q + at : q + at + step : stride] for at in constants]
    wanted = [data[q + at : q + at + 1] * n for at in constants]
    d0 = previous + 1
    at = q + delta_at
    if delta_width == 1:
        found.append(data[at : at + step : stride])
        wanted.append(_DELTA_1[d0 : d0 + n])
    else:
        found += (data[at : at + step : stride], data[at + 1 : at + 1 + step : stride])
        wanted += (_DELTA_2[0][d0 : d0 + n], _DELTA_2[1][d0 : d0 + n])
    at = q + ts_at
    columns = [data[at + i : at + i + step : stride] for i in range(ts_width)]
    found += [column.translate(_HIGH_BITS) for column in columns]
    wanted += [_CONTINUED[:n]] * (ts_width - 1)
    wanted.append(_LAST[:n])
    if found != wanted:
        n = min(map(agreeing, found, wanted))  # up to the first record that fails a check
        if n < _MIN_RUN:
            return 0
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
