"""Decoding one varint field of many same-shaped records at once: the record decoders' run fast path.

A run of records laid out alike (:mod:`tidelog.protocol.records.runs`) is cut into byte columns — byte ``i`` of
every record's field — and each column is checked and decoded with a few big-int operations instead of a Python
step per record. This module holds those operations:

- :func:`agreeing`: how far a column matches the bytes it must hold (where a run ends);
- :func:`timestamp_lanes`: the records' timestamps from the columns of their timestamp-delta varints, SWAR in
  one big int: one 64-bit lane per record, each varint byte's 7 bits masked and shifted into place for all
  lanes at once. Zig-zag decoding and adding the first timestamp stay lane-wise while every delta and the first
  timestamp are non-negative (no borrow or carry crosses a lane); otherwise each lane is decoded on its own;
- :func:`zigzag_lanes`: the zig-zag values of such columns, lane by lane.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.layout import INT64_MAX

_LANE_SAFE = INT64_MAX - (1 << 56)
"""Largest first timestamp the lane-wise sum takes: a delta lane is below 2**56, so no sum passes int64."""


def agreeing(column: bytes, expected: bytes) -> int:
    """How many leading bytes of ``column`` equal those of ``expected`` (of the same length)."""
    if column == expected:
        return len(column)
    x = int.from_bytes(column, "little") ^ int.from_bytes(expected, "little")
    return ((x & -x).bit_length() - 1) >> 3


def timestamp_lanes(columns: Sequence[bytes], n: int, first_ts: int) -> tuple[bytes, bool]:
    """The timestamps (ns) of ``n`` records as a little-endian ``int64`` buffer, and whether one is negative,
    given the byte columns of their timestamp deltas' varints (continuation bits already checked; a column may
    be longer than ``n``)."""
    z, ones = zigzag_lanes(columns, n)
    if z & ones or not 0 <= first_ts <= _LANE_SAFE:  # a negative delta, or a first timestamp a lane could not hold
        zigzags = array.array("q")
        zigzags.frombytes(z.to_bytes(n << 3, "little"))  # each lane < 2**56: read as signed, still itself
        try:
            values = array.array("q", [first_ts + ((v >> 1) ^ -(v & 1)) for v in zigzags])
        except OverflowError:  # found by fuzzing: a lane past int64 wrapped to a negative timestamp, or raised
            raise CorruptBatchError("a record timestamp is outside int64") from None
        return values.tobytes(), min(values) < 0
    return ((z >> 1) + first_ts * ones).to_bytes(n << 3, "little"), False  # no lane can carry into the next


def zigzag_lanes(columns: Sequence[bytes], n: int) -> tuple[int, int]:
    """The zig-zag values of ``n`` varints (at most eight bytes each, continuation bits already checked) as one
    big int of 64-bit lanes, lane ``i`` record ``i``'s; and the int with a 1 in every lane."""
    lanes = bytearray(n << 3)
    for i, column in enumerate(columns):
        lanes[i::8] = column[:n]
    x = int.from_bytes(lanes, "little")
    masks, ones = _lane_masks(n, len(columns))
    z = x & masks[0]
    for i in range(1, len(columns)):
        z |= (x >> i) & masks[i]
    return z, ones


_mask_cache: dict[tuple[int, int], tuple[list[int], int]] = {}


def _lane_masks(n: int, width: int) -> tuple[list[int], int]:
    """For ``n`` 64-bit lanes: where the 7 bits of varint bytes ``0..width-1`` go, and a 1 in every lane."""
    key = (n, width)
    cached = _mask_cache.get(key)
    if cached is None:
        if len(_mask_cache) >= 128:
            _mask_cache.clear()
        masks = [int.from_bytes((0x7F << 7 * i).to_bytes(8, "little") * n, "little") for i in range(width)]
        ones = int.from_bytes((1).to_bytes(8, "little") * n, "little")
        cached = _mask_cache[key] = (masks, ones)
    return cached
