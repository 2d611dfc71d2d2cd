"""Encoding record batches: the producer's builder, whole batches, the header and its CRC, compaction's
re-encoding and the leader's in-place offset assignment. The layout is drawn in
:mod:`tidelog.protocol.records.layout`.

The producer encodes every record it sends, so this is the client's per-record hot path: a record becomes
four byte strings appended to a list (its length varint, the fields up to the value's length, the value
itself, the header section), and the list is joined once per batch. Values are never copied before that
join; the common shapes (no key, no headers) use precomputed constants.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import crc32c
import lz4.frame
import zstandard

from tidelog.protocol.records.layout import (
    CONTROL_FLAG,
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    INT32,
    INT64,
    LEADER_EPOCH_POS,
    LENGTH_FIELD_END,
    MAX_REGISTERS_BLOCK,
    REGISTERS_FLAG,
    REGISTERS_LENGTH,
    TRANSACTIONAL_FLAG,
    BatchHeader,
    Codec,
    NewRecord,
    Record,
)
from tidelog.protocol.records.varint import encode_varint

_NULL_FIELD = encode_varint(-1)
_NO_HEADERS = encode_varint(0)
_ATTRIBUTES = b"\x00"


def _encode_delta(value: int) -> bytes:
    """:func:`encode_varint` with inline paths for 3 to 5 bytes: timestamp deltas are nanoseconds, so a
    producer's records (stamped as they are sent) differ from the batch's first by 2**14 to 2**34 ns."""
    z = (value << 1) ^ (value >> 63)
    if z < 1 << 14 or z >= 1 << 35:
        return encode_varint(value)
    if z < 1 << 21:
        return bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, z >> 14))
    if z < 1 << 28:
        return bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, ((z >> 14) & 0x7F) | 0x80, z >> 21))
    return bytes(
        ((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80, ((z >> 14) & 0x7F) | 0x80, ((z >> 21) & 0x7F) | 0x80, z >> 28)
    )


def _encode_bytes(data: bytes | None) -> bytes:
    if data is None:
        return _NULL_FIELD
    return encode_varint(len(data)) + data


def _encode_headers(headers: Iterable[tuple[str, bytes]]) -> bytes:
    hlist = list(headers)
    if not hlist:
        return _NO_HEADERS
    parts = [encode_varint(len(hlist))]
    for hkey, hvalue in hlist:
        parts.append(_encode_bytes(hkey.encode()))
        parts.append(_encode_bytes(hvalue))
    return b"".join(parts)


def encode_record(
    parts: list[bytes],
    ts_delta: int,
    off_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes]],
) -> int:
    """Append one record's pieces to ``parts`` (joined, they are the record); return how many bytes they add."""
    head = (
        _ATTRIBUTES
        + _encode_delta(ts_delta)
        + encode_varint(off_delta)
        + (_NULL_FIELD if key is None else encode_varint(len(key)) + key)
    )
    tail = _encode_headers(headers) if headers else _NO_HEADERS
    if value is None:
        head += _NULL_FIELD
        length = len(head) + len(tail)
        prefix = encode_varint(length)
        parts += (prefix, head, tail)
    else:
        head += encode_varint(len(value))
        length = len(head) + len(value) + len(tail)
        prefix = encode_varint(length)
        parts += (prefix, head, value, tail)
    return len(prefix) + length


def compress(data: bytes, codec: Codec) -> bytes:
    """Compress a batch's record section."""
    if codec is Codec.NONE:
        return data
    if codec is Codec.ZSTD:
        return _zstd_compressor().compress(data)
    if codec is Codec.LZ4:
        return lz4.frame.compress(data)  # type: ignore[no-any-return]
    raise ValueError(f"unknown codec {codec!r}")


_local = threading.local()


