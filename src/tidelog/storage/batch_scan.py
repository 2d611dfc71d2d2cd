"""Reading the batches of a segment file by their headers: one header checked, or a chunked scan of a range.

Only the 61-byte headers are decoded (and, when asked, each batch's CRC checked); records never are. Recovery,
installs and damage repair walk files this way, and a segment reads single headers with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from tidelog.protocol.records import FORMAT_VERSION, HEADER, HEADER_SIZE, LENGTH_FIELD_END, BatchHeader, crc_ok
from tidelog.protocol.records.errors import CorruptBatchError

SCAN_CHUNK = 4 * 1024 * 1024


def read_header(buf: bytes | memoryview, off: int, position: int, limit: int) -> BatchHeader:
    """Decode a header and check what can be checked without the batch's body.

    ``position`` is where the header sits in the file (for errors), ``limit`` the committed size the batch
    must fit inside.
    """
    if len(buf) - off < HEADER_SIZE:
        raise CorruptBatchError(f"truncated batch header: {max(0, len(buf) - off)} of {HEADER_SIZE}", position=position)
    h = BatchHeader._make(HEADER.unpack_from(buf, off))
    size = h.batch_length + LENGTH_FIELD_END
    if h.format_version != FORMAT_VERSION:
        raise CorruptBatchError(f"unknown batch format version {h.format_version}", position=position)
    if size < HEADER_SIZE or position + size > limit:
        raise CorruptBatchError(f"batch length {h.batch_length} does not fit the segment", position=position)
    if h.last_offset_delta < 0 or not 0 <= h.record_count <= h.last_offset_delta + 1 or h.base_offset < 0:
        raise CorruptBatchError("impossible offsets or record count", position=position)
    return h


def scan_batches(fd: int, start: int, end: int, *, verify: bool) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for the batches of file ``fd`` in ``[start, end)``.

    Reads in large chunks. With ``verify`` every CRC is checked. Raises :class:`CorruptBatchError` (with
    the file position) at the first batch that is torn or fails.
    """
    position = start
    buf = b""
    buf_start = start
    while position < end:
        off = position - buf_start
        if off < 0 or len(buf) - off < HEADER_SIZE:
            buf = os.pread(fd, min(SCAN_CHUNK, end - position), position)
            buf_start, off = position, 0
        header = read_header(buf, off, position, end)
        if verify:
            if off + header.size > len(buf):
                buf = os.pread(fd, min(max(SCAN_CHUNK, header.size), end - position), position)
                buf_start, off = position, 0
            if not crc_ok(buf, off, header):
                raise CorruptBatchError("CRC mismatch", position=position)
        yield position, header
        position += header.size
