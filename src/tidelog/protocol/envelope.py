"""The Liftbridge envelope: how Liftbridge clients wrap protobufs they send through plain NATS.

A Liftbridge client that publishes straight to a stream's NATS subject (instead of calling the gRPC ``Publish``)
wraps a protobuf ``Message`` in this envelope so the broker can recover key, headers, ack inbox and ack policy;
the broker answers on the ack inbox with an enveloped protobuf ``Ack``. Integers are big-endian::

    offset  size  field
         0     4  magic           B9 0E 43 B4
         4     1  version         0
         5     1  header_length   8, or 12 when a CRC is present
         6     1  flags           bit 0: CRC-32C of the payload is in bytes 8-11; other bits are ignored
         7     1  message_type    0 publish (payload: protobuf Message), 1 ack (payload: protobuf Ack)
         8     4  crc32c          Castagnoli CRC of the payload (only when flags bit 0 is set)
         …     …  payload         starts at header_length

Any NATS message is a candidate: most carry no envelope at all and are stored whole as the record value, so
:func:`parse_envelope` answers ``None`` (never raises) for anything that is not a well-formed envelope — wrong
magic, version, type or length, or a CRC mismatch. Treating a damaged envelope as a plain message rather than
dropping it is Liftbridge's rule: a NATS message is never lost.

This module works on bytes only: the caller decodes the protobuf payload with the generated ``proto`` types,
so that the codec does not depend on generated code.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import crc32c

MAGIC = b"\xb9\x0e\x43\xb4"
VERSION = 0
HEADER = struct.Struct(">4sBBBB")  # magic, version, header_length, flags, message_type
HEADER_SIZE = HEADER.size  # 8
CRC = struct.Struct(">I")
HEADER_SIZE_WITH_CRC = HEADER_SIZE + CRC.size  # 12
FLAG_CRC = 0x01


class MessageType(enum.IntEnum):
    PUBLISH = 0  # payload: protobuf ``proto.Message``
    ACK = 1  # payload: protobuf ``proto.Ack``


_TYPES: tuple[MessageType, ...] = tuple(MessageType)


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded envelope. ``payload`` is a read-only view into the bytes that were parsed (no copy)."""

    msg_type: MessageType
    payload: memoryview
    crc_checked: bool  # the envelope carried a CRC and it matched


def parse_envelope(data: bytes | bytearray | memoryview) -> Envelope | None:
    """Decode ``data`` as an envelope, or ``None`` when it is not one (then it is a plain NATS message).

    The CRC, when present, is verified here: a mismatch means the bytes are not a trustworthy envelope, and
    the caller falls back to storing them as they are.
    """
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if len(view) < HEADER_SIZE or view[:4] != MAGIC:
        return None
    _, version, header_length, flags, msg_type = HEADER.unpack_from(view)
    if version != VERSION or msg_type >= len(_TYPES):
        return None
    has_crc = bool(flags & FLAG_CRC)
    if header_length not in (HEADER_SIZE, HEADER_SIZE_WITH_CRC) or len(view) < header_length:
        return None
    if has_crc and header_length != HEADER_SIZE_WITH_CRC:
        return None
    payload = view[header_length:].toreadonly()
    if has_crc:
        (expected,) = CRC.unpack_from(view, HEADER_SIZE)
        if crc32c.crc32c(payload) != expected:
            return None
    return Envelope(_TYPES[msg_type], payload, has_crc)


def encode_envelope(msg_type: MessageType, payload: bytes | bytearray | memoryview, with_crc: bool = True) -> bytes:
    """Wrap ``payload`` (a serialized protobuf ``Message`` or ``Ack``) in an envelope.

    The CRC is on by default: it costs a few nanoseconds per kilobyte and lets the receiver tell a damaged
    envelope from a plain message. Liftbridge clients may send either form; both are accepted.
    """
    msg_type = MessageType(msg_type)
    if with_crc:
        header = HEADER.pack(MAGIC, VERSION, HEADER_SIZE_WITH_CRC, FLAG_CRC, msg_type)
        return b"".join((header, CRC.pack(crc32c.crc32c(payload)), payload))
    return b"".join((HEADER.pack(MAGIC, VERSION, HEADER_SIZE, 0, msg_type), payload))


def is_envelope(data: bytes | bytearray | memoryview) -> bool:
    """Cheap pre-check: does ``data`` start with the envelope magic? (Parsing may still answer ``None``.)"""
    return bytes(data[:4]) == MAGIC