def _zstd_compressor() -> zstandard.ZstdCompressor:
    """One level-1 compressor per thread: building one costs more than compressing a small batch.

    A ``ZstdCompressor`` must not be used by two threads at once (compaction compresses in worker threads
    while the event loop thread encodes), so each thread keeps its own.
    """
    compressor: zstandard.ZstdCompressor | None = getattr(_local, "zstd", None)
    if compressor is None:
        compressor = _local.zstd = zstandard.ZstdCompressor(level=1)
    return compressor


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """Records encoded elsewhere (in bulk: the Spark sink's :mod:`tidelog.spark.record_encoding`), ready for a
    :class:`BatchBuilder`: ``count`` records back to back in ``section``, at offset deltas ``first_delta``,
    ``first_delta + 1``, … and timestamp delta 0 (the batch's first timestamp), exactly the bytes
    :meth:`BatchBuilder.append` writes for records given no timestamp."""

    section: bytes | memoryview
    count: int
    first_delta: int


class BatchBuilder:
    """Encodes records one at a time, as they are produced, into one batch; :meth:`build` frames them.

    The producer keeps one builder per open batch, so a record's encoding is paid when it is sent rather than
    in a second pass over the batch, and no intermediate record object is made. Offsets are the append order;
    ``first_timestamp`` is the batch's reference time (the first record's timestamp), and records carrying no
    timestamp of their own get it.
    """

    __slots__ = ("_count", "_first_timestamp", "_max_timestamp", "_parts", "_size")

    def __init__(self, first_timestamp: int) -> None:
        self._parts: list[bytes | memoryview] = []
        self._count = 0
        self._size = 0
        self._first_timestamp = first_timestamp
        self._max_timestamp = first_timestamp

    @property
    def count(self) -> int:
        """Records appended so far."""
        return self._count

    @property
    def size(self) -> int:
        """Bytes of the encoded, uncompressed record section so far (the batch is 61 bytes more)."""
        return self._size

    @property
    def first_timestamp(self) -> int:
        return self._first_timestamp

    @property
    def max_timestamp(self) -> int:
        return self._max_timestamp

    def drain(self) -> bytes:
        """The records encoded since the last drain, uncompressed and unframed; offsets keep counting.

        A transactional append streams its records in chunks (:mod:`tidelog.client.appender`): one builder
        encodes the whole append, so offset deltas run on across chunks, and each chunk is what it drains.
        """
        chunk = b"".join(self._parts)
        self._parts = []
        return chunk

    def append(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timestamp: int | None = None,
    ) -> int:
        """Encode one record at the next offset delta; return the record section's size so far."""
        # encode_record inlined: this runs once per record the producer sends.
        if timestamp is None:
            timestamp = self._first_timestamp
        elif timestamp > self._max_timestamp:
            self._max_timestamp = timestamp
        head = _ATTRIBUTES + _encode_delta(timestamp - self._first_timestamp) + encode_varint(self._count)
        head += _NULL_FIELD if key is None else encode_varint(len(key)) + key
        tail = _encode_headers(headers) if headers else _NO_HEADERS
        if value is None:
            head += _NULL_FIELD
            prefix = encode_varint(len(head) + len(tail))
            self._parts += (prefix, head, tail)
            self._size += len(prefix) + len(head) + len(tail)
        else:
            head += encode_varint(len(value))
            length = len(head) + len(value) + len(tail)
            prefix = encode_varint(length)
            self._parts += (prefix, head, value, tail)
            self._size += len(prefix) + length
        self._count += 1
        return self._size

    def extend(self, records: EncodedRecords) -> int:
        """Take records encoded elsewhere at the next offset deltas; return the record section's size so far.
        Raises ValueError when they were encoded for other offset deltas (their bytes would be wrong here)."""
        if records.first_delta != self._count:
            raise ValueError(
                f"records encoded from offset delta {records.first_delta} cannot follow {self._count} records"
            )
        self._parts.append(records.section)
        self._count += records.count
        self._size += len(records.section)
        return self._size

    def build(
        self,
        *,
        codec: Codec = Codec.NONE,
        base_offset: int = 0,
        leader_epoch: int = 0,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        transactional: bool = False,
        control: bool = False,
        registers: bytes | None = None,
    ) -> bytes:
        """The encoded batch. The builder may not be appended to afterwards.

        ``registers``: an encoded label set to carry in the batch's registers block (see the module doc).
        """
        if not self._count:
            raise ValueError("a batch needs at least one record")
        body = compress(b"".join(self._parts), codec)
        self._parts = []
        attributes = int(codec) | (TRANSACTIONAL_FLAG if transactional else 0) | (CONTROL_FLAG if control else 0)
        if registers is not None:
            body = registers_prefix(registers) + body
            attributes |= REGISTERS_FLAG
        return frame(
            body,
            base_offset=base_offset,
            leader_epoch=leader_epoch,
            attributes=attributes,
            last_offset_delta=self._count - 1,
            first_timestamp=self._first_timestamp,
            max_timestamp=self._max_timestamp,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            record_count=self._count,
        )


