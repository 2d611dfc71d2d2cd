"""What the consumer hands out: fetched batches, and records decoded from them on demand.

A fetch response's payload is whole record batches exactly as stored. :func:`batches_of` cuts it into
:class:`FetchedBatch` views (per-batch work: a header parse and a hardware CRC), and nothing is decoded until a
caller asks a batch for its records. Counting records, measuring throughput or forwarding batches elsewhere
therefore costs nothing per record.

The first batch of a response may begin before the offset that was asked for (a fetch returns the whole batch
holding the offset); a batch knows the consumer's position when it was fetched (``start``) and its records and
counts leave out what lies before it, so nothing is delivered twice.

Decoding is the consumer's per-record hot path, so the record section (decompressed first when the batch is
compressed: :func:`~tidelog.storage.batch.record_section`) is parsed here by :func:`_parse_records`, the
record format of :mod:`tidelog.storage.batch` with every varint decoded inline (a function call per field was
half the cost), values sliced from one ``bytes`` of the section, and records built as tuples: about twice as
fast as ``decode_records`` for 1 KiB records. It validates at least what
:func:`~tidelog.storage.batch.decode_records` validates, and ``tests/client/test_records.py`` checks the two
agree on every record shape and codec.
"""

from __future__ import annotations

from typing import NamedTuple

from tidelog.storage.batch import BatchHeader, iter_batches, record_section
from tidelog.storage.errors import CorruptBatchError
from tidelog.storage.varint import decode_varint

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
    # Each field is a zig-zag varint ``z``. One- and two-byte varints are decoded inline (lengths, offset deltas
    # and values up to 8 KiB), longer ones by _rest (nanosecond timestamp deltas, large values). Checks against
    # ``end`` come after each field, as in the storage codec; an index past the data raises IndexError.
    for _ in range(header.record_count):
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
