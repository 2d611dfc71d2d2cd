"""Errors of the record batch format: bytes that are not a record batch, or a batch that may not be stored.

::

    RecordFormatError
     ├── CorruptBatchError          bytes that are not a valid record batch (torn, hostile, bad CRC, absurd counts)
     │    └── DecompressedTooLargeError  records that decompress past the bound the reader allows
     └── InvalidBatchError          a well-formed batch that may not be stored (too large, empty, wrong order)
          └── RecordTooLargeError   a record above max_message_bytes

They sit with the format, not with storage, because every reader and writer of batches raises them: the
consumer and the Spark source as much as the broker's log.
"""

from __future__ import annotations


class RecordFormatError(Exception):
    """Base of every error of the record batch format."""


class CorruptBatchError(RecordFormatError):
    """Bytes that do not decode as a record batch.

    Raised for truncated input, lengths that point outside the buffer, a CRC mismatch, impossible record
    counts and undecodable records. ``position`` is the byte position of the batch in the buffer or file
    that was being decoded, when known.
    """

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message if position is None else f"{message} (at byte {position})")
        self.position = position


class DecompressedTooLargeError(CorruptBatchError):
    """A compressed batch whose records decompress to more than the reader's bound (a compression bomb, or
    records larger than a batch may hold): decompression stopped at the bound."""


class InvalidBatchError(RecordFormatError):
    """A batch that decodes but that may not be stored (empty, too large, not a data batch)."""


class RecordTooLargeError(InvalidBatchError):
    """A record whose key, value and headers together exceed the broker's ``max_message_bytes``."""
