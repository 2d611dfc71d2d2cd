"""The NATS client protocol, as much of it as an ingest subscriber speaks: pure encode and parse functions.

NATS is a text protocol over TCP; every operation is one line ended by CRLF, and the two that carry a message are
followed by its bytes and another CRLF. What a subscriber sends and receives::

    client → server                             server → client
    CONNECT {json}                              INFO {json}            first thing on a connection; again later
    SUB <subject> [queue group] <sid>           MSG <subject> <sid> [reply] <#bytes>␍␊<payload>
    UNSUB <sid>                                 HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>␍␊
    PING / PONG                                      <headers><payload>          (headers start "NATS/1.0")
                                                PING / PONG / +OK / -ERR '<text>'

:func:`parse` reads a buffer **in bulk**: it walks it with ``bytes.find`` and slices, appends one item per message
to a list and returns where it stopped, so the caller pays one function call per socket read rather than objects,
queues and tasks per message. A message on the subscription's own subject with no reply and no headers — the
common case, and the one ingest stores with no extra fields — is recognised by its line starting with a fixed
``MSG <subject> <sid> `` prefix and handed over as its payload alone, a ``memoryview`` of the read (copying bytes
costs about as much as parsing here: a payload is copied once, into its record batch); every other message becomes a
:class:`Msg`. Control operations (PING, PONG, +OK, -ERR, INFO) are rare and go to a callback, in stream order.

A message split across reads is never half-parsed: :func:`parse` stops before it and says how many bytes it needs;
:class:`Parser` then completes it with exactly those bytes of the next read and parses the rest of that read in
place, so a large payload's pieces are joined once and a read is never re-copied whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import NamedTuple

CRLF = b"\r\n"
PING = b"PING\r\n"
PONG = b"PONG\r\n"
HEADER_LINE = b"NATS/1.0"

MAX_CONTROL_LINE = 64 * 1024
"""Longest operation line accepted (the server's own limit is 4 KiB by default): past this without a CRLF the
stream is not NATS, and the connection is dropped rather than buffered without bound."""

DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
"""The largest payload NATS allows at all; the server's INFO ``max_payload`` narrows it."""


class ProtocolError(Exception):
    """The bytes from the server are not the NATS protocol (or not what was expected at this point)."""


class Msg(NamedTuple):
    """A message that is not the plain case: another subject (a wildcard subscription), a reply subject, or headers."""

    subject: bytes
    sid: bytes
    reply: bytes  # b"" when there is none
    payload: bytes
    headers: bytes | None  # the raw header block of an HMSG (``NATS/1.0␍␊Name: value␍␊…␍␊``); None for MSG


Item = memoryview | Msg
"""One parsed message: the payload alone (plain), as a view into the bytes parsed, or a :class:`Msg`."""


class Route:
    """Where the messages of one subscription go, on a connection that carries many (:func:`parse`'s ``routes``).

    ``prefix`` is the subscription's :func:`plain_prefix` (None for a wildcard); ``items`` collects its messages
    until the caller takes them."""

    __slots__ = ("items", "prefix")

    def __init__(self, prefix: bytes | None) -> None:
        self.prefix = prefix
        self.items: list[Item] = []


Routes = Mapping[bytes, Route]
"""Subscriptions by sid: how :func:`parse` hands each message to its own subscription."""


ControlHandler = Callable[[bytes, bytes], None]
"""Called with the operation (``b"PING"``, ``b"PONG"``, ``b"+OK"``, ``b"-ERR"``, ``b"INFO"``) and its argument."""


# --------------------------------------------------------------------------------------------- encoding


def _check_token(what: str, text: str) -> bytes:
    if not text or any(ch.isspace() for ch in text):
        raise ValueError(f"NATS {what} must be non-empty and free of whitespace, got {text!r}")
    return text.encode()


def connect_command(options: Mapping[str, object]) -> bytes:
    return b"CONNECT " + json.dumps(dict(options), separators=(",", ":")).encode() + CRLF


def sub_command(subject: str, sid: str, queue: str | None = None) -> bytes:
    parts = [b"SUB", _check_token("subject", subject)]
    if queue:
        parts.append(_check_token("queue group", queue))
    parts.append(_check_token("sid", sid))
    return b" ".join(parts) + CRLF


def unsub_command(sid: str) -> bytes:
    return b"UNSUB " + _check_token("sid", sid) + CRLF


def plain_prefix(subject: str, sid: str) -> bytes | None:
    """The start of every MSG line on exactly ``subject`` (``None`` for a wildcard: no message has that subject)."""
    tokens = subject.split(".")
    if "*" in tokens or ">" in tokens:
        return None
    return b"MSG " + _check_token("subject", subject) + b" " + _check_token("sid", sid) + b" "


# --------------------------------------------------------------------------------------------- parsing


_MAX_COUNT_DIGITS = 20  # a byte count has at most this many digits (64 bits); a longer one is not NATS


def _size(text: bytes, limit: int) -> int:
    if len(text) > _MAX_COUNT_DIGITS or not text.isdigit():
        raise ProtocolError(f"bad byte count {text[:32]!r}")
    size = int(text)
    if size > limit:
        raise ProtocolError(f"message of {size} bytes is above the limit of {limit}")
    return size


def _plain_run(buf: bytes, pos: int, prefix: bytes, out: list[Item], max_payload: int) -> tuple[int, int]:
    """Take the plain messages (``prefix`` then a byte count: no reply, no headers) that follow each other from
    ``pos``, as views of ``buf``; return ``(pos, need)``: where they stopped, and the length of the message there
    when its payload is cut by the end of ``buf`` (0 otherwise: the general path goes on from ``pos``).

    A tight loop, since this is the common case: one ``startswith`` checks both that a payload ends with CRLF and
    that the next message is plain too. A reply shows as a non-digit in the byte count, and a line not complete
    yet as no CRLF: both go back to the general path."""
    find = buf.find
    startswith = buf.startswith
    append = out.append
    view = memoryview(buf)
    end_of_buf = len(buf)
    plen = len(prefix)
    chained = CRLF + prefix
    after = pos + plen
    while True:
        eol = find(CRLF, after, after + _MAX_COUNT_DIGITS + 2)
        if eol < 0:
            return pos, 0
        digits = buf[after:eol]
        if not digits.isdigit():
            return pos, 0
        start = eol + 2
        stop = start + int(digits)
        if stop + 2 > end_of_buf:
            if stop - start > max_payload:
                raise ProtocolError(f"message of {stop - start} bytes is above the limit of {max_payload}")
            return pos, stop + 2 - pos
        append(view[start:stop])
        pos = stop + 2
        if startswith(chained, stop):
            after = pos + plen
            continue
        if not startswith(CRLF, stop):
            out.pop()
            raise ProtocolError("message payload is not followed by CRLF")
        return pos, 0


def parse(
    buf: bytes,
    pos: int,
    out: list[Item],
    on_control: ControlHandler,
    prefix: bytes | None = None,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    routes: Routes | None = None,
    touched: list[Route] | None = None,
) -> tuple[int, int]:
    """Parse every complete operation of ``buf[pos:]``; return ``(pos, need)``.

    Messages are appended to ``out``: the payload alone for a MSG line starting with ``prefix`` and carrying no
    reply (see :func:`plain_prefix`), as a ``memoryview`` of ``buf`` (no copy), a :class:`Msg` otherwise. ``pos``
    is the first byte not consumed; ``need`` is how many bytes from there the next operation takes when its line
    is known (a message whose payload has not fully arrived), 0 when its line is not complete yet. Raises
    :class:`ProtocolError` on anything that is not the protocol; what was appended to ``out`` and reported to
    ``on_control`` before it stands.

    With ``routes`` (a connection carrying many subscriptions) each message goes to its sid's :class:`Route`
    instead, the plain ones of a route as views of ``buf`` (one route's consecutive plain messages take the same
    tight loop as ``prefix``'s), and ``touched`` receives each route whose ``items`` were empty before; a message
    for a sid with no route (one unsubscribed meanwhile) goes to ``out``.
    """
    end_of_buf = len(buf)
    find = buf.find
    startswith = buf.startswith
    while pos < end_of_buf:
        if prefix and startswith(prefix, pos):
            pos, need = _plain_run(buf, pos, prefix, out, max_payload)
            if need:
                return pos, need
        eol = find(CRLF, pos, pos + MAX_CONTROL_LINE)
        if eol < 0:
            if end_of_buf - pos >= MAX_CONTROL_LINE:
                raise ProtocolError(f"no line end within {MAX_CONTROL_LINE} bytes")
            return pos, 0
        words = buf[pos:eol].split(None, 1)
        op = words[0].upper() if words else b""
        arg = words[1] if len(words) > 1 else b""
        if op == b"MSG" or op == b"HMSG":
            args = arg.split()
            if op == b"MSG":
                if len(args) == 3:
                    subject, sid, size_text = args
                    reply = b""
                elif len(args) == 4:
                    subject, sid, reply, size_text = args
                else:
                    raise ProtocolError(f"bad MSG line {buf[pos:eol][:200]!r}")
                header_size = 0
                total = _size(size_text, max_payload)
            else:
                if len(args) == 4:
                    subject, sid, header_text, size_text = args
                    reply = b""
                elif len(args) == 5:
                    subject, sid, reply, header_text, size_text = args
                else:
                    raise ProtocolError(f"bad HMSG line {buf[pos:eol][:200]!r}")
                header_size = _size(header_text, max_payload)
                total = _size(size_text, max_payload)
                if header_size > total:
                    raise ProtocolError(f"header of {header_size} bytes in a message of {total}")
            target = out
            if routes is not None:
                route = routes.get(sid)
                if route is not None:
                    target = route.items
                    if not target:
                        touched.append(route)  # type: ignore[union-attr]
                    plain = route.prefix
                    if plain and not reply and op == b"MSG" and startswith(plain, pos):
                        taken, need = _plain_run(buf, pos, plain, target, max_payload)
                        if need:
                            return taken, need
                        if taken != pos:
                            pos = taken
                            continue
            start = eol + 2
            stop = start + total
            if stop + 2 > end_of_buf:
                return pos, stop + 2 - pos
            if not startswith(CRLF, stop):
                raise ProtocolError("message payload is not followed by CRLF")
            headers = buf[start : start + header_size] if op == b"HMSG" else None
            target.append(Msg(subject, sid, reply, buf[start + header_size : stop], headers))
            pos = stop + 2
        elif op in (b"PING", b"PONG", b"+OK", b"-ERR", b"INFO"):
            pos = eol + 2
            on_control(op, arg.strip())
        else:
            raise ProtocolError(f"unknown operation {buf[pos:eol][:64]!r}")
    return pos, 0


class Parser:
    """:func:`parse` over a stream that arrives in pieces: keeps the start of an operation cut by a read's end.

    A read is parsed in place; only the operation cut at its end is kept (as views, not copies), and the next read
    completes it with just the bytes it lacks — its payload's remaining length when its line had arrived, up to
    :data:`_LINE_STEP` bytes at a time when the line itself was cut — before going on in place again. So each byte
    is copied at most once on its way through, and a payload spread over many reads is joined once, when complete.
    """

    __slots__ = ("_have", "_need", "_pending", "max_payload", "on_control", "prefix", "routes", "touched")

    def __init__(
        self,
        on_control: ControlHandler,
        prefix: bytes | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        routes: Routes | None = None,
    ) -> None:
        """``routes``: the subscriptions of a connection that carries many, by sid (see :func:`parse`); the caller
        may change the mapping between feeds. ``touched`` then lists the routes that received messages."""
        self.on_control = on_control
        self.prefix = prefix
        self.max_payload = max_payload
        self.routes = routes
        self.touched: list[Route] = []
        self._pending: list[bytes | memoryview] = []  # the start of an operation cut by the end of a read...
        self._have = 0  # ...its length so far...
        self._need = 0  # ...and the length it takes, when known (its line has arrived)

    def feed(self, data: bytes, out: list[Item]) -> None:
        """Parse what ``data`` completes, appending messages to ``out``; keep the rest for the next call.

        Raises :class:`ProtocolError` (after appending the messages before the fault); the parser is then unusable.
        """
        pos = 0
        end = len(data)
        while self._have:
            want = self._need - self._have if self._need else _LINE_STEP
            take = min(want, end - pos)
            self._pending.append(memoryview(data)[pos : pos + take])
            self._have += take
            pos += take
            if self._need and self._have < self._need:
                return  # all of data went to a payload that is still not complete
            buf = b"".join(self._pending)
            self._pending, self._have, self._need = [], 0, 0
            done, need = parse(buf, 0, out, self.on_control, self.prefix, self.max_payload, self.routes, self.touched)
            left = len(buf) - done
            if left <= take:  # what is left (if anything) starts within data: parse it there
                pos -= left
                break
            self._pending, self._have, self._need = [buf[done:]], left, need
            if pos == end:
                return
        done, need = parse(data, pos, out, self.on_control, self.prefix, self.max_payload, self.routes, self.touched)
        if done < end:
            self._pending, self._have, self._need = [memoryview(data)[done:]], end - done, need

    @property
    def buffered(self) -> int:
        """Bytes held for an operation not complete yet."""
        return self._have


_LINE_STEP = 4096
"""Bytes of a new read joined at a time with a cut line: enough for any usual line and a small payload."""


def parse_error(arg: bytes) -> str:
    """The text of a ``-ERR`` argument (the server quotes it: ``'Authorization Violation'``)."""
    return arg.decode(errors="replace").strip().strip("'")


def parse_info(arg: bytes) -> dict[str, object]:
    try:
        info = json.loads(arg)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the interpreter's stack
        raise ProtocolError(f"INFO is not JSON: {arg[:200]!r}") from exc
    if not isinstance(info, dict):
        raise ProtocolError(f"INFO is not a JSON object: {arg[:200]!r}")
    return info


def parse_headers(block: bytes) -> list[tuple[str, bytes]]:
    """The headers of an HMSG, in order, repeated names kept (NATS headers are multi-valued).

    ``NATS/1.0[ <status>[ <description>]]`` opens the block; a status a publisher put there is kept as the
    ``Status`` and ``Description`` headers. Each further line is ``Name: value``: the name must be ASCII without
    whitespace (a line that breaks the rule is skipped), the value's surrounding whitespace is trimmed and its
    bytes are kept as they are.
    """
    lines = block.split(CRLF)
    first = lines[0]
    headers: list[tuple[str, bytes]] = []
    if first.startswith(HEADER_LINE) and len(first) > len(HEADER_LINE):
        status, _, description = first[len(HEADER_LINE) :].strip().partition(b" ")
        if status.isdigit():
            headers.append(("Status", status))
        if description.strip():
            headers.append(("Description", description.strip()))
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        name = name.strip()
        if not colon or not name or not name.isascii() or any(ch in b" \t\r\n\v\f" for ch in name):
            continue
        headers.append((name.decode("ascii"), value.strip()))
    return headers
