"""Fetched record batches → one Arrow record batch: the source's hot path, with no Python object per record.

A Spark task of the ``tidelog`` source reads one partition's offset range and yields ``pyarrow.RecordBatch``es
of :data:`~tidelog.spark.schema.ARROW_SCHEMA`. :class:`ColumnBuilder` takes the batches as the consumer fetched
them (:class:`~tidelog.client.FetchedBatch`: raw bytes, CRC-checked) and decodes their record sections straight
into columns. Decoding records into :class:`~tidelog.client.ConsumerRecord` tuples and transposing them cost
about 700 ns a record (100-byte values), more than Spark spends on the row; this costs a tenth of that for the
records producers and NATS ingest write.

Runs. The record layout is in :mod:`tidelog.protocol.records`; why consecutive records of a batch usually share
one layout (no key or a key of one size, values of one size, no headers) is in :mod:`tidelog.client.records`,
whose decoder finds such *runs* of records and reads them column-wise. Here a run goes further: its records sit
at a fixed stride in the section, so the section *is* an Arrow ``fixed_size_binary(stride)`` array of them, and
one ``binary_slice`` kernel cuts every record's value (or key) out of it, in C. What must hold for a run is
checked for all its records at once, each byte position that must be equal across them (lengths, the header
count) or follow a known sequence (offset deltas counting up, the continuation bits of the timestamp delta) by
one extended slice ``data[i::stride]`` compared with the bytes expected; timestamps are decoded SWAR-wise in one
big integer whose 64-bit lanes are the little-endian ``int64`` buffer Arrow wants. Records that fit no run (keys
of varying size, headers, compacted batches) are parsed one by one, with the same checks as
:func:`~tidelog.protocol.records.decode_records`; ``tests/spark/test_columns.py`` checks both paths against
:meth:`FetchedBatch.records` for every record shape and codec.

Offsets are kept as ranges (a run, or consecutive single records, extend one) and become one vectorised add
over a cached ``0..n`` array; constant columns (stream, partition, the partition's subject) are repeated by
Arrow. Timestamps are stored in ns and Spark's are µs: one ``divide`` kernel per built batch.

Control batches (none are written yet; Kafka's transaction markers are the model) carry no records for readers
and are skipped.
"""

from __future__ import annotations

import array
import sys

import pyarrow as pa
import pyarrow.compute as pc

from tidelog.api.liftbridge import RESERVED_PREFIX, SUBJECT
from tidelog.client import FetchedBatch
from tidelog.protocol.records import BatchHeader, decode_varint, record_section
from tidelog.protocol.records.lanes import agreeing, timestamp_lanes
from tidelog.spark.schema import ARROW_SCHEMA, HEADERS_TYPE, TIMESTAMP_TYPE
from tidelog.storage.errors import CorruptBatchError

if sys.byteorder != "little":  # pragma: no cover - Arrow buffers are little-endian; so are the lanes built here
    raise ImportError("tidelog.spark.columns builds little-endian buffers and needs a little-endian machine")

Headers = list[tuple[str, bytes]]

_MIN_RECORD_BODY = 6  # attributes, two deltas, key length, value length, header count: a byte each at least
_MIN_RUN = 16  # records a run must hold: its fixed cost (~15 µs) is that of parsing about 16 one by one
_RUN_CHUNK = 4096  # records checked at once: bounds the work a run that breaks early wastes
_RETRY_AFTER = 16  # records parsed one by one after a missed run before the next try (doubling after each miss)
_MAX_TS_WIDTH = 8  # timestamp-delta varint bytes a run decodes (56 bits, deltas of years); longer: one by one

_INT32_MAX = 2**31 - 1
_THOUSAND = pa.scalar(1000, pa.int64())  # compute kernels given a Python int try to import numpy on every call
_HIGH_BITS = bytes(b & 0x80 for b in range(256))  # each byte's continuation bit
_CONTINUED = b"\x80" * _RUN_CHUNK
_LAST = bytes(_RUN_CHUNK)
_DELTA_1 = bytes(range(0, 128, 2))  # offset deltas 0..63 as one-byte zig-zag varints
_DELTA_2_LOW = bytes(((d << 1) & 0x7F) | 0x80 for d in range(8192))  # deltas 0..8191 as two-byte varints
_DELTA_2_HIGH = bytes(d >> 6 for d in range(8192))


