"""The record format as the NATS ingest writes it: records stamped one nanosecond apart, their batches laid back
to back in one buffer and framed afterwards.

The bytes are exactly those :func:`~tidelog.protocol.records.encode.build_batch` produces for the same records
(``tests/broker/ingest/test_encoder.py`` checks it); only the work differs. Record ``k`` of a batch has timestamp
delta ``k`` as well as offset delta ``k``, so everything before a record's key comes from one precomputed table
(:data:`HEAD`). A *plain* record (no key, no headers, its payload as the value) is then::

    varint(length)  00  varint(k)  varint(k)  01  varint(len(value))  value  00
                    │   │          │          │                              └ header count 0
                    │   │          │          └ key length -1: no key
                    │   │          └ offset delta
                    │   └ timestamp delta (= offset delta)
                    └ attributes

and the ingest's encoder (:mod:`tidelog.broker.ingest.encoder`, which decides what becomes a record and where
batches end) writes it from :data:`PLAIN_HEAD` and :data:`LENGTH`, carrying a record's last byte with the next
record's first piece (:data:`OWED_LENGTH`). Any other record is encoded by :func:`general_record`. Each batch
starts as :data:`HEADER_SPACE`, filled in by :func:`fill_headers` once the read is encoded.
"""

from __future__ import annotations

from collections.abc import Sequence

import crc32c

from tidelog.protocol.records.encode import encode_record
from tidelog.protocol.records.layout import (
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    LENGTH_FIELD_END,
)
from tidelog.protocol.records.varint import encode_varint

TABLE = 4096  # offset deltas below this take their record head from the tables
HEAD = [b"\x00" + encode_varint(k) + encode_varint(k) for k in range(TABLE)]  # attributes, ts and offset deltas
PLAIN_HEAD = [head + encode_varint(-1) for head in HEAD]  # ... and no key
LENGTHS = 1 << 13  # lengths below this encode through the table (one or two bytes)
LENGTH = [encode_varint(n) for n in range(LENGTHS)]
NO_HEADERS = encode_varint(0)
OWED_LENGTH = [NO_HEADERS + length for length in LENGTH]  # the previous record's last byte, then a length
NULL = encode_varint(-1)
HEADER_SPACE = bytes(HEADER_SIZE)  # where a batch header goes, filled in once the batch is complete
PLAIN_SLACK = 32
"""Bound on a plain record's framing (length, head, value length, header count): a batch is closed when the next
record might not fit, so it may end up to this many bytes short of the limit."""


def record_head(k: int) -> bytes:
    """Attributes, timestamp delta and offset delta of record ``k``."""
    return HEAD[k] if k < TABLE else b"\x00" + encode_varint(k) + encode_varint(k)


def varint(n: int) -> bytes:
    return LENGTH[n] if 0 <= n < LENGTHS else encode_varint(n)


def plain_record_size(k: int, size: int) -> int:
    """Bytes a plain record of a ``size``-byte value takes at offset delta ``k``."""
    inner = len(record_head(k)) + 1 + len(varint(size)) + size + 1
    return len(varint(inner)) + inner


def general_record(
    k: int, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> tuple[list[bytes], int]:
    """Record ``k`` in the general layout (key, value and headers of any kind): its pieces and their size."""
    pieces: list[bytes] = []
    return pieces, encode_record(pieces, k, k, key, value, headers)


def fill_headers(data: bytearray, marks: list[tuple[int, int, int, int]]) -> None:
    """Write each batch's header (``marks``: position, body size, record count, first timestamp) and CRC."""
    for position, size, count, first_timestamp in marks:
        HEADER.pack_into(
            data,
            position,
            0,  # base offset: the log assigns it
            HEADER_SIZE + size - LENGTH_FIELD_END,
            0,  # leader epoch: the log assigns it
            FORMAT_VERSION,
            0,  # CRC, below
            0,  # attributes: no codec, not transactional, not control
            count - 1,
            first_timestamp,
            first_timestamp + count - 1,  # record k is stamped first + k
            -1,  # producer id
            -1,  # producer epoch
            -1,  # base sequence
            count,
        )
        crc = crc32c.crc32c(memoryview(data)[position + CRC_START : position + HEADER_SIZE + size])
        CRC_FIELD.pack_into(data, position + CRC_POS, crc)
