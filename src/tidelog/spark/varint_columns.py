"""Varints of a whole Arrow column at once: the sizes and offset deltas of the sink's records, encoded in bulk.

A record's sizes and offset delta are zig-zag varints (:mod:`tidelog.protocol.records.varint`): 7 bits a byte,
least significant group first, the high bit set on every byte but the last. :class:`Varints` encodes a column
of non-negative integers (already zig-zagged) with a few Arrow kernels and no Python step per value: each
value's 7-bit groups are moved one a byte into a ``uint64`` (group ``i`` shifted up ``i`` bits), and the
continuation bits of its width OR-ed in.

Most columns have one width throughout (values of one size; offset deltas within 64…8191), and then the
encoding is simply the low ``width`` bytes of each ``uint64`` (:meth:`Varints.fixed`), which
:mod:`~tidelog.spark.record_encoding` copies into the records' fixed-width heads. A column of mixed widths
becomes a binary column (:meth:`Varints.column`): each value's bytes and its width go into a 16-byte lane laid
out as Arrow's ``binary_view`` holds a short string inline (a 4-byte length, then the bytes), and Arrow's cast
to ``binary`` compacts the lanes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

if sys.byteorder != "little":  # pragma: no cover - Arrow buffers are little-endian, and so are the lanes here
    raise ImportError("tidelog.spark.varint_columns builds little-endian buffers and needs a little-endian machine")

U64 = pa.uint64()
MAX_BYTES = 5
"""Bytes of the largest varint encoded here (values below 2**35): every size and offset delta of a record is
below 2**31, as Arrow's binary columns and the broker's append limit bound them."""

_GROUP = pa.scalar(0x7F, U64)
_SHIFT7 = [pa.scalar(7 * i, U64) for i in range(MAX_BYTES)]
_SHIFT8 = [pa.scalar(8 * i, U64) for i in range(MAX_BYTES)]
_AT_LEAST = [pa.scalar(1 << 7 * i, U64) for i in range(MAX_BYTES)]  # the smallest value of each width
_CONTINUATION = [int.from_bytes(b"\x80" * max(width - 1, 0), "little") for width in range(MAX_BYTES + 1)]
_CONTINUATION_OF = pa.array(_CONTINUATION, U64)  # indexed by width
_NARROW = {1: pa.uint8(), 2: pa.uint16(), 4: pa.uint32()}


def width_of(value: int) -> int:
    """Bytes of the unsigned varint of ``value``."""
    return max(1, (value.bit_length() + 6) // 7)


@dataclass(frozen=True, slots=True)
class Varints:
    """The varints of a column: ``encoded`` holds each one's bytes in a little-endian ``uint64``; ``width`` is
    the bytes of every one when they agree, else 0 and ``widths`` has each one's."""

    encoded: pa.Array
    width: int
    widths: pa.Array | None

    @classmethod
    def of(cls, values: pa.Array) -> Varints:
        """The varints of ``values`` (non-null integers, 0 to 2**35 - 1; ValueError otherwise)."""
        z = pc.cast(values, U64)
        if len(z) == 0:
            return cls(z, 1, None)
        if z.null_count:
            raise ValueError("a varint column has no nulls")
        low, high = (scalar.as_py() for scalar in pc.min_max(z).values())
        if high >= 1 << 7 * MAX_BYTES:
            raise ValueError(f"{high} is too large for a record's size or offset delta")
        width = width_of(high)
        groups = pc.bit_wise_and(z, _GROUP)
        for i in range(1, width):
            group = pc.bit_wise_and(pc.shift_right(z, _SHIFT7[i]), _GROUP)
            groups = pc.bit_wise_or(groups, pc.shift_left(group, _SHIFT8[i]))
        if width_of(low) == width:
            return cls(pc.bit_wise_or(groups, pa.scalar(_CONTINUATION[width], U64)), width, None)
        widths = pc.add(pc.cast(pc.greater_equal(z, _AT_LEAST[1]), U64), pa.scalar(1, U64))
        for i in range(2, width):
            widths = pc.add(widths, pc.cast(pc.greater_equal(z, _AT_LEAST[i]), U64))
        return cls(pc.bit_wise_or(groups, pc.take(_CONTINUATION_OF, widths)), 0, widths)

    def __len__(self) -> int:
        return len(self.encoded)

    def sizes(self) -> pa.Scalar | pa.Array:
        """Each varint's bytes (a scalar when they agree)."""
        return pa.scalar(self.width, U64) if self.widths is None else self.widths

    def fixed(self) -> bytes:
        """The varints end to end, when they share one width."""
        if not self.width:
            raise ValueError("the varints differ in width")
        return low_bytes(self.encoded, self.width)

    def column(self) -> pa.Array:
        """The varints as a binary column."""
        if self.widths is None:
            return pa.Array.from_buffers(pa.binary(self.width), len(self), [None, pa.py_buffer(self.fixed())]).cast(
                pa.binary()
            )
        n = len(self)
        lanes = bytearray(n << 4)  # a view: a 4-byte length (here 1 to 5), then the bytes inline
        lanes[0::16] = low_bytes(self.widths, 1)
        data = low_bytes(self.encoded, 8)
        for i in range(MAX_BYTES):
            lanes[4 + i :: 16] = data[i::8]
        return pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(lanes)]).cast(pa.binary())


def low_bytes(column: pa.Array, width: int) -> bytes:
    """The low ``width`` bytes of each ``uint64`` of ``column``, end to end."""
    n = len(column)
    if width in _NARROW:  # a cast keeps the low bytes
        narrow = pc.cast(column, _NARROW[width], safe=False)
        narrow_bytes: bytes = narrow.buffers()[1].slice(narrow.offset * width, n * width).to_pybytes()
        return narrow_bytes
    data: bytes = column.buffers()[1].slice(column.offset * 8, n * 8).to_pybytes()
    if width == 8:
        return data
    out = bytearray(n * width)
    for i in range(width):  # byte i of every value at once
        out[i::width] = data[i::8]
    return bytes(out)


_ramp: list[pa.Array] = []


def ramp(n: int) -> pa.Array:
    """``0, 1, …, n - 1`` as ``uint64`` (a slice of one cached array)."""
    if not _ramp or len(_ramp[0]) < n:
        _ramp[:] = [pa.array(range(max(n, 1 << 16)), U64)]
    return _ramp[0].slice(0, n)