class _Binary:
    """One binary column in order: whole Arrow chunks from runs, ``bytes`` from records parsed one by one, and
    runs of nulls counted (keyless records: a column of nulls costs nothing until it is built)."""

    __slots__ = ("chunks", "nulls", "pending")

    def __init__(self) -> None:
        self.chunks: list[pa.Array] = []
        self.pending: list[bytes | None] = []
        self.nulls = 0  # nulls after the chunks and pending ones

    def _settle(self) -> None:
        if self.pending:
            self.chunks.append(pa.array(self.pending, pa.binary()))
            self.pending = []
        if self.nulls:
            self.chunks.append(pa.nulls(self.nulls, pa.binary()))
            self.nulls = 0

    def add(self, value: bytes | None) -> None:
        if self.nulls:
            self._settle()
        self.pending.append(value)

    def add_nulls(self, count: int) -> None:
        if self.pending:
            self._settle()
        self.nulls += count

    def add_chunk(self, values: pa.Array) -> None:
        self._settle()
        self.chunks.append(values)

    def finish(self) -> pa.Array:
        if self.nulls and not self.chunks and not self.pending:
            column = pa.nulls(self.nulls, pa.binary())
            self.nulls = 0
            return column
        self._settle()
        chunks, self.chunks = self.chunks, []
        if not chunks:
            return pa.array([], pa.binary())
        return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)


