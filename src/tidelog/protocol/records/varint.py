"""Zig-zag varints, as in Protocol Buffers' ``sint64`` and Kafka's record format.

A signed integer ``n`` is mapped to ``(n << 1) ^ (n >> 63)`` so that small negative numbers (``-1`` marks a
null key or value) stay short, then written 7 bits at a time, least significant group first, with the high bit
set on every byte but the last. Encodings of small values are precomputed: record framing calls these per
record on the client's encode path.
"""

from __future__ import annotations

from tidelog.protocol.records.errors import CorruptBatchError

_MAX_VARINT_BYTES = 10  # a 64-bit value needs at most ceil(64 / 7) bytes
_LAST_SHIFT = 63  # the tenth byte starts at bit 63 and may only carry that one bit
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_CACHE_LIMIT = 1 << 14
_ZIGZAG_CACHE: list[bytes] = [_encode_uvarint(z) for z in range(_CACHE_LIMIT)]


def encode_varint(value: int) -> bytes:
    """Return the zig-zag varint encoding of a signed 64-bit ``value``; raise ``ValueError`` outside int64."""
    zigzag = (value << 1) ^ (value >> 63)
    if zigzag < _CACHE_LIMIT:
        return _ZIGZAG_CACHE[zigzag]
    # Only reached for large magnitudes, so the common case pays nothing for this check. Without it a value
    # outside int64 (a timestamp delta across more than 2**63 ns, say) was masked and silently stored wrong.
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{value} does not fit in a signed 64-bit varint")
    return _encode_uvarint(zigzag)


def decode_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode one zig-zag varint from ``buf[pos:end]``; return ``(value, next_pos)``.

    Raises :class:`CorruptBatchError` when the varint runs past ``end`` or past ten bytes, or encodes more
    than 64 bits.
    """
    result = 0
    shift = 0
    limit = min(end, pos + _MAX_VARINT_BYTES)
    while pos < limit:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if shift == _LAST_SHIFT and byte > 1:
                # Bits past 64 would decode to an integer outside int64 that no encoder produced and that
                # re-encoding (compaction rebuilds batches) could not reproduce.
                raise CorruptBatchError("varint overflows 64 bits", position=pos)
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise CorruptBatchError("truncated or overlong varint", position=pos)
