"""The record batch: the unit that tidelog appends, replicates, stores and serves; its byte layout and constants.

A batch is a 61-byte header followed by its records, all integers big-endian::

    offset  size  field
         0     8  base_offset         offset of the first record; assigned by the partition leader
         8     4  batch_length        bytes that follow this field (total size - 12)
        12     4  leader_epoch        epoch of the leader that assigned the offsets
        16     1  format_version      1
        17     4  crc                 CRC32C of bytes [21, end): everything after this field
        21     2  attributes          bits 0-2 codec (0 none, 3 lz4, 4 zstd); bit 4 transactional; bit 5 control;
                                      bit 6 registers; bit 7 encrypted (at rest, by the broker)
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

An encrypted batch (bit 7, set only by a broker storing an encrypted stream: clients never send one, and
consumers never receive one) carries, instead of its records, ``key_id`` (4 bytes: which of the partition's
data keys), a 12-byte nonce, and the records section (compressed as the codec says) sealed with AES-256-GCM
under that key, its 16-byte tag last; see :mod:`tidelog.storage.encryption`.

The registers block is how a transactional append's register update travels: in the very batch that holds
the append's records, so the update is replicated, stored, recovered and truncated exactly with them (one
batch is all or nothing on disk and on the wire). It carries the whole set, not the change, so the registers
of a replica are those of the last such batch it holds. It sits outside the compressed section and is opaque
to storage: :func:`record_section` skips it and :func:`registers_block` returns it.

Each record is framed with zig-zag varints (:mod:`tidelog.protocol.records.varint`)::

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

FORMAT_VERSION = 1

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
assert HEADER_SIZE == 61

LENGTH_FIELD_END = 12  # base_offset and batch_length precede what batch_length counts
PREFIX = struct.Struct(">qi")  # base_offset, batch_length: enough to find the next batch
INT64 = struct.Struct(">q")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # every offset and timestamp a batch holds fits int64
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
_CODECS = {codec.value: codec for codec in Codec}  # a dict lookup: calling the enum costs more, once per batch
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
REGISTERS_FLAG = 0x40
ENCRYPTED_FLAG = 0x80
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
        value = self.attributes & CODEC_MASK
        codec = _CODECS.get(value)
        return codec if codec is not None else Codec(value)  # an unknown codec: Codec raises ValueError

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
