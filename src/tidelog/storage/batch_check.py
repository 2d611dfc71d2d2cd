"""What a batch a client built must be before the broker stores it: checked once, where its bytes enter.

A producer builds its batches whole (header, records, CRC) and the leader stores them as they arrived; followers
copy them byte for byte and every consumer decodes them. A CRC only proves the bytes are the ones the client
sent, so a batch whose records do not decode would, once stored, stop every reader at its offset for good. So
:func:`check_produced` (called by the wire PRODUCE handler for every batch a client hands the broker) accepts a
batch only when:

- its header is sound, it holds one record per offset, and it is a data batch without a registers block (the
  log checks these too, for every writer, and the CRC: one pass over the bytes is enough);
- its records decode (:mod:`tidelog.protocol.records.check`), after decompression bounded as below, and are
  exactly as many as the header says;
- no record is above ``max_message_bytes``, counted as everywhere in tidelog: its key, value, header names and
  header values (a gRPC publish is measured so);
- ``0 <= first_timestamp <= max_timestamp <= now + max_timestamp_ahead``, and every record's timestamp is
  within ``[0, max_timestamp]``: the header's maximum is what retention by age and the time index go by, so
  one record stamped a year ahead would otherwise keep its segment for a year (Kafka's
  ``message.timestamp.after.max.ms``).

Anything else raises :class:`InvalidBatchError` (or :class:`RecordTooLargeError`, a subclass) naming the batch,
what is wrong and what is allowed, before anything is stored.

The decompression bound is the largest batch the log stores (``max_uncompressed_bytes``: the log's
``max_batch_bytes``, itself at least twice ``max_message_bytes``, and never above what readers decompress):
compression must not let a batch carry more than an uncompressed one may, and it is the memory the broker
already allows one request. A bound from ``max_message_bytes`` times the record count would be no bound: the
count is the client's word, and a bomb declares millions.

Followers do not call this: they store what their leader stored, which the leader checked when it took it
(:meth:`tidelog.storage.log.Log.append_as_follower` checks the CRCs).
"""

from __future__ import annotations

from dataclasses import dataclass

import lz4.frame
import zstandard

from tidelog.protocol.records import (
    DEFAULT_MAX_UNCOMPRESSED,
    HEADER_SIZE,
    REGISTERS_FLAG,
    BatchHeader,
    CheckedRecords,
    Codec,
    check_records,
    decode_varint,
    iter_batches,
    parse_header,
    record_section,
)
from tidelog.protocol.records.errors import (
    CorruptBatchError,
    DecompressedTooLargeError,
    InvalidBatchError,
    RecordTooLargeError,
)

_NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class ProduceLimits:
    """What the broker accepts in a batch a client built."""

    max_message_bytes: int
    max_uncompressed_bytes: int  # bound on a batch's decompressed records
    max_timestamp_ahead_ms: int

    @classmethod
    def of(cls, max_message_bytes: int, max_batch_bytes: int, max_timestamp_ahead_ms: int) -> ProduceLimits:
        """The limits for a log storing batches of up to ``max_batch_bytes``."""
        return cls(max_message_bytes, min(max_batch_bytes, DEFAULT_MAX_UNCOMPRESSED), max_timestamp_ahead_ms)


def check_produced(
    data: bytes | bytearray | memoryview, limits: ProduceLimits, now_ns: int, *, alone_budget: int | None = None
) -> list[BatchHeader]:
    """Check every batch of a produce payload (see the module docstring); return their headers.

    ``alone_budget``: raise :class:`~tidelog.protocol.records.check.IrregularRecords` rather than check more than
    that many records of a batch one by one (records laid out alike are checked in runs, not one by one)."""
    if not len(data):
        raise InvalidBatchError("a produce needs at least one batch; got no bytes")
    headers = []
    position = 0
    try:
        for position, header in iter_batches(data, verify=False):  # the log checks every CRC as it appends
            _check_header(header, position)
            checked = _check_batch_records(data, position, header, limits, alone_budget)
            check_timestamps(
                header.first_timestamp, header.max_timestamp, checked, limits, now_ns, f"batch at byte {position}"
            )
            headers.append(header)
    except DecompressedTooLargeError as exc:
        too_large = _first_record_too_large(data, position, limits.max_message_bytes)
        if too_large is not None:
            raise RecordTooLargeError(too_large) from None
        raise RecordTooLargeError(
            f"batch at byte {position}: its records decompress to more than {limits.max_uncompressed_bytes} bytes, "
            f"the most a batch may hold ({exc}); no record may exceed max_message_bytes "
            f"({limits.max_message_bytes})"
        ) from None
    except CorruptBatchError as exc:
        raise InvalidBatchError(f"batch at byte {position} is not a valid record batch: {exc}") from None
    return headers


