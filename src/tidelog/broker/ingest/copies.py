"""API publishes as NATS messages: the copy a gRPC ``Publish`` puts on NATS, and how its own target skips it.

In Liftbridge a message published through the API is a NATS message on the partition's subject, so every other
stream bound to that subject and every plain NATS subscriber sees it too. tidelog keeps its direct write (the
target partition is written by the request itself, so acks and ``expectedOffset`` keep their meaning and the
write costs no NATS round trip) and, once that write has succeeded, publishes a **copy** on the partition's
subject:

- The copy is a Liftbridge envelope (``PUBLISH``) holding the message's key, value, headers and correlation id —
  what Liftbridge itself puts on NATS — without an ack inbox: the caller's ack comes from the target; other
  streams storing the copy do not answer it. Another tidelog or Liftbridge stream on the subject decodes the
  envelope and stores key, value and headers; a plain NATS subscriber receives the envelope bytes, as it would
  from Liftbridge.
- The copy goes out on the target ingest's own NATS connection when it has one (tidelog's reader, whose ``echo`` is
  off): the server then never sends it back to the target, which costs the target nothing. Otherwise (the ingest
  uses nats-py, the publish was forwarded from another broker, that connection is down) it goes out through the
  broker's nats-py client and reaches the target's ingest, which leaves it out by its header:
- The copy carries one NATS header, :data:`COPY_HEADER`, naming where it is already stored: ``{stream}/{partition}``,
  or, for a stream in a queue group, ``group {queue group}``. An ingest whose own tag (:func:`copy_tag`) it names
  leaves the copy out — a header comparison on the ingest's general path, which the copy takes anyway (it has
  headers); plain messages never look. So the target stores the message exactly once, whichever of its brokers
  leads when the copy arrives, and a queue group stores it once in all (NATS hands the copy to one member, which
  leaves it out whether it is the target or not).

**Reserved header.** A plain NATS message that carries :data:`COPY_HEADER` with a stream's tag is not stored by that
stream. The header is tidelog's; publishers have no reason to set it.

**Failure and order.** The copy goes out after the write: a write that fails publishes nothing (the caller gets
the error and may retry with no duplicate anywhere). A copy that cannot be published (the broker's NATS connection
is down, beyond nats-py's reconnect buffer) is logged and counted (:data:`copy_failures`), and the publish is still
answered with its ack: the target holds the message, and an error would make the caller store it twice. Other
streams then miss it, as they miss any NATS message published while NATS is unreachable. Other streams see API
publishes in the order their copies reach NATS, which for concurrent publishes (``PublishAsync``) may differ from
the target's offsets order; one caller's publishes awaited one by one keep their order everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, encode_envelope

log = logging.getLogger(__name__)

COPY_HEADER = "Tidelog-Stored-In"
"""The NATS header on an API publish's copy: the stream (or queue group) that already stores it."""

copy_failures = 0
"""Copies this process could not publish (their messages are stored in their target only)."""


def copy_tag(stream: str, partition: int, queue: str | None) -> str:
    """What :data:`COPY_HEADER` says for a partition: its queue group when its stream has one, else itself."""
    return f"group {queue}" if queue else f"{stream}/{partition}"


def copy_marker(tag: str) -> bytes:
    """The header line as it appears in a raw NATS header block (``…␍␊Name: value␍␊``), for a substring test."""
    return f"\r\n{COPY_HEADER}: {tag}\r\n".encode()


def is_own_copy(headers: Any, tag: str, marker: bytes) -> bool:
    """Whether a message's NATS headers (a raw block, or parsed ``(name, value)`` pairs) name ``tag``."""
    if isinstance(headers, (bytes, bytearray, memoryview)):
        return marker in bytes(headers)
    value = tag.encode()
    return any(name == COPY_HEADER and bytes(v).strip() == value for name, v in headers)


def copy_command(subject: str, tag: str, payload: bytes) -> bytes:
    """The NATS ``HPUB`` command of a copy (headers: :data:`COPY_HEADER` only), ready for a socket."""
    headers = f"NATS/1.0\r\n{COPY_HEADER}: {tag}\r\n\r\n".encode()
    size = len(headers)
    return b"".join((f"HPUB {subject} {size} {size + len(payload)}\r\n".encode(), headers, payload, b"\r\n"))


async def publish_copy(
    nc: Any,
    subject: str,
    tag: str,
    *,
    direct: Callable[[bytes], bool] | None,
    key: bytes,
    value: bytes,
    headers: Mapping[str, bytes],
    correlation_id: str,
) -> None:
    """Publish the stored message's copy on ``subject`` (see the module's notes); a failure is logged, not raised.

    ``direct``: the target ingest's own connection (:meth:`~tidelog.broker.ingest.nats_reader.NatsReader.publish`),
    tried first; ``nc``, the broker's nats-py client, when there is none or it cannot take the copy."""
    global copy_failures
    message = api_pb2.Message(key=key, value=value, subject=subject, correlationId=correlation_id)
    for name, v in headers.items():
        message.headers[name] = v
    payload = encode_envelope(MessageType.PUBLISH, message.SerializeToString())
    if direct is not None and direct(copy_command(subject, tag, payload)):
        return
    try:
        await nc.publish(subject, payload, headers={COPY_HEADER: tag})
    except Exception as exc:
        copy_failures += 1
        log.warning("the NATS copy of a message published to %s could not be sent (it is stored): %r", tag, exc)
