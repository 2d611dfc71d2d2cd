"""Ingest's record encoder: the NATS messages of one socket read become record batches, with little Python each.

The bytes are exactly those :func:`tidelog.protocol.records.build_batch` produces for the same records (a test checks
it); only the work differs. Two choices make the common case cheap:

- **Timestamps.** Every message of one read gets the read's reception time plus its position in the read, in
  nanoseconds (the ingest keeps them strictly increasing across reads). So in every batch the timestamp delta of
  a record equals its offset delta, and everything before the value's length comes from one precomputed table.
  The +1 ns per message is a tie-break, not a measurement: the messages of one read did arrive together, and
  distinct, ordered timestamps let a TIMESTAMP lookup land on each of them.
- **Plain messages.** A message on the partition's own subject, with no reply and no NATS headers, whose payload
  does not start like a Liftbridge envelope (byte ``B9``), is a record with no key and no headers, its payload as
  the value::

      varint(length)  00  varint(k)  varint(k)  01  varint(len(value))  value  00
                      │   │          │          │                              └ header count 0
                      │   │          │          └ key length -1: no key
                      │   │          └ offset delta
                      │   └ timestamp delta (= offset delta, see above)
                      └ attributes

  It costs a few table lookups, two concatenations and two list appends (a record's last byte travels with the
  next record's first piece); the payload, a view of the socket read, is copied once, into the batch.

All batches of one read are built in **one buffer** (one join), their headers and CRCs filled in afterwards, so the
read goes to the log as one append of one buffer, uncopied.

Everything else — another subject (wildcard streams), a reply subject, NATS headers, a Liftbridge envelope —
goes through :func:`tidelog.api.liftbridge.record_from_nats` (envelope decoding, reserved ``_tl.`` headers,
ack requests) and the general record layout.

**Deduplication** (with a :class:`~tidelog.broker.msg_id_window.MsgIdWindow`): a general-path record carrying a
``Nats-Msg-Id`` its window holds is left out (reported in :attr:`Encoded.duplicates`, using no offset and no
timestamp), and a new id is entered in the window before the record is encoded. Only the general path looks: a
plain message has no headers, so it has no id and its path gains no work.

A batch never exceeds the log's batch limit: a read that does not fit one batch is split, and a message that
could not fit even alone is reported back rather than handed to the log, which would refuse the whole append.
Likewise a message that cannot be encoded at all — a Liftbridge envelope with an ack policy outside the enum or
an ack inbox that is no NATS subject (:class:`~tidelog.api.liftbridge.RefusedEnvelopeError`), or any other
failure — is reported back in :attr:`Encoded.refused` and left out alone: its neighbours of the read are stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import crc32c

from tidelog.api.envelope import MAGIC
from tidelog.api.liftbridge import AckRequest, RefusedEnvelopeError, record_from_nats
from tidelog.api.wire.messages import Acks
from tidelog.broker.msg_id_window import Entry, MsgIdWindow, msg_id_of
from tidelog.broker.natsproto import Msg, parse_headers
from tidelog.protocol.records import (
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    LENGTH_FIELD_END,
    NewRecord,
    encode_varint,
)


class Decoded(NamedTuple):
    """A message a NATS client library already took apart (the nats-py fallback path)."""

    subject: str
    reply: str
    payload: bytes
    headers: Sequence[tuple[str, bytes]]


Message = memoryview | Msg | Decoded
"""What :meth:`IngestEncoder.encode` takes: a plain payload, a parsed :class:`Msg`, or a :class:`Decoded`."""


class Refused(NamedTuple):
    """A message the encoder could not take (a Liftbridge envelope it refuses, or any failure to encode it)."""

    subject: str
    reason: str
    ack: AckRequest | None  # where to send the error ack, if anywhere


def _refusal(message: Message, partition_subject: str, exc: Exception) -> Refused:
    if type(message) is Msg:
        subject = message.subject.decode(errors="replace")
    elif type(message) is Decoded:
        subject = message.subject
    else:
        subject = partition_subject
    if isinstance(exc, RefusedEnvelopeError):
        return Refused(subject, exc.message, exc.ack)
    return Refused(subject, f"{type(exc).__name__}: {exc}", None)


@dataclass(slots=True)
class Encoded:
    """What one read became: its batches, back to back in one buffer (offsets still to be assigned by the log).

    ``data`` is never written again once returned, so it may be handed to the log as a read-only view, uncopied.
    """

    data: bytearray
    counts: list[int]  # records of each batch, in order
    acks: list[tuple[int, AckRequest]]  # (index among this read's stored records, where to ack)
    too_large: list[int]  # payload sizes of messages no batch of this log can hold (not stored)
    ids: list[tuple[int, Entry]] = field(default_factory=list)  # (index among stored records, its window entry)
    duplicates: list[tuple[Entry, AckRequest | None]] = field(default_factory=list)  # left out: original, ack
    refused: list[Refused] = field(default_factory=list)  # messages that could not be taken (not stored)

    @property
    def records(self) -> int:
        return sum(self.counts)


_TABLE = 4096
_HEAD = [b"\x00" + encode_varint(k) + encode_varint(k) for k in range(_TABLE)]  # attributes, ts and offset deltas
_PLAIN_HEAD = [head + encode_varint(-1) for head in _HEAD]  # ... and no key
_LENGTHS = 1 << 13  # lengths below this encode through the table (one or two bytes)
_LENGTH = [encode_varint(n) for n in range(_LENGTHS)]
_NO_HEADERS = encode_varint(0)
_OWED_LENGTH = [_NO_HEADERS + length for length in _LENGTH]  # the previous record's last byte, then a length
_NULL = encode_varint(-1)
_ENVELOPE_START = MAGIC[0]  # a payload starting with it may be a Liftbridge envelope: the general path decides
_HEADER_SPACE = bytes(HEADER_SIZE)  # where a batch header goes, filled in once the batch is complete
_PLAIN_SLACK = 32
"""Bound on a plain record's framing (length, head, value length, header count): a batch is closed when the next
record might not fit, so it may end up to this many bytes short of the limit."""


def _head(k: int) -> bytes:
    return _HEAD[k] if k < _TABLE else b"\x00" + encode_varint(k) + encode_varint(k)


def _varint(n: int) -> bytes:
    return _LENGTH[n] if 0 <= n < _LENGTHS else encode_varint(n)


def plain_record_size(k: int, size: int) -> int:
    """Bytes a plain record of a ``size``-byte value takes at offset delta ``k``."""
    inner = len(_head(k)) + 1 + len(_varint(size)) + size + 1
    return len(_varint(inner)) + inner


def _general_record(
    k: int, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> tuple[list[bytes], int]:
    """A record in the general layout (key, value and headers of any kind): its pieces and their size."""
    head = _head(k) + (_NULL if key is None else _varint(len(key)) + key)
    head += _NULL if value is None else _varint(len(value))
    if headers:
        tail_parts = [_varint(len(headers))]
        for name, hvalue in headers:
            encoded = name.encode()
            tail_parts += (_varint(len(encoded)), encoded, _varint(len(hvalue)), hvalue)
        tail = b"".join(tail_parts)
    else:
        tail = _NO_HEADERS
    inner = len(head) + len(tail) + (0 if value is None else len(value))
    prefix = _varint(inner)
    pieces = [prefix + head, tail] if value is None else [prefix + head, value, tail]
    return pieces, len(prefix) + inner


def _fill_headers(data: bytearray, marks: list[tuple[int, int, int, int]]) -> None:
    """Write each batch's header (``marks``: position, body size, record count, first timestamp) and CRC."""
    for position, size, count, first_timestamp in marks:
        HEADER.pack_into(
            data,
            position,
            0,  # base offset: the log assigns it
            HEADER_SIZE + size - LENGTH_FIELD_END,
            0,  # leader epoch: the log assigns it
            FORMAT_VERSION,
            0,  # CRC, below
            0,  # attributes: no codec, not transactional, not control
            count - 1,
            first_timestamp,
            first_timestamp + count - 1,  # record k is stamped first + k
            -1,  # producer id
            -1,  # producer epoch
            -1,  # base sequence
            count,
        )
        crc = crc32c.crc32c(memoryview(data)[position + CRC_START : position + HEADER_SIZE + size])
        CRC_FIELD.pack_into(data, position + CRC_POS, crc)


