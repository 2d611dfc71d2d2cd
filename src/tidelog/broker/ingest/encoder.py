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
  the value (its bytes are drawn in :mod:`tidelog.protocol.records.ingest`, which holds the format side of this
  encoder: the tables, the general record and the batch headers).
  It costs a few table lookups, two concatenations and two list appends (a record's last byte travels with the
  next record's first piece); the payload, a view of the socket read, is copied once, into the batch.

All batches of one read are built in **one buffer** (one join), their headers and CRCs filled in afterwards, so the
read goes to the log as one append of one buffer, uncopied.

Everything else — another subject (wildcard streams), a reply subject, NATS headers, a Liftbridge envelope —
goes through :func:`tidelog.protocol.liftbridge.record_from_nats` (envelope decoding, reserved ``_tl.`` headers,
ack requests) and the general record layout.

**Deduplication** (with a :class:`~tidelog.broker.ingest.msg_id_window.MsgIdWindow`): a general-path record carrying a
``Nats-Msg-Id`` its window holds is left out (reported in :attr:`Encoded.duplicates`, using no offset and no
timestamp), and a new id is entered in the window before the record is encoded. Only the general path looks: a
plain message has no headers, so it has no id and its path gains no work.

**API publishes' copies** (:mod:`tidelog.broker.ingest.copies`): a general-path message whose NATS headers name this
partition (``copy_tag``) is left out before decoding (counted in :attr:`Encoded.copies`): its target already stored it.

A batch never exceeds the log's batch limit: a read that does not fit one batch is split, and a message that
could not fit even alone is reported back rather than handed to the log, which would refuse the whole append.
Likewise a message that cannot be encoded at all — a Liftbridge envelope with an ack policy outside the enum or
an ack inbox that is no NATS subject (:class:`~tidelog.protocol.liftbridge.RefusedEnvelopeError`), or any other
failure — is reported back in :attr:`Encoded.refused` and left out alone: its neighbours of the read are stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from tidelog.broker.ingest.copies import copy_marker, is_own_copy
from tidelog.broker.ingest.expectations import Check, Unmet, check_of, has_expectations
from tidelog.broker.ingest.msg_id_window import Entry, MsgIdWindow, msg_id_of
from tidelog.broker.ingest.natsproto import Msg, parse_headers
from tidelog.protocol.envelope import MAGIC
from tidelog.protocol.liftbridge import AckRequest, RefusedEnvelopeError, record_from_nats
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import HEADER_SIZE, NewRecord, encode_varint
from tidelog.protocol.records.ingest import (
    HEADER_SPACE,
    LENGTH,
    LENGTHS,
    NO_HEADERS,
    NULL,
    OWED_LENGTH,
    PLAIN_HEAD,
    PLAIN_SLACK,
    TABLE,
    fill_headers,
    general_record,
    plain_record_size,
    record_head,
)


def _reply_of(message: Message) -> str:
    if type(message) is Msg:
        return message.reply.decode(errors="replace")
    if type(message) is Decoded:
        return message.reply
    return ""


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
    copies: int = 0  # API publishes' NATS copies this partition already stores (left out)
    unmet: list[tuple[str, Unmet]] = field(default_factory=list)  # (reply subject, why): expectations that failed
    stopped_at: Message | None = None  # a message with log expectations: encoding stopped before it
    check: Check | None = None  # what this read's one message expects of the log (``single`` encodings)

    @property
    def records(self) -> int:
        return sum(self.counts)


_ENVELOPE_START = MAGIC[0]  # a payload starting with it may be a Liftbridge envelope: the general path decides


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
        copy_tag: str | None = None,
        stream: str = "",
    ) -> None:
        """``copy_tag``: this partition's :func:`~tidelog.broker.ingest.copies.copy_tag`; a message whose
        ``Tidelog-Stored-In`` header names it is an API publish's copy, already stored, and is left out."""
        if max_batch_bytes <= HEADER_SIZE:
            raise ValueError(f"max_batch_bytes must be above {HEADER_SIZE}, got {max_batch_bytes}")
        if max_batch_records < 1:
            raise ValueError(f"max_batch_records must be positive, got {max_batch_records}")
        self._subject = partition_subject
        self._max_body = max_batch_bytes - HEADER_SIZE
        self._max_records = max_batch_records
        self._window = window
        self._copy_tag = copy_tag
        self._stream = stream
        self._copy_marker = copy_marker(copy_tag) if copy_tag is not None else b""

    def encode(self, messages: Iterable[Message], first_timestamp: int, *, single: bool = False) -> Encoded:
        """Encode one read's messages in order; message ``j`` (counting stored ones) is stamped
        ``first_timestamp + j``.

        A message with JetStream expectations on the log (:mod:`tidelog.broker.ingest.expectations`) ends the
        encoding before it (:attr:`Encoded.stopped_at`): the caller encodes it alone with ``single``, which puts
        its :attr:`Encoded.check` beside it, and goes on after it."""
        max_body = self._max_body
        max_records = self._max_records
        too_large: list[int] = []
        acks: list[tuple[int, AckRequest]] = []
        ids: list[tuple[int, Entry]] = []
        duplicates: list[tuple[Entry, AckRequest | None]] = []
        refused: list[Refused] = []
        copies = 0
        unmet: list[tuple[str, Unmet]] = []
        stopped_at: Message | None = None
        check: Check | None = None
        window = self._window
        copy_tag = self._copy_tag
        marks: list[tuple[int, int, int, int]] = []  # closed batches: position, body size, records, first timestamp
        parts: list[bytes | memoryview] = [HEADER_SPACE]
        append = parts.append
        position = 0  # of the open batch in the buffer
        k = 0  # records in the open batch
        size = 0  # their bytes
        stored = 0  # records in closed batches
        owed = False  # a plain record's last byte (header count 0) is not in parts yet: it goes with the next piece
        for message in messages:
            if type(message) is memoryview and (not message or message[0] != _ENVELOPE_START):
                n = len(message)
                if k == max_records or size + n + PLAIN_SLACK > max_body:
                    if k:
                        if owed:
                            append(NO_HEADERS)
                        marks.append((position, size, k, first_timestamp + stored))
                        position += HEADER_SIZE + size
                        stored += k
                        k, size, owed = 0, 0, False
                        append(HEADER_SPACE)
                    if n + PLAIN_SLACK > max_body and plain_record_size(0, n) > max_body:
                        too_large.append(n)
                        continue
                value_length = LENGTH[n] if n < LENGTHS else encode_varint(n)
                head = PLAIN_HEAD[k] if k < TABLE else record_head(k) + NULL
                inner = len(head) + len(value_length) + n + 1
                if inner < LENGTHS:
                    prefix = OWED_LENGTH[inner] if owed else LENGTH[inner]
                else:
                    prefix = NO_HEADERS + encode_varint(inner) if owed else encode_varint(inner)
                append(prefix + head + value_length)
                append(message)
                size += inner + len(prefix) - owed
                owed = True
                k += 1
                continue
            if copy_tag is not None and self._is_copy(message, copy_tag):
                copies += 1
                continue
            timestamp = first_timestamp + stored + k
            try:
                record, ack = self._record(message, timestamp)
                pieces, record_size = general_record(k, record.key, record.value, record.headers)
            except Exception as exc:  # this message alone: never its neighbours of the same read
                refused.append(_refusal(message, self._subject, exc))
                continue
            msg_id = None
            if window is not None and record.headers:
                msg_id = msg_id_of(record.headers)
                if msg_id is not None and (original := window.duplicate_of(msg_id, timestamp)) is not None:
                    duplicates.append((original, ack))
                    continue
            if record.headers and has_expectations(record.headers):
                reply = _reply_of(message)
                try:
                    expects = check_of(record.headers, reply, self._stream)
                except Unmet as exc:
                    unmet.append((reply, exc))
                    continue
                if expects is not None:
                    if not single:
                        stopped_at = message
                        break
                    check = expects
            if k == max_records or size + record_size > max_body:
                if k:
                    if owed:
                        append(NO_HEADERS)
                    marks.append((position, size, k, first_timestamp + stored))
                    position += HEADER_SIZE + size
                    stored += k
                    k, size, owed = 0, 0, False
                    append(HEADER_SPACE)
                    pieces, record_size = general_record(0, record.key, record.value, record.headers)
                if record_size > max_body:
                    too_large.append(len(record.value or b""))
                    continue
            if owed:
                append(NO_HEADERS)
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
                append(NO_HEADERS)
            marks.append((position, size, k, first_timestamp + stored))
        else:
            parts.pop()  # the space of a batch that got no record
        data = bytearray().join(parts)
        fill_headers(data, marks)
        counts = [count for _, _, count, _ in marks]
        return Encoded(data, counts, acks, too_large, ids, duplicates, refused, copies, unmet, stopped_at, check)

    def _is_copy(self, message: Message, tag: str) -> bool:
        """Whether ``message`` is an API publish's copy this partition already stores (see the module's notes)."""
        if isinstance(message, memoryview):
            return False  # no NATS headers
        return bool(message.headers) and is_own_copy(message.headers, tag, self._copy_marker)

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
