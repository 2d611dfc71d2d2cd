"""Decoding record batches: header parse and sanity checks, the CRC, iterating a buffer of batches, the
registers block, bounded decompression and the canonical record decoder (the reference every faster decoder
agrees with). The layout is drawn in :mod:`tidelog.protocol.records.layout`.

Decoding never trusts a length: every length is checked against the bytes actually present, and decompression
is bounded, so hostile input raises :class:`CorruptBatchError` without allocating more than it carries (or the
decompression bound).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import crc32c
import lz4.frame
import zstandard

from tidelog.protocol.records.errors import CorruptBatchError, DecompressedTooLargeError
from tidelog.protocol.records.layout import (
    CODEC_MASK,
    CRC_START,
    DEFAULT_MAX_UNCOMPRESSED,
    ENCRYPTED_FLAG,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    INT64_MAX,
    INT64_MIN,
    LENGTH_FIELD_END,
    MIN_RECORD_SIZE,
    REGISTERS_FLAG,
    REGISTERS_LENGTH,
    BatchHeader,
    Codec,
    Record,
)
from tidelog.protocol.records.varint import decode_varint


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


_per_thread = threading.local()


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompression context: making one costs more than decompressing a small batch, and one
    context serves any number of one-shot ``decompress`` calls, one at a time."""
    decompressor: zstandard.ZstdDecompressor | None = getattr(_per_thread, "zstd", None)
    if decompressor is None:
        decompressor = _per_thread.zstd = zstandard.ZstdDecompressor()
    return decompressor


def _unzstd(data: memoryview, limit: int) -> bytes:
    size = zstandard.frame_content_size(data)
    if size > limit:
        raise DecompressedTooLargeError(f"batch decompresses to {size} bytes, above the {limit} limit")
    if size >= 0:
        # One allocation of exactly the declared size; zstd refuses content that differs from the declaration.
        return _zstd_decompressor().decompress(data)
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
    if header.attributes & ENCRYPTED_FLAG:
        raise CorruptBatchError("the batch is encrypted at rest: only a broker with its key reads it", position=pos)
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


def _read_bytes(data: bytes | memoryview, p: int, end: int, *, null: bool = True) -> tuple[bytes | None, int]:
    """A length-prefixed field. Null (``None``) is the length -1 written as the one byte the encoders write, the
    only form the produce check (:mod:`~tidelog.protocol.records.check`) and the consumer's decoder accept;
    without ``null`` (a header name) there is none. Any other negative length is corrupt, as it is for them."""
    if null and p < end and data[p] == 1:
        return None, p + 1
    length, p = decode_varint(data, p, end)
    if length < 0 or p + length > end:
        raise CorruptBatchError(f"field of {length} bytes runs past its record")
    return bytes(data[p : p + length]), p + length


def _read_header_value(data: bytes | memoryview, p: int, end: int) -> tuple[bytes, int]:
    """A header's value: -1 (in any varint form) reads as empty, as the produce check allows."""
    length, p = decode_varint(data, p, end)
    if length < -1 or p + length > end:
        raise CorruptBatchError(f"header value of {length} bytes runs past its record")
    return bytes(data[p : p + max(length, 0)]), p + max(length, 0)


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
        if not INT64_MIN <= header.first_timestamp + ts_delta <= INT64_MAX:
            raise CorruptBatchError(f"record timestamp {header.first_timestamp} + {ts_delta} is outside int64")
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
            hkey, p = _read_bytes(data, p, end, null=False)
            hval, p = _read_header_value(data, p, end)
            try:
                name = (hkey or b"").decode()
            except UnicodeDecodeError as exc:
                raise CorruptBatchError("header name is not UTF-8") from exc
            headers.append((name, hval))
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