class ColumnBuilder:
    """Accumulates the records of one partition's fetched batches; :meth:`build` returns them as Arrow.

    ``subject`` is the partition's own NATS subject (the ``subject`` of records without a ``_tl.subject``
    header); ``include_headers`` fills the ``headers`` column, which is otherwise null (and costs nothing).
    """

    def __init__(self, stream: str, partition: int, subject: str, *, include_headers: bool = False) -> None:
        self.stream = stream
        self.partition = partition
        self.subject = subject
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self._rows = 0
        self._bytes = 0
        self._ranges: list[list[int]] = []  # [first offset, count] of consecutive offsets, in order
        self._ts = array.array("q")  # ns since the epoch, one per row
        self._negative_ts = False  # some timestamp is before 1970: µs by floor division, in Python
        self._keys = _Binary()
        self._values = _Binary()
        self._subjects: list[str] | None = None  # only once some record's subject is not the partition's
        self._headers: list[Headers] = []

    @property
    def rows(self) -> int:
        """Records added since the last :meth:`build`."""
        return self._rows

    @property
    def size(self) -> int:
        """Bytes of record sections added since the last :meth:`build` (about what the batch will hold)."""
        return self._bytes

    # -- adding --------------------------------------------------------------------------------------------------

    def add(self, batch: FetchedBatch, end: int) -> None:
        """Add the records of ``batch`` at or after its ``start`` and below ``end``."""
        header = batch.header
        if header.is_control or header.base_offset >= end or header.next_offset <= batch.start:
            return
        section = record_section(batch.data, 0, header=header)
        data = section if isinstance(section, bytes) else bytes(section)
        self._bytes += len(data)
        try:
            self._parse(data, header, batch.start, end)
        except IndexError as exc:  # a length or count pointing past the data: checked by indexing, not before
            raise CorruptBatchError(f"records run past the end of the batch at offset {header.base_offset}") from exc

    def _parse(self, data: bytes, header: BatchHeader, lo: int, hi: int) -> None:
        base, first_ts, last_delta = header.base_offset, header.first_timestamp, header.last_offset_delta
        count = header.record_count
        total = len(data)
        buffer: pa.Buffer | None = None
        previous = -1
        p = k = 0
        retry, backoff = 0, _RETRY_AFTER
        while k < count:
            q = p
            z = data[p]
            if z < 0x80:
                length = (z >> 1) ^ -(z & 1)
                p += 1
            else:
                length, p = decode_varint(data, p, total)
            end = p + length
            if length < _MIN_RECORD_BODY or end > total:
                raise CorruptBatchError(f"record length {length} is impossible here")
            # A record without headers, with records beginning as it does after it and _MIN_RUN - 1 records on,
            # may start a run (the test compares ints only: it runs per record).
            if (
                k >= retry
                and data[end - 1] == 0
                and (last := q + (_MIN_RUN - 1) * (end - q)) < total
                and data[last] == data[q] == data[end]
            ):
                if buffer is None:
                    buffer = pa.py_buffer(data)
                n = self._run(data, buffer, q, p, end, count - k, previous, last_delta, base, first_ts, lo, hi)
                if n:
                    k += n
                    previous += n
                    p = q + n * (end - q)
                    backoff = _RETRY_AFTER
                    if base + previous >= hi - 1:
                        return
                    continue
                retry = k + backoff
                backoff += backoff
            p, previous = self._one(data, p, end, base, first_ts, previous, last_delta, lo, hi)
            if previous < 0:  # the record was at or past ``hi``: nothing after it is wanted
                return
            k += 1
        if p != total:
            raise CorruptBatchError(f"{total - p} stray bytes after the last record")

    def _one(
        self, data: bytes, p: int, end: int, base: int, first_ts: int, previous: int, last_delta: int, lo: int, hi: int
    ) -> tuple[int, int]:
        """Parse the record whose body is ``data[p:end]`` and add it when in ``[lo, hi)``; return where the next
        record starts and this one's offset delta (-1 when its offset is ``hi`` or more)."""
        p += 1  # attributes
        ts_delta, p = decode_varint(data, p, end)
        z = data[p]
        if z < 0x80:
            delta = (z >> 1) ^ -(z & 1)
            p += 1
        else:
            delta, p = decode_varint(data, p, end)
        if not previous < delta <= last_delta:
            raise CorruptBatchError(f"record offset delta {delta} out of order or outside the batch")
        key, p = _field(data, p, end, "key")
        value, p = _field(data, p, end, "value")
        if data[p] == 0:
            p += 1
            headers: Headers = []
        else:
            headers, p = _headers(data, p, end)
        if p != end:
            raise CorruptBatchError("record length does not match its fields")
        offset = base + delta
        if offset >= hi:
            return end, -1
        if offset >= lo:
            self._add_offsets(offset, 1)
            ts = first_ts + ts_delta
            if ts < 0:
                self._negative_ts = True
            self._ts.append(ts)
            self._keys.add(key)
            self._values.add(value)
            subject = self.subject
            if headers:
                user: Headers = []
                for name, content in headers:
                    if name == SUBJECT:
                        subject = content.decode(errors="replace")
                    elif not name.startswith(RESERVED_PREFIX):
                        user.append((name, content))
                headers = user
            if subject != self.subject and self._subjects is None:
                self._subjects = [self.subject] * self._rows
            if self._subjects is not None:
                self._subjects.append(subject)
            if self.include_headers:
                self._headers.append(headers)
            self._rows += 1
        return end, delta

    def _run(
        self,
        data: bytes,
        buffer: pa.Buffer,
        q: int,
        body: int,
        end: int,
        left: int,
        previous: int,
        last_delta: int,
        base: int,
        first_ts: int,
        lo: int,
        hi: int,
    ) -> int:
        """Decode the run of records laid out as the one at ``data[q:end]`` (its body from ``body``), at most
        ``left``, with offset deltas from ``previous + 1`` on; add those in ``[lo, hi)``; return how many the run
        holds (0: fewer than _MIN_RUN, parse them one by one).

        Every check made here is one the one-by-one parser would make of each record, with the same outcome,
        so a record joins the run exactly when that parser would decode it to the same fields.
        """
        stride = end - q
        n = min(left, (len(data) - q) // stride, last_delta - previous, _RUN_CHUNK)
        constants = list(range(body - q))  # positions equal in every record: the length first
        p = body + 1  # the attributes byte: read by neither parser
        ts_at = p - q
        while p < end and data[p] >= 0x80:
            p += 1
        p += 1
        delta_at = p - q
        while p < end and data[p] >= 0x80:
            p += 1
        p += 1
        ts_width, delta_width = delta_at - ts_at, p - q - delta_at
        if ts_width > _MAX_TS_WIDTH or delta_width > 2:
            return 0
        fields: list[tuple[int, int] | None] = []  # the key's and the value's (position, size); None: null
        for _field_index in range(2):
            if p >= end - 1:
                return 0
            at = p - q
            if data[p] == 1:  # -1: null
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
                if shift > 21 or p >= end:
                    return 0
            size = z >> 1
            if z & 1 or size == 0 or p + size > end - 1:  # negative, empty or past the record: one by one
                return 0
            constants += range(at, p - q)
            fields.append((p - q, size))
            p += size
        if p != end - 1:  # the header count, zero (the caller checked), must be all that is left
            return 0
        constants.append(stride - 1)
        d0 = previous + 1
        n = min(n, (64 if delta_width == 1 else 8192) - d0)
        if n < _MIN_RUN:
            return 0
        step = n * stride
        found = [data[q + at : q + at + step : stride] for at in constants]
        wanted = [data[q + at : q + at + 1] * n for at in constants]
        at = q + delta_at
        if delta_width == 1:
            found.append(data[at : at + step : stride])
            wanted.append(_DELTA_1[d0 : d0 + n])
        else:
            found += (data[at : at + step : stride], data[at + 1 : at + 1 + step : stride])
            wanted += (_DELTA_2_LOW[d0 : d0 + n], _DELTA_2_HIGH[d0 : d0 + n])
        at = q + ts_at
        ts_columns = [data[at + i : at + i + step : stride] for i in range(ts_width)]
        found += [column.translate(_HIGH_BITS) for column in ts_columns]
        wanted += [_CONTINUED[:n]] * (ts_width - 1)
        wanted.append(_LAST[:n])
        if found != wanted:
            n = min(agreeing(f, w) for f, w in zip(found, wanted, strict=True) if f != w)  # to the first failure
            if n < _MIN_RUN:
                return 0
            ts_columns = [column[:n] for column in ts_columns]
        first = base + d0
        a, b = max(0, lo - first), min(n, hi - first)
        if a < b:
            timestamps, negative = timestamp_lanes(ts_columns, n, first_ts)
            self._negative_ts |= negative
            self._ts.frombytes(timestamps[a * 8 : b * 8])
            self._add_offsets(first + a, b - a)
            start, rows = q + a * stride, b - a
            for column, field in zip((self._keys, self._values), fields, strict=True):
                if field is None:
                    column.add_nulls(rows)
                else:
                    column.add_chunk(_cut(buffer, start, stride, rows, field[0], field[1]))
            if self._subjects is not None:
                self._subjects += [self.subject] * rows
            if self.include_headers:
                self._headers += [[] for _ in range(rows)]
            self._rows += rows
        return n

    def _add_offsets(self, first: int, count: int) -> None:
        ranges = self._ranges
        if ranges and ranges[-1][0] + ranges[-1][1] == first:
            ranges[-1][1] += count
        else:
            ranges.append([first, count])

    # -- building ------------------------------------------------------------------------------------------------

    def build(self) -> pa.RecordBatch:
        """The records added so far as one batch of :data:`ARROW_SCHEMA`; the builder starts over empty."""
        n = self._rows
        offsets = _concat([_arange(first, count) for first, count in self._ranges], pa.int64())
        nanos = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self._ts)])
        if self._negative_ts:
            micros = pa.array([t // 1000 for t in self._ts], pa.int64())
        else:
            micros = pc.divide(nanos, _THOUSAND)
        partition = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(array.array("i", [self.partition]) * n)])
        if self._subjects is None:
            subjects = pa.repeat(pa.scalar(self.subject, pa.string()), n)
        else:
            subjects = pa.array(self._subjects, pa.string())
        headers = pa.array(self._headers, HEADERS_TYPE) if self.include_headers else pa.nulls(n, HEADERS_TYPE)
        batch = pa.RecordBatch.from_arrays(
            [
                self._keys.finish(),
                self._values.finish(),
                pa.repeat(pa.scalar(self.stream, pa.string()), n),
                partition,
                offsets,
                micros.view(TIMESTAMP_TYPE),
                subjects,
                headers,
            ],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch


def _cut(buffer: pa.Buffer, start: int, stride: int, rows: int, at: int, size: int) -> pa.Array:
    """A binary array of the ``size`` bytes at ``at`` in each of ``rows`` records of ``stride`` bytes from
    ``start``: the records as one fixed-size binary array, one kernel copying the fields out, and offsets
    that count up by ``size`` (cached) making that copy a binary array as it is."""
    records = pa.FixedSizeBinaryArray.from_buffers(pa.binary(stride), rows, [None, buffer.slice(start, rows * stride)])
    fields = pc.binary_slice(records, at, at + size)
    return pa.Array.from_buffers(pa.binary(), rows, [None, _offsets(size, rows), fields.buffers()[1]])


_offsets_cache: dict[int, pa.Buffer] = {}


def _offsets(size: int, rows: int) -> pa.Buffer:
    """The int32 offsets ``0, size, 2 * size, …`` of ``rows`` values (``rows + 1`` of them), from a cache."""
    cached = _offsets_cache.get(size)
    if cached is None or len(cached) < (rows + 1) * 4:
        if len(_offsets_cache) >= 64:
            _offsets_cache.clear()
        count = max(rows + 1, min(_RUN_CHUNK + 1, _INT32_MAX // size))  # int32: Arrow's binary offsets
        cached = _offsets_cache[size] = pa.py_buffer(array.array("i", range(0, count * size, size)))
    return cached.slice(0, (rows + 1) * 4)


def _field(data: bytes, p: int, end: int, what: str) -> tuple[bytes | None, int]:
    """A key or value: its length (-1: null), then its bytes."""
    z = data[p]
    if z == 1:
        return None, p + 1
    if z < 0x80:
        size = (z >> 1) ^ -(z & 1)
        p += 1
    else:
        size, p = decode_varint(data, p, end)
    if size < 0 or p + size > end:
        raise CorruptBatchError(f"{what} of {size} bytes runs past its record")
    return data[p : p + size], p + size


def _headers(data: bytes, p: int, end: int) -> tuple[Headers, int]:
    count, p = decode_varint(data, p, end)
    if count < 0 or count * 2 > end - p:
        raise CorruptBatchError(f"impossible header count {count}")
    headers: Headers = []
    for _ in range(count):
        size, p = decode_varint(data, p, end)
        if p + size > end:
            raise CorruptBatchError(f"header name of {size} bytes runs past its record")
        try:
            name = data[p : p + size].decode() if size > 0 else ""
        except UnicodeDecodeError as exc:
            raise CorruptBatchError("header name is not UTF-8") from exc
        p += max(size, 0)
        size, p = decode_varint(data, p, end)
        if p + size > end:
            raise CorruptBatchError(f"header value of {size} bytes runs past its record")
        headers.append((name, data[p : p + size] if size > 0 else b""))
        p += max(size, 0)
    return headers, p


_base = pa.array([], pa.int64())


def _arange(first: int, count: int) -> pa.Array:
    """``first, first + 1, …`` (``count`` of them) as int64: a cached ``0..count`` array plus ``first``."""
    global _base
    if len(_base) < count:
        size = max(count, 2 * len(_base), 1 << 16)
        _base = pa.Array.from_buffers(pa.int64(), size, [None, pa.py_buffer(array.array("q", range(size)))])
    return pc.add(_base.slice(0, count), pa.scalar(first, pa.int64()))


def _concat(chunks: list[pa.Array], kind: pa.DataType) -> pa.Array:
    if not chunks:
        return pa.array([], kind)
    return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
