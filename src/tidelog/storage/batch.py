"""The record batch: the unit that tidelog appends, replicates, stores and serves.

A batch is a 61-byte header followed by its records, all integers big-endian::

    offset  size  field
         0     8  base_offset         offset of the first record; assigned by the partition leader
         8     4  batch_length        bytes that follow this field (total size - 12)
        12     4  leader_epoch        epoch of the leader that assigned the offsets
        16     1  format_version      1
        17     4  crc                 CRC32C of bytes [21, end): everything after this field
        21     2  attributes          bits 0-2 codec (0 none, 3 lz4, 4 zstd); bit 4 transactional; bit 5 control;
                                      bit 6 registers
        23     4  last_offset_delta   offset of the last record minus base_offset
        27     8  first_timestamp     nanoseconds since the Unix epoch
        35     8  max_timestamp       largest record timestamp in the batch
        43     8  producer_id         -1 when not an idempotent producer
        51     2  producer_epoch      -1 when unset
        53     4  base_sequence       -1 when unset
        57     4  record_count        records present (fewer than last_offset_delta + 1 after compaction)
        61     …  registers block     only with bit 6: a 2-byte length, then the partition's registers (the
                                      whole label set after this batch, ``replication.registers`` encoding)
         …     …  records             compressed as a whole when the codec is not none

The registers block is how a transactional append's register update travels: in the very batch that holds
the append's records, so the update is replicated, stored, recovered and truncated exactly with them (one
batch is all or nothing on disk and on the wire). It carries the whole set, not the change, so the registers
of a replica are those of the last such batch it holds. It sits outside the compressed section and is opaque
to storage: :func:`record_section` skips it and :func:`registers_block` returns it.

Each record is framed with zig-zag varints (:mod:`tidelog.storage.varint`)::

    length           varint  bytes of the record after this field
    attributes       int8    0
    timestamp_delta  varint  timestamp - first_timestamp
    offset_delta     varint  offset - base_offset
    key_length       varint  -1 for a null key
    key              bytes
    value_length     varint  -1 for a null value (a tombstone)
    value            bytes
    header_count     varint
    headers          header_count × (key_length varint, utf-8 key, value_length varint, value)

The CRC starts after the CRC field, so a leader assigns offsets by rewriting ``base_offset`` and
``leader_epoch`` in place (:func:`assign_offsets`) without recomputing it, and a whole batch is validated
with one pass of a hardware CRC. Decoding never trusts a length: every length is checked against the bytes
actually present, and decompression is bounded, so hostile input raises :class:`CorruptBatchError` without
allocating more than it carries (or the decompression bound).
"""

from __future__ import annotations

import enum
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c
import lz4.frame
import zstandard

from tidelog.storage.errors import CorruptBatchError, DecompressedTooLargeError
from tidelog.storage.varint import decode_varint, encode_varint

FORMAT_VERSION = 1

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
assert HEADER_SIZE == 61

LENGTH_FIELD_END = 12  # base_offset and batch_length precede what batch_length counts
PREFIX = struct.Struct(">qi")  # base_offset, batch_length: enough to find the next batch
INT64 = struct.Struct(">q")
INT32 = struct.Struct(">i")
LEADER_EPOCH_POS = 12
CRC_FIELD = struct.Struct(">I")
CRC_POS = 17
CRC_START = 21
ATTRIBUTES_POS = 21

MIN_RECORD_SIZE = 7  # length, attributes, two deltas, key length, value length, header count
DEFAULT_MAX_UNCOMPRESSED = 64 * 1024 * 1024


class Codec(enum.IntEnum):
    """Compression of a batch's records (numbered as in Kafka)."""

    NONE = 0
    LZ4 = 3
    ZSTD = 4


CODEC_MASK = 0x07
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
REGISTERS_FLAG = 0x40
REGISTERS_LENGTH = struct.Struct(">H")
MAX_REGISTERS_BLOCK = 0xFFFF


