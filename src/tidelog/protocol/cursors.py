"""Where a cursor lives: the facts a client and the broker must agree on (Liftbridge's, so its clients agree too).

A cursor is a keyed record in the internal stream :data:`CURSORS_STREAM`; its key is ``cursorId,stream,partition``
(:func:`cursor_key`) and it lives in partition ``crc32(key) % partitions`` of that stream, IEEE CRC-32 being
Python's ``zlib.crc32`` (:func:`cursors_partition`). Only the leader of that partition answers cursor requests.
"""

from __future__ import annotations

import zlib

CURSORS_STREAM = "__cursors"
"""The internal stream that stores cursors (Liftbridge's name)."""

MAX_CURSOR_ID_BYTES = 256
"""The longest cursor id, in UTF-8 bytes (Liftbridge sets none; a bound keeps keys and the broker's cache small)."""


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    """The record key of a cursor: ``cursorId,stream,partition``."""
    return f"{cursor_id},{stream},{partition}".encode()


def cursors_partition(key: bytes, partitions: int) -> int:
    """The :data:`CURSORS_STREAM` partition of a cursor key: IEEE CRC-32 of the key modulo the partition count."""
    return zlib.crc32(key) % partitions
