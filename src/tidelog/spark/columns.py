"""Fetched record batches → one Arrow record batch: the source's hot path, with no Python object per record.

A Spark task of the ``tidelog`` source reads one partition's offset range and yields ``pyarrow.RecordBatch``es
of :data:`~tidelog.spark.schema.ARROW_SCHEMA`. :class:`ColumnBuilder` takes the batches as the consumer fetched
them (:class:`~tidelog.client.FetchedBatch`: raw bytes, CRC-checked) and decodes their record sections straight
into columns. Decoding records into :class:`~tidelog.client.ConsumerRecord` tuples and transposing them cost
more than Spark spends on the row (``docs/performance.md``); this costs a fraction of that for the records
producers and NATS ingest write.

Runs. The record layout is in :mod:`tidelog.protocol.records.layout`; runs of records laid out alike are found
and checked by :mod:`tidelog.protocol.records.runs`, the machinery every fast decoder shares. Here a run goes
further than rows: its records sit at a fixed stride in the section, so the section *is* an Arrow
``fixed_size_binary(stride)`` array of them, and one ``binary_slice`` kernel cuts every record's value (or key)
out of it, in C; timestamps are decoded SWAR-wise in one big integer whose 64-bit lanes are the little-endian
``int64`` buffer Arrow wants. Records that fit no run (keys of varying size, headers, compacted batches) are
parsed one by one, with the same checks as :func:`~tidelog.protocol.records.decode_records`;
``tests/spark/test_columns.py`` checks both paths against :meth:`FetchedBatch.records` for every record shape and
codec, and ``tests/protocol/records/test_agreement.py`` against the canonical decoder.

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

from tidelog.client import FetchedBatch
from tidelog.protocol.liftbridge import RESERVED_PREFIX, SUBJECT
from tidelog.protocol.records import BatchHeader, decode_varint, record_section
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.lanes import timestamp_lanes
from tidelog.protocol.records.runs import MAX_CHUNK, MIN_RUN, RETRY_AFTER, read_layout, run_length
from tidelog.spark.schema import ARROW_SCHEMA, HEADERS_TYPE, TIMESTAMP_TYPE

if sys.byteorder != "little":  # pragma: no cover - Arrow buffers are little-endian; so are the lanes built here
    raise ImportError("tidelog.spark.columns builds little-endian buffers and needs a little-endian machine")

Headers = list[tuple[str, bytes]]

_MIN_RECORD_BODY = 6  # attributes, two deltas, key length, value length, header count: a byte each at least
_RUN_CHUNK = MAX_CHUNK  # records checked at once: bounds the work a run that breaks early wastes
_MAX_TS_WIDTH = 8  # timestamp-delta varint bytes a run decodes (56 bits, deltas of years); longer: one by one

_INT32_MAX = 2**31 - 1
_THOUSAND = pa.scalar(1000, pa.int64())  # compute kernels given a Python int try to import numpy on every call


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
        retry, backoff = 0, RETRY_AFTER
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
            # A record without headers, with records beginning as it does after it and MIN_RUN - 1 records on,
            # may start a run (the test compares ints only: it runs per record).
            if (
                k >= retry
                and data[end - 1] == 0
                and (last := q + (MIN_RUN - 1) * (end - q)) < total
                and data[last] == data[q] == data[end]
            ):
                if buffer is None:
                    buffer = pa.py_buffer(data)
                n = self._run(data, buffer, q, end, count - k, previous, last_delta, base, first_ts, lo, hi)
                if n:
                    k += n
                    previous += n
                    p = q + n * (end - q)
                    backoff = RETRY_AFTER
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
        end: int,
        left: int,
        previous: int,
        last_delta: int,
        base: int,
        first_ts: int,
        lo: int,
        hi: int,
    ) -> int:
        """Decode the run of records laid out as the one at ``data[q:end]`` (:mod:`tidelog.protocol.records.runs`),
        at most ``left``, with offset deltas from ``previous + 1`` on; add those in ``[lo, hi)``; return how many the
        run holds (0: fewer than MIN_RUN, parse them one by one).

        Every check made here is one the one-by-one parser would make of each record, with the same outcome,
        so a record joins the run exactly when that parser would decode it to the same fields.
        """
        layout = read_layout(data, q, end, max_ts_width=_MAX_TS_WIDTH, max_delta_width=2)
        if (
            layout is None
            or (layout.key is not None and not layout.key[1])
            or (layout.value is not None and not layout.value[1])
        ):
            return 0  # empty keys and values are parsed one by one
        stride = layout.stride
        d0 = previous + 1
        n = min(left, (len(data) - q) // stride, last_delta - previous, _RUN_CHUNK)
        n, ts_columns = run_length(data, q, layout, n, d0)
        if not n:
            return 0
        fields = (layout.key, layout.value)
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
        if size < 0 or p + size > end:  # never null, as the produce check and the other decoders require
            raise CorruptBatchError(f"header name of {size} bytes runs past its record")
        try:
            name = data[p : p + size].decode() if size > 0 else ""
        except UnicodeDecodeError as exc:
            raise CorruptBatchError("header name is not UTF-8") from exc
        p += max(size, 0)
        size, p = decode_varint(data, p, end)
        if size < -1 or p + size > end:  # -1 (null) reads as empty
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