class BatchHeader(NamedTuple):
    """The decoded fixed header of one batch."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    format_version: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.batch_length + LENGTH_FIELD_END

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & CODEC_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)


@dataclass(frozen=True, slots=True)
class Record:
    """One record as a reader sees it. ``timestamp`` is in nanoseconds since the Unix epoch."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class NewRecord:
    """A record to be encoded; its offset is given by its position in the batch."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    timestamp: int | None = None


# --------------------------------------------------------------------------------------------- encoding
#
# The producer encodes every record it sends, so this is the client's per-record hot path: a record becomes
# four byte strings appended to a list (its length varint, the fields up to the value's length, the value
# itself, the header section), and the list is joined once per batch. Values are never copied before that
# join; the common shapes (no key, no headers) use precomputed constants.

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


def _encode_record(
    parts: list[bytes],
    ts_delta: int,
    off_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes]],
) -> int:
    """Append one record's pieces to ``parts``; return how many bytes they add."""
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


def encode_records(records: Sequence[NewRecord], first_timestamp: int, default_timestamp: int) -> bytes:
    """Encode ``records`` with offset deltas 0..n-1 (uncompressed)."""
    parts: list[bytes] = []
    for delta, rec in enumerate(records):
        ts = default_timestamp if rec.timestamp is None else rec.timestamp
        _encode_record(parts, ts - first_timestamp, delta, rec.key, rec.value, rec.headers)
    return b"".join(parts)


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


