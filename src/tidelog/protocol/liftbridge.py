"""Mapping between tidelog records and Liftbridge's protobuf ``Message`` and ``Ack``.

A record has a key, a value and headers; a Liftbridge ``Message`` also has a subject, a reply subject, an ack
inbox, a correlation id and an ack policy. Those travel as *reserved headers* (names starting ``_tl.``), written
only when they carry something, so a plain NATS message on a stream's own subject costs no extra bytes:

=====================  ====================================================================
``_tl.subject``        NATS subject the message arrived on, when it differs from the partition's
``_tl.reply``          NATS reply subject
``_tl.ack_inbox``      Liftbridge ack inbox
``_tl.corr``           Liftbridge correlation id
``_tl.ack``            Liftbridge ack policy (one byte: 0 LEADER, 1 ALL, 2 NONE), when not LEADER
=====================  ====================================================================

Clients may not send headers with the reserved prefix (:func:`check_user_headers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, parse_envelope
from tidelog.protocol.errors import InvalidArgumentError
from tidelog.protocol.records import NewRecord, Record
from tidelog.protocol.records.rows import ConsumerRecord
from tidelog.protocol.subjects import ack_problem, quote, subject_problem

RESERVED_PREFIX = "_tl."
SUBJECT = "_tl.subject"
REPLY = "_tl.reply"
ACK_INBOX = "_tl.ack_inbox"
CORRELATION_ID = "_tl.corr"
ACK_POLICY = "_tl.ack"

_LEADER = 0


@dataclass(frozen=True, slots=True)
class AckRequest:
    """Where and how a NATS publisher asked to be acknowledged."""

    ack_inbox: str
    correlation_id: str
    ack_policy: int
    msg_subject: str


class RefusedEnvelopeError(InvalidArgumentError):
    """A Liftbridge envelope whose fields cannot be honoured; it is not stored.

    ``ack`` is where to send the error ack (policy LEADER), when the envelope named a usable ack inbox.
    """

    def __init__(self, message: str, ack: AckRequest | None) -> None:
        super().__init__(message)
        self.ack = ack


def check_user_headers(headers: Iterable[str]) -> None:
    """Refuse client headers that would collide with the reserved ones."""
    for name in headers:
        if name.startswith(RESERVED_PREFIX):
            raise InvalidArgumentError(f"header name {name!r} uses the reserved prefix {RESERVED_PREFIX!r}")


def record_for_publish(
    *,
    key: bytes | None,
    value: bytes,
    headers: Mapping[str, bytes],
    timestamp: int,
    subject: str = "",
    partition_subject: str = "",
    reply: str = "",
    ack_inbox: str = "",
    correlation_id: str = "",
    ack_policy: int = _LEADER,
) -> NewRecord:
    """A record carrying a Liftbridge message's fields."""
    hdrs: list[tuple[str, bytes]] = list(headers.items())
    if subject and subject != partition_subject:
        hdrs.append((SUBJECT, subject.encode()))
    if reply:
        hdrs.append((REPLY, reply.encode()))
    if ack_inbox:
        hdrs.append((ACK_INBOX, ack_inbox.encode()))
    if correlation_id:
        hdrs.append((CORRELATION_ID, correlation_id.encode()))
    if ack_policy != _LEADER:
        hdrs.append((ACK_POLICY, bytes((ack_policy,))))
    return NewRecord(value=value, key=key or None, headers=hdrs, timestamp=timestamp)


def record_from_nats(
    subject: str,
    reply: str,
    data: bytes,
    nats_headers: Sequence[tuple[str, bytes]],
    partition_subject: str,
    timestamp: int,
) -> tuple[NewRecord, AckRequest | None]:
    """Turn one NATS message into a record, decoding a Liftbridge envelope when there is one.

    A message that is not a well-formed envelope (or whose protobuf does not parse) is stored whole as the
    value: a NATS message is never dropped. An envelope that decodes but asks for what cannot be done (an ack
    policy outside the enum, an ack inbox that is no valid NATS subject) raises :class:`RefusedEnvelopeError`:
    the caller refuses that message alone. ``nats_headers`` are the message's NATS headers in order (a name may
    repeat); those with the reserved prefix are left out, and an envelope's own headers replace them.
    """
    env = parse_envelope(data) if data[:1] == b"\xb9" else None
    if env is not None and env.msg_type is MessageType.PUBLISH:
        msg: api_pb2.Message | None = api_pb2.Message()
        try:
            msg.ParseFromString(bytes(env.payload))  # type: ignore[union-attr]
        except Exception:
            msg = None
        if msg is not None:
            policy = int(msg.ackPolicy)
            problem = ack_problem(msg.ackInbox, policy)
            if problem is not None:
                inbox_ok = bool(msg.ackInbox) and subject_problem(msg.ackInbox, wildcards=False) is None
                error_ack = AckRequest(msg.ackInbox, msg.correlationId, _LEADER, subject) if inbox_ok else None
                raise RefusedEnvelopeError(f"envelope on {quote(subject)}: {problem}", error_ack)
            user_headers = {k: v for k, v in msg.headers.items() if not k.startswith(RESERVED_PREFIX)}
            record = record_for_publish(
                key=msg.key,
                value=msg.value,
                headers=user_headers,
                timestamp=timestamp,
                subject=subject,
                partition_subject=partition_subject,
                reply=reply,
                ack_inbox=msg.ackInbox,
                correlation_id=msg.correlationId,
                ack_policy=policy,
            )
            ack = AckRequest(msg.ackInbox, msg.correlationId, policy, subject) if msg.ackInbox else None
            return record, ack
    hdrs = [(k, v) for k, v in nats_headers if not k.startswith(RESERVED_PREFIX)]
    if subject != partition_subject:
        hdrs.append((SUBJECT, subject.encode()))
    if reply:
        hdrs.append((REPLY, reply.encode()))
    return NewRecord(value=data, headers=hdrs, timestamp=timestamp), None


def message_from_record(
    record: Record | ConsumerRecord, stream: str, partition: int, partition_subject: str
) -> api_pb2.Message:
    """The Liftbridge ``Message`` a subscriber receives for ``record``."""
    msg = api_pb2.Message(
        offset=record.offset,
        key=record.key or b"",
        value=record.value or b"",
        timestamp=record.timestamp,
        stream=stream,
        partition=partition,
        subject=partition_subject,
    )
    for name, value in record.headers:
        if not name.startswith(RESERVED_PREFIX):
            msg.headers[name] = value
        elif name == SUBJECT:
            msg.subject = value.decode(errors="replace")
        elif name == REPLY:
            msg.replySubject = value.decode(errors="replace")
        elif name == ACK_INBOX:
            msg.ackInbox = value.decode(errors="replace")
        elif name == CORRELATION_ID:
            msg.correlationId = value.decode(errors="replace")
        elif name == ACK_POLICY and value:
            msg.ackPolicy = value[0]  # type: ignore[assignment]
    return msg


def build_ack(
    *,
    stream: str,
    partition_subject: str,
    msg_subject: str,
    offset: int,
    ack_inbox: str,
    correlation_id: str,
    ack_policy: int,
    received_ns: int,
    committed_ns: int,
    error: int = 0,
) -> api_pb2.Ack:
    return api_pb2.Ack(
        stream=stream,
        partitionSubject=partition_subject,
        msgSubject=msg_subject,
        offset=offset,
        ackInbox=ack_inbox,
        correlationId=correlation_id,
        ackPolicy=ack_policy,  # type: ignore[arg-type]
        receptionTimestamp=received_ns,
        commitTimestamp=committed_ns,
        ackError=error,  # type: ignore[arg-type]
    )
