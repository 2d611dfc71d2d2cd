"""The Liftbridge NATS envelope: exact bytes, round trips, and everything else falling back to a plain message."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.protocol.envelope import MAGIC, Envelope, MessageType, encode_envelope, is_envelope, parse_envelope


def header(version: int = 0, length: int = 8, flags: int = 0, msg_type: int = 0) -> bytes:
    return MAGIC + bytes([version, length, flags, msg_type])


def test_crc32c_is_castagnoli() -> None:
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C


def test_exact_bytes_without_crc() -> None:
    assert (
        encode_envelope(MessageType.PUBLISH, b"abc", with_crc=False) == bytes.fromhex("b90e43b4 00 08 00 00") + b"abc"
    )
    assert encode_envelope(MessageType.ACK, b"", with_crc=False) == bytes.fromhex("b90e43b4 00 08 00 01")


def test_exact_bytes_with_crc() -> None:
    data = encode_envelope(MessageType.ACK, b"123456789", with_crc=True)
    assert data == bytes.fromhex("b90e43b4 00 0c 01 01 e3069283") + b"123456789"
    assert encode_envelope(MessageType.ACK, b"123456789") == data  # the CRC is on by default


@given(msg_type=st.sampled_from(MessageType), payload=st.binary(max_size=256), with_crc=st.booleans())
def test_round_trip(msg_type: MessageType, payload: bytes, with_crc: bool) -> None:
    data = encode_envelope(msg_type, payload, with_crc)
    envelope = parse_envelope(data)
    assert envelope == Envelope(msg_type, memoryview(payload), with_crc)
    assert envelope is not None and bytes(envelope.payload) == payload
    assert is_envelope(data)


def test_the_payload_is_a_read_only_view_not_a_copy() -> None:
    data = encode_envelope(MessageType.PUBLISH, b"proto bytes")
    envelope = parse_envelope(data)
    assert envelope is not None
    assert envelope.payload.obj is data and envelope.payload.readonly
    assert parse_envelope(bytearray(data)) == envelope
    assert parse_envelope(memoryview(data)) == envelope


def test_header_length_12_without_the_crc_flag_skips_the_spare_bytes() -> None:
    envelope = parse_envelope(header(length=12) + b"\xff" * 4 + b"msg")
    assert envelope is not None and bytes(envelope.payload) == b"msg" and not envelope.crc_checked


def test_unknown_flag_bits_are_ignored() -> None:
    envelope = parse_envelope(header(flags=0x80) + b"msg")
    assert envelope is not None and bytes(envelope.payload) == b"msg"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello, plain NATS",
        MAGIC,  # too short
        header()[:-1],
        b"\xb9\x0e\x43\xb5" + header()[4:],  # wrong magic
        header(version=1),
        header(msg_type=2),
        header(length=7),
        header(length=9),
        header(length=13),
        header(length=12) + b"\x00\x00",  # shorter than its header
        header(length=8, flags=1) + b"abcd",  # CRC flag without room for the CRC
        header(length=12, flags=1) + (crc32c.crc32c(b"abc") ^ 1).to_bytes(4, "big") + b"abc",  # CRC mismatch
    ],
)
def test_anything_else_is_a_plain_message(data: bytes) -> None:
    assert parse_envelope(data) is None


@given(payload=st.binary(min_size=1, max_size=64), data=st.data())
def test_a_damaged_payload_fails_its_crc(payload: bytes, data: st.DataObject) -> None:
    encoded = bytearray(encode_envelope(MessageType.PUBLISH, payload, with_crc=True))
    position = data.draw(st.integers(12, len(encoded) - 1))
    encoded[position] ^= 1 << data.draw(st.integers(0, 7))
    assert parse_envelope(bytes(encoded)) is None


@given(st.binary(max_size=64) | st.binary(max_size=64).map(lambda rest: MAGIC + rest))
def test_parse_never_raises(data: bytes) -> None:
    envelope = parse_envelope(data)
    if envelope is not None:
        assert data.startswith(MAGIC) and len(envelope.payload) <= len(data) - 8


def test_encode_refuses_unknown_message_types() -> None:
    with pytest.raises(ValueError):
        encode_envelope(7, b"")  # type: ignore[arg-type]