class IngestEncoder:
    """Encodes reads for one partition; batches hold at most ``max_batch_bytes`` and ``max_batch_records``.

    With ``window``, messages whose ``Nats-Msg-Id`` it holds are left out, and new ids are entered in it.
    """

    def __init__(
        self,
        partition_subject: str,
        *,
        max_batch_bytes: int,
        max_batch_records: int,
        window: MsgIdWindow | None = None,
    ) -> None:
        if max_batch_bytes <= HEADER_SIZE:
            raise ValueError(f"max_batch_bytes must be above {HEADER_SIZE}, got {max_batch_bytes}")
        if max_batch_records < 1:
            raise ValueError(f"max_batch_records must be positive, got {max_batch_records}")
        self._subject = partition_subject
        self._max_body = max_batch_bytes - HEADER_SIZE
        self._max_records = max_batch_records
        self._window = window

    def encode(self, messages: Iterable[Message], first_timestamp: int) -> Encoded:
        """Encode one read's messages in order; message ``j`` (counting stored ones) is stamped
        ``first_timestamp + j``."""
        max_body = self._max_body
        max_records = self._max_records
        too_large: list[int] = []
        acks: list[tuple[int, AckRequest]] = []
        ids: list[tuple[int, Entry]] = []
        duplicates: list[tuple[Entry, AckRequest | None]] = []
        refused: list[Refused] = []
        window = self._window
        marks: list[tuple[int, int, int, int]] = []  # closed batches: position, body size, records, first timestamp
        parts: list[bytes | memoryview] = [_HEADER_SPACE]
        append = parts.append
        position = 0  # of the open batch in the buffer
        k = 0  # records in the open batch
        size = 0  # their bytes
        stored = 0  # records in closed batches
        owed = False  # a plain record's last byte (header count 0) is not in parts yet: it goes with the next piece
        for message in messages:
            if type(message) is memoryview and (not message or message[0] != _ENVELOPE_START):
                n = len(message)
                if k == max_records or size + n + _PLAIN_SLACK > max_body:
                    if k:
                        if owed:
                            append(_NO_HEADERS)
                        marks.append((position, size, k, first_timestamp + stored))
                        position += HEADER_SIZE + size
                        stored += k
                        k, size, owed = 0, 0, False
                        append(_HEADER_SPACE)
                    if n + _PLAIN_SLACK > max_body and plain_record_size(0, n) > max_body:
                        too_large.append(n)
                        continue
                value_length = _LENGTH[n] if n < _LENGTHS else encode_varint(n)
                head = _PLAIN_HEAD[k] if k < _TABLE else _head(k) + _NULL
                inner = len(head) + len(value_length) + n + 1
                if inner < _LENGTHS:
                    prefix = _OWED_LENGTH[inner] if owed else _LENGTH[inner]
                else:
                    prefix = _NO_HEADERS + encode_varint(inner) if owed else encode_varint(inner)
                append(prefix + head + value_length)
                append(message)
                size += inner + len(prefix) - owed
                owed = True
                k += 1
                continue
            timestamp = first_timestamp + stored + k
            try:
                record, ack = self._record(message, timestamp)
                pieces, record_size = _general_record(k, record.key, record.value, record.headers)
            except Exception as exc:  # this message alone: never its neighbours of the same read
                refused.append(_refusal(message, self._subject, exc))
                continue
            msg_id = None
            if window is not None and record.headers:
                msg_id = msg_id_of(record.headers)
                if msg_id is not None and (original := window.duplicate_of(msg_id, timestamp)) is not None:
                    duplicates.append((original, ack))
                    continue
            if k == max_records or size + record_size > max_body:
                if k:
                    if owed:
                        append(_NO_HEADERS)
                    marks.append((position, size, k, first_timestamp + stored))
                    position += HEADER_SIZE + size
                    stored += k
                    k, size, owed = 0, 0, False
                    append(_HEADER_SPACE)
                    pieces, record_size = _general_record(0, record.key, record.value, record.headers)
                if record_size > max_body:
                    too_large.append(len(record.value or b""))
                    continue
            if owed:
                append(_NO_HEADERS)
                owed = False
            parts += pieces
            size += record_size
            if ack is not None and ack.ack_policy != Acks.NONE:
                acks.append((stored + k, ack))
            if msg_id is not None and window is not None:
                ids.append((stored + k, window.add(msg_id, timestamp)))
            k += 1
        if k:
            if owed:
                append(_NO_HEADERS)
            marks.append((position, size, k, first_timestamp + stored))
        else:
            parts.pop()  # the space of a batch that got no record
        data = bytearray().join(parts)
        _fill_headers(data, marks)
        return Encoded(data, [count for _, _, count, _ in marks], acks, too_large, ids, duplicates, refused)

    def _record(self, message: Message, timestamp: int) -> tuple[NewRecord, AckRequest | None]:
        """The general path: envelope decoding, reserved headers for subject and reply, NATS headers."""
        headers: Sequence[tuple[str, bytes]]
        if type(message) is memoryview:  # a payload that may be a Liftbridge envelope
            subject, reply, payload, headers = self._subject, "", bytes(message), ()
        elif type(message) is Msg:
            subject = message.subject.decode(errors="replace")
            reply = message.reply.decode(errors="replace")
            payload = message.payload
            headers = parse_headers(message.headers) if message.headers is not None else ()
        else:
            subject, reply, payload, headers = cast(Decoded, message)
        return record_from_nats(subject, reply, payload, headers, self._subject, timestamp)