_PREFIX_BYTES = 64 * 1024  # of a batch's decompressed records, to measure its first record (its key fits)


def _first_record_too_large(data: bytes | bytearray | memoryview, position: int, limit: int) -> str | None:
    """For a compressed batch too large to decompress: whether its first record alone is above ``limit`` (one
    message of several MB sent alone), said as the record check says it, from the first bytes of the records;
    None when it is not, or cannot be told from those bytes."""
    header = parse_header(data, position)
    compressed = bytes(memoryview(data)[position + HEADER_SIZE : position + header.size])
    try:
        if header.codec is Codec.ZSTD:
            prefix = zstandard.ZstdDecompressor().stream_reader(compressed).read(_PREFIX_BYTES)
        elif header.codec is Codec.LZ4:
            prefix = lz4.frame.LZ4FrameDecompressor().decompress(compressed, max_length=_PREFIX_BYTES)
        else:
            return None
        end = len(prefix)
        _, p = decode_varint(prefix, 0, end)  # the record's length
        _, p = decode_varint(prefix, p + 1, end)  # after the attributes: the timestamp delta
        delta, p = decode_varint(prefix, p, end)
        key, p = decode_varint(prefix, p, end)
        value, _ = decode_varint(prefix, p + max(key, 0), end)
    except Exception:  # damaged, or a key longer than the prefix: the batch's own error says enough
        return None
    size = max(key, 0) + max(value, 0)
    if size <= limit:
        return None
    return f"record {delta} is {size} bytes (key and value), above max_message_bytes ({limit})"


def _check_header(header: BatchHeader, position: int) -> None:
    if header.record_count == 0 or header.record_count != header.last_offset_delta + 1:
        raise InvalidBatchError(
            f"batch at byte {position} has {header.record_count} records for {header.last_offset_delta + 1} "
            "offsets; a client batch needs one record per offset"
        )
    if header.is_control or header.attributes & REGISTERS_FLAG:
        raise InvalidBatchError(
            f"batch at byte {position} is a control batch or carries a registers block: only the broker writes those"
        )


def _check_batch_records(
    data: bytes | bytearray | memoryview,
    position: int,
    header: BatchHeader,
    limits: ProduceLimits,
    alone_budget: int | None,
) -> CheckedRecords:
    section = record_section(data, position, header=header, max_uncompressed=limits.max_uncompressed_bytes)
    checked = check_records(section, 0, limits.max_message_bytes, alone_budget)
    if checked.records != header.record_count:
        raise CorruptBatchError(f"the header says {header.record_count} records, the batch holds {checked.records}")
    return checked


def check_timestamps(
    first_timestamp: int,
    max_timestamp: int,
    checked: CheckedRecords,
    limits: ProduceLimits,
    now_ns: int,
    what: str,
) -> None:
    """Check a batch's (or an append's) timestamps: ``0 <= first <= max <= now + max_timestamp_ahead_ms`` and
    every record's within ``[0, max]`` (the records' deltas from ``first`` are ``checked``'s)."""
    latest = now_ns + limits.max_timestamp_ahead_ms * _NS_PER_MS
    if not 0 <= first_timestamp <= max_timestamp:
        raise InvalidBatchError(
            f"{what}: first_timestamp {first_timestamp} and max_timestamp {max_timestamp} must satisfy "
            "0 <= first_timestamp <= max_timestamp (ns since the Unix epoch)"
        )
    if max_timestamp > latest:
        raise InvalidBatchError(
            f"{what}: timestamp {max_timestamp} ns is {(max_timestamp - now_ns) // _NS_PER_MS} ms ahead of the "
            f"broker's clock; at most max_timestamp_ahead_ms ({limits.max_timestamp_ahead_ms}) ahead is accepted"
        )
    least, greatest = first_timestamp + checked.min_timestamp_delta, first_timestamp + checked.max_timestamp_delta
    if least < 0:
        raise InvalidBatchError(f"{what}: a record's timestamp is {least} ns; timestamps may not be negative")
    if greatest > max_timestamp:
        raise InvalidBatchError(
            f"{what}: a record's timestamp {greatest} ns is above the batch header's max_timestamp "
            f"{max_timestamp}; the header's must be the largest"
        )