def build_batch(
    records: Sequence[NewRecord],
    *,
    timestamp: int,
    codec: Codec = Codec.NONE,
    base_offset: int = 0,
    leader_epoch: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    registers: bytes | None = None,
) -> bytes:
    """Encode ``records`` as one batch (``registers``: an encoded label set for its registers block).

    ``timestamp`` (ns) is given to records that carry none. Offsets are normally assigned later by the log;
    ``base_offset`` is for tests and tools that write a batch where it will be stored.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    first = records[0].timestamp
    builder = BatchBuilder(timestamp if first is None else first)
    for rec in records:
        builder.append(rec.value, rec.key, rec.headers, timestamp if rec.timestamp is None else rec.timestamp)
    return builder.build(
        codec=codec,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
        control=control,
        registers=registers,
    )


def registers_prefix(registers: bytes) -> bytes:
    """The registers block as it precedes a batch's records: length, then the encoded label set."""
    if len(registers) > MAX_REGISTERS_BLOCK:
        raise ValueError(f"encoded registers of {len(registers)} bytes exceed {MAX_REGISTERS_BLOCK}")
    return REGISTERS_LENGTH.pack(len(registers)) + registers


def pack_header(
    body_length: int,
    *,
    base_offset: int,
    leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytearray:
    """The header of a batch whose ``body_length`` bytes follow it, its CRC field still 0: the caller computes
    the CRC over ``header[CRC_START:]`` then the body (here, or combined from pieces for a spooled append) and
    packs it at ``CRC_POS``."""
    header = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        header,
        0,
        base_offset,
        HEADER_SIZE + body_length - LENGTH_FIELD_END,
        leader_epoch,
        FORMAT_VERSION,
        0,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
    return header


def frame(
    body: bytes,
    *,
    base_offset: int,
    leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    """Header + body. The CRC is computed over the header's tail and then the body (no joined copy first)."""
    header = pack_header(
        len(body),
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        attributes=attributes,
        last_offset_delta=last_offset_delta,
        first_timestamp=first_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=record_count,
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(header)[CRC_START:]))
    CRC_FIELD.pack_into(header, CRC_POS, crc)
    return bytes(header) + body


def rebuild_batch(header: BatchHeader, records: Sequence[Record]) -> bytes:
    """Re-encode a batch keeping ``records`` (a subset of the original), their offsets and timestamps.

    Used by compaction: the base offset and last offset delta are kept so the batch still spans the same
    offsets, while ``record_count`` shrinks. The codec of the original is kept. Never given a batch with a
    registers block: compaction leaves those whole, so a partition's registers stay in its log.
    """
    parts: list[bytes] = []
    for rec in records:
        encode_record(
            parts,
            rec.timestamp - header.first_timestamp,
            rec.offset - header.base_offset,
            rec.key,
            rec.value,
            rec.headers,
        )
    body_bytes = compress(b"".join(parts), header.codec)
    return frame(
        body_bytes,
        base_offset=header.base_offset,
        leader_epoch=header.leader_epoch,
        attributes=header.attributes,
        last_offset_delta=header.last_offset_delta,
        first_timestamp=header.first_timestamp,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        record_count=len(records),
    )


def assign_offsets(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Rewrite the base offset and leader epoch of the batch at ``buf[pos:]`` in place (CRC unaffected)."""
    INT64.pack_into(buf, pos, base_offset)
    INT32.pack_into(buf, pos + LEADER_EPOCH_POS, leader_epoch)
