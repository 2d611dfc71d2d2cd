"""Zig-zag varints: known encodings, round trips over int64, and hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.protocol.records import decode_varint, encode_varint
from tidelog.protocol.records.errors import CorruptBatchError

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-2, b"\x03"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (8191, b"\xfe\x7f"),  # zig-zag 16382, inside the precomputed cache
        (-8192, b"\xff\x7f"),  # zig-zag 16383, the cache's last entry
        (8192, b"\x80\x80\x01"),  # zig-zag 16384, the first value encoded on the slow path
        (300, b"\xd8\x04"),
        (INT64_MAX, b"\xfe" + b"\xff" * 8 + b"\x01"),
        (INT64_MIN, b"\xff" * 9 + b"\x01"),
    ],
)
def test_known_encodings(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0, len(encoded)) == (value, len(encoded))


@given(int64s)
def test_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert 1 <= len(encoded) <= 10
    assert decode_varint(encoded, 0, len(encoded)) == (value, len(encoded))


@given(st.lists(int64s, max_size=20), st.binary(max_size=4))
def test_sequence_decodes_in_place(values: list[int], prefix: bytes) -> None:
    """Varints are self-delimiting: a concatenation decodes back value by value from any start position."""
    buf = prefix + b"".join(encode_varint(v) for v in values)
    pos = len(prefix)
    for value in values:
        decoded, pos = decode_varint(buf, pos, len(buf))
        assert decoded == value
    assert pos == len(buf)


@given(int64s)
def test_decodes_from_a_memoryview(value: int) -> None:
    encoded = memoryview(b"??" + encode_varint(value))
    assert decode_varint(encoded, 2, len(encoded))[0] == value


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 1 << 64, -(1 << 64), 1 << 100])
def test_encoding_outside_int64_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match="64-bit"):
        encode_varint(value)


@given(int64s.filter(lambda v: v not in (0, -1)))
def test_truncated_varint_is_refused(value: int) -> None:
    encoded = encode_varint(value)
    for cut in range(len(encoded)):
        with pytest.raises(CorruptBatchError):
            decode_varint(encoded, 0, cut)


def test_end_bounds_the_read_even_when_bytes_follow() -> None:
    buf = b"\x80\x01"
    with pytest.raises(CorruptBatchError):
        decode_varint(buf, 0, 1)


def test_empty_input_is_refused() -> None:
    with pytest.raises(CorruptBatchError):
        decode_varint(b"", 0, 0)


def test_more_than_ten_bytes_is_refused() -> None:
    overlong = b"\x80" * 10 + b"\x00"
    with pytest.raises(CorruptBatchError, match="overlong"):
        decode_varint(overlong, 0, len(overlong))


@pytest.mark.parametrize("last", [0x02, 0x7F])
def test_bits_beyond_64_are_refused(last: int) -> None:
    """A tenth byte may only carry bit 63; more would decode to an integer no int64 encoder can produce."""
    buf = b"\xff" * 9 + bytes([last])
    with pytest.raises(CorruptBatchError, match="64 bits"):
        decode_varint(buf, 0, len(buf))


@settings(max_examples=300)
@given(st.binary(max_size=16), st.integers(min_value=0, max_value=16))
def test_random_bytes_decode_to_int64_or_raise(buf: bytes, end: int) -> None:
    end = min(end, len(buf))
    try:
        value, pos = decode_varint(buf, 0, end)
    except CorruptBatchError:
        return
    assert INT64_MIN <= value <= INT64_MAX
    assert 0 < pos <= end
    # a canonical re-encoding decodes to the same value (the input may have been a non-minimal encoding)
    again = encode_varint(value)
    assert decode_varint(again, 0, len(again))[0] == value
