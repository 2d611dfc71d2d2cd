"""JetStream's publish expectations on NATS ingest: optimistic concurrency for plain NATS publishers.

A NATS message may carry JetStream's expectation headers; the partition then stores it only if they hold, and
otherwise answers on the message's reply subject with JetStream's error and stores nothing:

==============================  ======================================================  ==========================
header                          holds when                                              refusal (code 400)
==============================  ======================================================  ==========================
``Nats-Expected-Stream``        it names this stream                                    10060 expected stream does
                                                                                        not match
``Nats-Expected-Last-Sequence`` the partition's last sequence is this one               10071 wrong last sequence: N
``Nats-Expected-Last-Msg-Id``   the partition's last record carries this ``Nats-Msg-Id`` 10070 wrong last msg ID: ID
==============================  ======================================================  ==========================

**Sequences.** A JetStream sequence is 1-based; a partition's offsets are 0-based. Sequence = offset + 1, so the
last sequence of a partition is its log end (0 when it is empty, as for an empty JetStream stream), and
``Nats-Expected-Last-Sequence: N`` holds when the next offset is N. The refusal names the actual last sequence
(the log end), as JetStream does. A message whose expectations hold and that has a reply subject is answered with
JetStream's publish ack, ``{"stream": …, "seq": offset + 1}``; a duplicate (``Nats-Msg-Id``) is not checked.

**Atomic.** Sequence checks are the log's own expected-offset check, made where it assigns offsets under its lock
(:meth:`tidelog.broker.partitions.partition.Partition.write`); a message with an expectation is appended on its own,
after everything received before it, so its neighbours never share its fate. ``Nats-Expected-Last-Msg-Id`` reads
the last record and then appends expecting the log end it read: a message stored in between makes that append
refuse, and the refusal is then ``wrong last msg ID``.

**Cost.** Only the encoder's general path (messages with headers) looks for these headers; plain messages gain no
work.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tidelog.broker.ingest.msg_id_window import msg_id_of
from tidelog.protocol.records import decode_records, iter_batches
from tidelog.storage.encryption import open_batches
from tidelog.storage.log import Log

EXPECTED_STREAM = "Nats-Expected-Stream"
EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
PREFIX = "Nats-Expected-"

STREAM_NOT_MATCH = 10060
WRONG_LAST_MSG_ID = 10070
WRONG_LAST_SEQUENCE = 10071


@dataclass(frozen=True, slots=True)
class Check:
    """What a message expects of the log it is appended to (None: nothing of that kind), and where to answer."""

    reply: str
    last_sequence: int | None
    last_msg_id: bytes | None


class Unmet(Exception):
    """An expectation that does not hold (or cannot be read): JetStream's error code and description."""

    def __init__(self, err_code: int, description: str) -> None:
        super().__init__(description)
        self.err_code = err_code
        self.description = description


def has_expectations(headers: Sequence[tuple[str, bytes]]) -> bool:
    return any(name.startswith(PREFIX) for name, _ in headers)


def check_of(headers: Sequence[tuple[str, bytes]], reply: str, stream: str) -> Check | None:
    """What a message's expectation headers ask of the log (None: no such header; a matching
    ``Nats-Expected-Stream`` alone gives a check of nothing, which still gets the message its publish ack).
    Raises :class:`Unmet` for what fails at once: a different stream, or a last sequence that is no whole number."""
    values = {name: value for name, value in headers if name.startswith(PREFIX)}
    expected_stream = values.get(EXPECTED_STREAM)
    if expected_stream is not None and expected_stream.strip().decode(errors="replace") != stream:
        raise Unmet(STREAM_NOT_MATCH, "expected stream does not match")
    sequence: int | None = None
    raw = values.get(EXPECTED_LAST_SEQUENCE)
    if raw is not None:
        text = raw.strip().decode(errors="replace")
        if not text.isdigit():
            raise Unmet(WRONG_LAST_SEQUENCE, f"wrong last sequence: {text!r} is not a sequence (a whole number >= 0)")
        sequence = int(text)
    msg_id = values.get(EXPECTED_LAST_MSG_ID)
    last_id = msg_id.strip() if msg_id is not None else None
    if expected_stream is None and sequence is None and last_id is None:
        return None
    return Check(reply, sequence, last_id)


def last_msg_id(log_: Log, end: int) -> bytes | None:
    """The ``Nats-Msg-Id`` of the record just before offset ``end`` (None: none, or an empty log)."""
    if end <= log_.start_offset:
        return None
    data = log_.read(end - 1, 1)
    if log_.keyring is not None:
        data = open_batches(data, log_.keyring)
    found: bytes | None = None
    for position, header in iter_batches(data):
        for record in decode_records(data, position, header=header):
            if record.offset == end - 1:
                found = msg_id_of(record.headers)
    return found


def error_reply(err_code: int, description: str) -> bytes:
    """JetStream's error answer on a publish's reply subject."""
    return json.dumps({"error": {"code": 400, "err_code": err_code, "description": description}}).encode()


def ack_reply(stream: str, offset: int) -> bytes:
    """JetStream's publish ack for a message stored at ``offset`` (sequence = offset + 1)."""
    return json.dumps({"stream": stream, "seq": offset + 1}).encode()