class BatchBuilder:
    """Encodes records one at a time, as they are produced, into one batch; :meth:`build` frames them.

    The producer keeps one builder per open batch, so a record's encoding is paid when it is sent rather than
    in a second pass over the batch, and no intermediate record object is made. Offsets are the append order;
    ``first_timestamp`` is the batch's reference time (the first record's timestamp), and records carrying no
    timestamp of their own get it.
    """

    __slots__ = ("_count", "_first_timestamp", "_max_timestamp", "_parts", "_size")

    def __init__(self, first_timestamp: int) -> None:
        self._parts: list[bytes] = []
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
        # _encode_record inlined: this runs once per record the producer sends.
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
        return _frame(
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


def _frame(
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
        _encode_record(
            parts,
            rec.timestamp - header.first_timestamp,
            rec.offset - header.base_offset,
            rec.key,
            rec.value,
            rec.headers,
        )
    body_bytes = compress(b"".join(parts), header.codec)
    return _frame(
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


# --------------------------------------------------------------------------------------------- decoding


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode and sanity-check the header of the batch at ``buf[pos:]``.

    Checks that the whole batch is present and that its counts are possible; does not check the CRC.
    """
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptBatchError(f"truncated batch header: {available} of {HEADER_SIZE} bytes", position=pos)
    header = BatchHeader._make(HEADER.unpack_from(buf, pos))
    if header.format_version != FORMAT_VERSION:
        raise CorruptBatchError(f"unknown batch format version {header.format_version}", position=pos)
    size = header.batch_length + LENGTH_FIELD_END
    if size < HEADER_SIZE:
        raise CorruptBatchError(f"batch length {header.batch_length} is shorter than a header", position=pos)
    if size > available:
        raise CorruptBatchError(f"batch of {size} bytes but only {available} present", position=pos)
    if header.attributes & CODEC_MASK not in _CODECS:
        raise CorruptBatchError(f"unknown codec {header.attributes & CODEC_MASK}", position=pos)
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptBatchError("negative record count or offset delta", position=pos)
    if header.record_count > header.last_offset_delta + 1:
        raise CorruptBatchError(
            f"{header.record_count} records cannot span {header.last_offset_delta + 1} offsets", position=pos
        )
    if header.attributes & CODEC_MASK == Codec.NONE and header.record_count * MIN_RECORD_SIZE > (size - HEADER_SIZE):
        raise CorruptBatchError(f"{header.record_count} records cannot fit in {size - HEADER_SIZE} bytes", position=pos)
    return header


_CODECS = frozenset(int(c) for c in Codec)


def crc_ok(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    """True when the stored CRC matches the batch's bytes."""
    view = memoryview(buf)[pos + CRC_START : pos + header.size]
    return int(crc32c.crc32c(view)) == header.crc


def check_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header at ``pos`` and verify the CRC; raise :class:`CorruptBatchError` on any fault."""
    header = parse_header(buf, pos)
    if not crc_ok(buf, pos, header):
        raise CorruptBatchError("CRC mismatch", position=pos)
    return header


def iter_batches(buf: bytes | bytearray | memoryview, *, verify: bool = True) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each batch of a buffer of whole, concatenated batches.

    Raises :class:`CorruptBatchError` at the first batch that is torn, malformed or (with ``verify``) fails
    its CRC. Per-batch work only: records are not decoded.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        header = check_batch(buf, pos) if verify else parse_header(buf, pos)
        yield pos, header
        pos += header.size


_DECOMPRESS_STEP = 128 * 1024  # output of unsized frames grows by this much at a time


def _decompress(data: memoryview, codec: Codec, limit: int) -> bytes:
    try:
        return _unzstd(data, limit) if codec is Codec.ZSTD else _unlz4(data, limit)
    except CorruptBatchError:
        raise
    except Exception as exc:  # zstd and lz4 raise their own error types for damaged input
        raise CorruptBatchError(f"cannot decompress {codec.name} records: {exc}") from exc


def _unzstd(data: memoryview, limit: int) -> bytes:
    size = zstandard.frame_content_size(data)
    if size > limit:
        raise DecompressedTooLargeError(f"batch decompresses to {size} bytes, above the {limit} limit")
    if size >= 0:
        # One allocation of exactly the declared size; zstd refuses content that differs from the declaration.
        return zstandard.ZstdDecompressor().decompress(data)
    # No declared size: stream in steps rather than reserving ``limit`` bytes up front for every batch.
    step = min(_DECOMPRESS_STEP, limit + 1)
    return _join_bounded(zstandard.ZstdDecompressor().read_to_iter(data, write_size=step), limit)


def _unlz4(data: memoryview, limit: int) -> bytes:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    step = min(_DECOMPRESS_STEP, limit + 1)

    def steps() -> Iterator[bytes]:
        # ``max_length`` is allocated in full by every call, so it is kept to one step, never the whole limit.
        yield decompressor.decompress(bytes(data), max_length=step)
        while not decompressor.eof:
            if decompressor.needs_input:
                raise CorruptBatchError("lz4 frame is truncated")
            piece = decompressor.decompress(b"", max_length=step)
            if not piece and not decompressor.eof:
                raise CorruptBatchError("lz4 frame makes no progress")
            yield piece

    return _join_bounded(steps(), limit)


def _join_bounded(pieces: Iterable[bytes], limit: int) -> bytes:
    """Concatenate decompressed pieces, stopping as soon as they pass ``limit`` (a compression bomb)."""
    out: list[bytes] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        if total > limit:
            raise DecompressedTooLargeError(f"batch decompresses past the {limit} byte limit")
        out.append(piece)
    return b"".join(out)


def decode_records(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    header: BatchHeader | None = None,
    max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED,
) -> list[Record]:
    """Decode the records of the batch at ``buf[pos:]`` (the CRC must already have been checked)."""
    if header is None:
        header = parse_header(buf, pos)
    return _decode_record_section(record_section(buf, pos, header=header, max_uncompressed=max_uncompressed), header)


def record_section(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    *,
    header: BatchHeader | None = None,
    max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED,
) -> bytes | memoryview:
    """The encoded records of the batch at ``buf[pos:]``, decompressed (bounded) when the batch is compressed.

    For decoders other than :func:`decode_records` (the client's consumer parses records its own faster way).
    """
    if header is None:
        header = parse_header(buf, pos)
    start = pos + HEADER_SIZE
    if header.attributes & REGISTERS_FLAG:
        start += REGISTERS_LENGTH.size + _registers_length(buf, pos, header)
    view = memoryview(buf)[start : pos + header.size]
    if header.codec is Codec.NONE:
        return view
    data = _decompress(view, header.codec, max_uncompressed)
    if header.record_count * MIN_RECORD_SIZE > len(data):
        raise CorruptBatchError(f"{header.record_count} records cannot fit in {len(data)} bytes", position=pos)
    return data


def _registers_length(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> int:
    if header.size < HEADER_SIZE + REGISTERS_LENGTH.size:
        raise CorruptBatchError("batch too short for its registers block", position=pos)
    (length,) = REGISTERS_LENGTH.unpack_from(buf, pos + HEADER_SIZE)
    if HEADER_SIZE + REGISTERS_LENGTH.size + length > header.size:
        raise CorruptBatchError(f"registers block of {length} bytes runs past the batch", position=pos)
    return int(length)


def registers_block(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, header: BatchHeader | None = None
) -> memoryview | None:
    """The encoded registers carried by the batch at ``buf[pos:]``, or None when it carries none."""
    if header is None:
        header = parse_header(buf, pos)
    if not header.attributes & REGISTERS_FLAG:
        return None
    start = pos + HEADER_SIZE + REGISTERS_LENGTH.size
    return memoryview(buf)[start : start + _registers_length(buf, pos, header)]


def _read_bytes(data: bytes | memoryview, p: int, end: int) -> tuple[bytes | None, int]:
    length, p = decode_varint(data, p, end)
    if length < 0:
        return None, p
    if p + length > end:
        raise CorruptBatchError(f"field of {length} bytes runs past its record")
    return bytes(data[p : p + length]), p + length


def _decode_record_section(data: bytes | memoryview, header: BatchHeader) -> list[Record]:
    records: list[Record] = []
    p = 0
    total = len(data)
    previous_delta = -1
    for _ in range(header.record_count):
        length, p = decode_varint(data, p, total)
        end = p + length
        if length < MIN_RECORD_SIZE - 1 or end > total:
            raise CorruptBatchError(f"record length {length} is impossible here")
        p += 1  # attributes
        ts_delta, p = decode_varint(data, p, end)
        off_delta, p = decode_varint(data, p, end)
        # Strictly increasing: readers seek by offset and compaction keeps "the newest offset per key", both of
        # which assume one record per offset, in order.
        if not previous_delta < off_delta <= header.last_offset_delta:
            raise CorruptBatchError(f"record offset delta {off_delta} out of order or outside the batch")
        previous_delta = off_delta
        key, p = _read_bytes(data, p, end)
        value, p = _read_bytes(data, p, end)
        hcount, p = decode_varint(data, p, end)
        if hcount < 0 or hcount * 2 > end - p:
            raise CorruptBatchError(f"impossible header count {hcount}")
        headers: list[tuple[str, bytes]] = []
        for _h in range(hcount):
            hkey, p = _read_bytes(data, p, end)
            hval, p = _read_bytes(data, p, end)
            try:
                name = (hkey or b"").decode()
            except UnicodeDecodeError as exc:
                raise CorruptBatchError("header name is not UTF-8") from exc
            headers.append((name, hval or b""))
        if p != end:
            raise CorruptBatchError("record length does not match its fields")
        records.append(
            Record(header.base_offset + off_delta, header.first_timestamp + ts_delta, key, value, tuple(headers))
        )
    if p != total:
        raise CorruptBatchError(f"{total - p} stray bytes after the last record")
    return records


class RecordBatch:
    """A read-only view over one encoded batch, for code that wants records rather than bytes."""

    __slots__ = ("data", "header")

    def __init__(self, data: bytes | bytearray | memoryview, *, verify: bool = True) -> None:
        header = check_batch(data) if verify else parse_header(data)
        if header.size != len(data):
            raise CorruptBatchError(f"buffer holds {len(data)} bytes, the batch {header.size}")
        self.header = header
        self.data = data

    def records(self, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> list[Record]:
        return decode_records(self.data, 0, header=self.header, max_uncompressed=max_uncompressed)

    def __repr__(self) -> str:
        h = self.header
        return f"RecordBatch(offsets={h.base_offset}..{h.last_offset}, records={h.record_count}, codec={h.codec.name})"


def records_of(buf: bytes | bytearray | memoryview) -> Iterable[Record]:
    """Every record in a buffer of whole batches, CRCs checked. For readers and tests; not the broker path."""
    for pos, header in iter_batches(buf):
        yield from decode_records(buf, pos, header=header)
