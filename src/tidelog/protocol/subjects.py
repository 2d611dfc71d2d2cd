"""NATS subjects and Liftbridge ack policies that clients hand us: checked once, where they enter.

A client names NATS subjects in three places: a stream's subject (and queue group) at ``CreateStream``, an ack
inbox on ``Publish`` or inside a Liftbridge envelope, and the subject of ``PublishToSubject``. The broker later
subscribes to the first and publishes to the others through its own NATS connections, so a subject the NATS
server refuses would fail *after* the message was stored (a client then retries and stores a duplicate) or, worse,
make the server close a connection every other partition shares. Hence every such subject is checked before
anything is stored, and refused with :class:`~tidelog.protocol.errors.InvalidArgumentError` naming the field and the
rule:

- **Syntax** (NATS's): tokens separated by ``.``, none empty, no whitespace or control characters. ``*`` and
  ``>`` appear only as whole tokens, the wildcards (``>`` only as the last); a subject published to has no
  wildcard tokens at all. A queue group has no whitespace or control characters.
- **Length**: at most :data:`MAX_SUBJECT_BYTES` bytes of UTF-8. nats-server closes a connection whose control
  line (``PUB``, ``SUB`` or ``MSG``: the verb, subject, reply or queue group, sid and sizes) is longer than its
  ``max_control_line``, 4096 bytes by default; nats-py does not expose the server's setting, so the bound is a
  constant that leaves room for a subject and a reply subject (or queue group) of the same bound on one line.

Error messages quote at most :data:`QUOTE_CHARS` characters of what the client sent (:func:`quote`): user input is
never echoed unbounded (gRPC carries the message in metadata, which is limited to 8 KiB).
"""

from __future__ import annotations

import re
from typing import Final

from tidelog.protocol.errors import InvalidArgumentError

MAX_SUBJECT_BYTES: Final = 1024
"""Longest NATS subject, ack inbox or queue group accepted (UTF-8 bytes; see the module's notes)."""

QUOTE_CHARS: Final = 64
"""At most this many characters of a client's input are quoted in an error message."""

ACK_POLICIES: Final = {0: "LEADER", 1: "ALL", 2: "NONE"}
"""Liftbridge's ``AckPolicy`` values. proto3 enums are open: the wire may carry any int32."""
_ALLOWED_POLICIES: Final = ", ".join(f"{name} ({value})" for value, name in ACK_POLICIES.items())

_BAD_CHAR = re.compile(r"[\s\x00-\x1f\x7f]")


def quote(text: str) -> str:
    """``text`` quoted for an error message, cut to :data:`QUOTE_CHARS` characters with a marker saying so."""
    if len(text) <= QUOTE_CHARS:
        return repr(text)
    return f"{text[:QUOTE_CHARS]!r}... ({len(text)} characters)"


def subject_problem(subject: str, *, wildcards: bool, max_bytes: int = MAX_SUBJECT_BYTES) -> str | None:
    """What is wrong with ``subject`` as a NATS subject, or None when nothing is.

    ``wildcards``: whether ``*`` and ``>`` tokens are allowed (a subscription's subject) or not (a subject
    published to).
    """
    if not subject:
        return "is empty"
    size = len(subject.encode(errors="surrogatepass"))
    if size > max_bytes:
        return f"is {size} bytes long; the limit is {max_bytes}"
    if _BAD_CHAR.search(subject):
        return "contains whitespace or a control character"
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if not token:
            return "has an empty token (a leading, trailing or doubled '.')"
        if token in ("*", ">"):
            if not wildcards:
                return f"has the wildcard token {token!r}, which a subject published to may not have"
            if token == ">" and i != len(tokens) - 1:
                return "has '>' before its last token"
        elif "*" in token or ">" in token:
            return f"has '*' or '>' inside the token {quote(token)} (a wildcard is a whole token)"
    return None


def check_queue_group(group: str) -> None:
    """Raise :class:`InvalidArgumentError` unless ``group`` (empty: none) can be a NATS queue group."""
    if not group:
        return
    size = len(group.encode(errors="surrogatepass"))
    if size > MAX_SUBJECT_BYTES:
        raise InvalidArgumentError(f"group {quote(group)} is {size} bytes long; the limit is {MAX_SUBJECT_BYTES}")
    if _BAD_CHAR.search(group):
        raise InvalidArgumentError(f"group {quote(group)} contains whitespace or a control character")


def check_subject(subject: str, field: str, *, wildcards: bool, max_bytes: int = MAX_SUBJECT_BYTES) -> None:
    """Raise :class:`InvalidArgumentError` naming ``field`` unless ``subject`` is a valid NATS subject."""
    problem = subject_problem(subject, wildcards=wildcards, max_bytes=max_bytes)
    if problem is not None:
        raise InvalidArgumentError(f"{field} {quote(subject)} is not a valid NATS subject: it {problem}")


def ack_problem(inbox: str, policy: int) -> str | None:
    """What is wrong with a Liftbridge message's ``ackInbox`` and ``ackPolicy`` (the field names of both the
    gRPC request and the enveloped ``Message``), or None. An empty inbox is fine: it asks for no ack."""
    if policy not in ACK_POLICIES:
        return f"ackPolicy must be one of {_ALLOWED_POLICIES}, got {policy}"
    problem = subject_problem(inbox, wildcards=False) if inbox else None
    if problem is not None:
        return f"ackInbox {quote(inbox)} is not a valid NATS subject: it {problem}"
    return None


def check_ack(inbox: str, policy: int) -> None:
    """Raise :class:`InvalidArgumentError` unless ``ackInbox`` and ``ackPolicy`` are valid (see :func:`ack_problem`)."""
    problem = ack_problem(inbox, policy)
    if problem is not None:
        raise InvalidArgumentError(problem)
