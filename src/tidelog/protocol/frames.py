"""Framing of the tidelog wire protocol: how a byte stream is cut into frames.

Every frame is a 16-byte prefix, a msgspec-msgpack header and a raw payload, integers big-endian::

    offset  size  field
         0     4  frame_length    bytes after this field: 12 + header_length + payload length
         4     1  version         WIRE_VERSION (1); anything else is refused, the layout may differ
         5     1  kind            0 request, 1 response, 2 error, 3 push (server-initiated)
         6     2  op              PRODUCE, FETCH, METADATA… (``Op``); an error frame echoes the request's op
         8     4  correlation_id  chosen by the requester, echoed by the response: requests are pipelined
        12     4  header_length   bytes of the header that follows
        16     …  header          msgpack, one ``Struct`` per (kind, op): see :mod:`tidelog.protocol.message_codec`
         …     …  payload         the rest of the frame: record batches exactly as stored, or nothing

The payload is opaque here. It sits last so that a writer sends it straight from the buffers it already has
(``encode_frame`` returns a list for ``writelines``: the payload is never copied or re-encoded) and a reader
hands out a ``memoryview`` of it.

The length prefix is the only thing the decoder trusts before checking it: a declared length above
``max_frame_bytes`` raises :class:`FrameTooLargeError` as soon as its four bytes arrive, before anything is
buffered for it, and a frame's bytes are only held as they actually arrive. So a hostile peer costs at most
one frame's worth of memory, and only if it sends it.

A :class:`FrameError` means the byte stream is no longer understood (bad length, version or kind; the
connection ended inside a frame): the only safe reaction is to close the connection. An op this side does not
know is *not* a framing error: the frame is well delimited, so the dispatcher answers it with an error frame.
"""

from __future__ import annotations

import asyncio
import enum
import struct
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias

BytesLike: TypeAlias = bytes | bytearray | memoryview

WIRE_VERSION = 1
LENGTH = struct.Struct(">I")
LENGTH_SIZE = LENGTH.size  # 4
BODY = struct.Struct(">BBHII")  # version, kind, op, correlation_id, header_length
BODY_FIXED_SIZE = BODY.size  # 12: what frame_length counts before the header
PREFIX = struct.Struct(">IBBHII")
PREFIX_SIZE = PREFIX.size  # 16
assert PREFIX_SIZE == LENGTH_SIZE + BODY_FIXED_SIZE == 16

MAX_U16 = 0xFFFF
MAX_U32 = 0xFFFF_FFFF
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024  # room for a fetch response of many batches
DEFAULT_MAX_RESPONSE_BYTES = 160 * 1024 * 1024
"""What clients and followers accept in one response: a fetch returns its first batch whole, and a transactional
append is one batch of up to ``max_append_bytes`` (128 MiB by default), so a response can be that large."""


class Kind(enum.IntEnum):
    """What a frame is; the direction of an op is part of what its header means."""

    REQUEST = 0
    RESPONSE = 1
    ERROR = 2  # the request failed as a whole; the header is an ``ErrorBody``
    PUSH = 3  # sent by the server unasked (reserved: subscriptions, leadership notices)


_KINDS: tuple[Kind, ...] = tuple(Kind)


class Op(enum.IntEnum):
    """Operations. Numbers are stable on the wire; ranges group client data, administration and replication."""

    PRODUCE = 1
    FETCH = 2
    APPEND = 3  # transactional append (Gazette, seed 002): BEGIN, CHUNKs, COMMIT or ABORT frames
    LIST_OFFSETS = 4  # a partition's bounds and the offset at a timestamp
    INIT_PRODUCER = 5  # an idempotent producer's id and epoch (any broker answers; ids come from etcd)
    SET_CURSOR = 6  # store a consumer's position (a cursor in __cursors; its partition's leader answers)
    FETCH_CURSOR = 7  # read a stored cursor (-1 when never set)
    LIST_CURSORS = 8  # every cursor of one id in one __cursors partition (that partition's leader answers)
    SASL_START = 9  # SCRAM-SHA-256 over TLS: the client's first message, the broker's first (a connection's login)
    SASL_FINISH = 10  # SCRAM-SHA-256: the client's proof, the broker's signature; the connection's principal
    METADATA = 16
    CREATE_STREAM = 17
    DELETE_STREAM = 18
    LIST_STREAMS = 19
    SET_STREAM_STATE = 20  # pause, resume, read-only
    RESET_HEAD = 21  # an operator confirms the head of a suspended partition (fail to safety)
    SKIP_DAMAGED = 22  # an operator confirms skipping offsets found damaged on disk (bit rot)
    ADD_PARTITIONS = 23  # grow a stream's partition count (through the controller)
    ALTER_STREAM = 24  # change a stream's settings at run time (through the controller)
    ELECT_LEADERS = 25  # preferred-leader election now (``tidelog cluster rebalance``)
    REASSIGN_PARTITIONS = 26  # move partitions' replicas to other brokers (start, cancel, or propose a plan)
    DECOMMISSION_BROKER = 27  # move every replica off one broker (through the controller)
    LIST_REASSIGNMENTS = 28  # how far reassignments are (any broker, from its mirror)
    REPLICA_FETCH = 32  # broker-to-broker pull replication: a follower copies the leader's log
    EPOCH_END_OFFSET = 33  # where a leader epoch ends on the leader (KIP-279): followers truncate to it
    SEGMENT_LIST = 34  # far-horizon catch-up: the leader's sealed segments from an offset
    SEGMENT_FETCH = 35  # far-horizon catch-up: raw bytes of one sealed segment file
    SESSION_FETCH = 36  # a follower copies every partition it follows from one leader broker at once
    ALTER_ISR = 48  # a partition leader asks the controller to change the ISR
    REPORT_UNREACHABLE = 49  # a follower tells the controller it cannot reach its leader
    CONTROLLED_SHUTDOWN = 50  # a stopping broker asks the controller to move its leaderships away
    SUSPEND_PARTITION = 51  # a partition leader found evidence of lost consistency: record its suspension
    JOIN_GROUP = 64  # a consumer joins a consumer group (any broker; forwarded to the controller)
    LEAVE_GROUP = 65  # a consumer leaves (or its coordinator removes it; forwarded to the controller)
    GROUP_ASSIGNMENTS = 66  # a member's partitions and the group epoch; its heartbeat (the coordinator answers)
    REPORT_COORDINATOR = 67  # a member reports that the group's coordinator does not answer (to the controller)
    DESCRIBE_GROUP = 68  # a group's coordinator, epoch, members and assignments (any broker, from its mirror)
    LIST_GROUPS = 69  # every group, in short (any broker, from its mirror)
    DELETE_GROUP = 70  # delete a memberless group's committed offsets in one __cursors partition (its leader)


class ProtocolError(Exception):
    """The peer sent something that does not follow the wire protocol."""


class FrameError(ProtocolError):
    """The byte stream cannot be cut into frames any more: close the connection."""


class FrameTooLargeError(FrameError):
    """A frame declares (or would need) more bytes than the limit allows."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes exceeds the limit of {limit} bytes (max_frame_bytes)")
        self.length = length
        self.limit = limit


class Frame(NamedTuple):
    """One decoded frame. ``header`` and ``payload`` are read-only views into the received bytes.

    A NamedTuple rather than a dataclass: one is built per request on the hot path, and tuples are cheapest.
    The views keep the buffer they came from alive; copy the payload if it must outlive the connection's
    memory budget.
    """

    kind: Kind
    op: int  # an ``Op`` when this side knows it; left as an int so unknown ops reach the dispatcher
    correlation_id: int
    header: memoryview
    payload: memoryview


def _nbytes(buffer: BytesLike) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def encode_frame(
    kind: Kind,
    op: int,
    correlation_id: int,
    header: BytesLike,
    payload: BytesLike | Sequence[BytesLike] = b"",
) -> list[BytesLike]:
    """Frame ``header`` and ``payload`` as a list of buffers for ``StreamWriter.writelines``.

    ``payload`` may be one buffer or several (e.g. batches from different segments): they are placed in the
    list as given, never joined. Raises ``ValueError`` for an op or correlation id out of range and
    :class:`FrameTooLargeError` when the frame would not fit its 32-bit length.
    """
    parts: Sequence[BytesLike] = (payload,) if isinstance(payload, bytes | bytearray | memoryview) else payload
    if not 0 <= op <= MAX_U16:
        raise ValueError(f"op {op} is outside 0..{MAX_U16}")
    if not 0 <= correlation_id <= MAX_U32:
        raise ValueError(f"correlation id {correlation_id} is outside 0..{MAX_U32}")
    header_length = _nbytes(header)
    length = BODY_FIXED_SIZE + header_length + sum(_nbytes(part) for part in parts)
    if length > MAX_U32:
        raise FrameTooLargeError(length, MAX_U32)
    out: list[BytesLike] = [PREFIX.pack(length, WIRE_VERSION, kind, op, correlation_id, header_length)]
    if header_length:
        out.append(header)
    out.extend(part for part in parts if _nbytes(part))
    return out


def encode_frame_bytes(
    kind: Kind, op: int, correlation_id: int, header: BytesLike, payload: BytesLike | Sequence[BytesLike] = b""
) -> bytes:
    """:func:`encode_frame` joined into one ``bytes`` (for small frames, datagrams and tests)."""
    return b"".join(encode_frame(kind, op, correlation_id, header, payload))


def check_frame_length(length: int, max_frame_bytes: int) -> None:
    """Validate a declared ``frame_length`` before any byte of the frame is buffered."""
    if length > max_frame_bytes:
        raise FrameTooLargeError(length, max_frame_bytes)
    if length < BODY_FIXED_SIZE:
        raise FrameError(f"frame length {length} is shorter than the {BODY_FIXED_SIZE}-byte fixed part")


def parse_frame_body(body: memoryview) -> Frame:
    """Decode the bytes after the length field (exactly ``frame_length`` of them) into a :class:`Frame`."""
    if len(body) < BODY_FIXED_SIZE:
        raise FrameError(f"frame body of {len(body)} bytes is shorter than its {BODY_FIXED_SIZE}-byte fixed part")
    version, kind, op, correlation_id, header_length = BODY.unpack_from(body)
    if version != WIRE_VERSION:
        raise FrameError(f"unsupported wire version {version} (this side speaks {WIRE_VERSION})")
    if kind >= len(_KINDS):
        raise FrameError(f"unknown frame kind {kind}")
    header_end = BODY_FIXED_SIZE + header_length
    if header_end > len(body):
        raise FrameError(f"header length {header_length} exceeds the frame's {len(body) - BODY_FIXED_SIZE} bytes")
    return Frame(_KINDS[kind], op, correlation_id, body[BODY_FIXED_SIZE:header_end], body[header_end:])


class FrameDecoder:
    """Incremental decoder: feed it whatever the transport delivers, get back every frame completed.

    Frames that arrive whole inside one ``bytes`` chunk are sliced out of it without copying. A frame split
    across chunks is accumulated in its own ``bytearray`` (grown only as its bytes arrive) and handed out as
    views of that array, so it is never copied a second time. After a :class:`FrameError` the decoder stays
    failed: the stream has lost its framing and every later call raises.
    """

    __slots__ = ("_buffer", "_failure", "_max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if not BODY_FIXED_SIZE <= max_frame_bytes <= MAX_U32:
            raise ValueError(f"max_frame_bytes must be within {BODY_FIXED_SIZE}..{MAX_U32}, not {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()  # the start of one incomplete frame, length prefix included
        self._failure: FrameError | None = None

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held; never more than ``4 + max_frame_bytes``."""
        return len(self._buffer)

    def feed(self, data: BytesLike) -> list[Frame]:
        """Consume ``data`` and return the frames it completes, in order (possibly none).

        Mutable input (``bytearray``, ``memoryview``) is copied once, since the caller may reuse it while frames
        still point into it; ``bytes`` is used in place.
        """
        if self._failure is not None:
            raise FrameError(f"decoder already failed: {self._failure}") from self._failure
        chunk = memoryview(data if isinstance(data, bytes) else bytes(data))
        frames: list[Frame] = []
        try:
            position = self._complete_buffered(chunk, frames) if self._buffer else 0
            end = len(chunk)
            while end - position >= LENGTH_SIZE:
                (length,) = LENGTH.unpack_from(chunk, position)
                check_frame_length(length, self._max_frame_bytes)
                stop = position + LENGTH_SIZE + length
                if stop > end:
                    break
                frames.append(parse_frame_body(chunk[position + LENGTH_SIZE : stop]))
                position = stop
            if position < end:
                self._buffer += chunk[position:]
        except FrameError as exc:
            self._failure = exc
            self._buffer = bytearray()
            raise
        return frames

    def _complete_buffered(self, chunk: memoryview, frames: list[Frame]) -> int:
        """Move bytes from ``chunk`` into the pending frame; emit it if complete. Returns bytes consumed."""
        buffer = self._buffer
        position = 0
        if len(buffer) < LENGTH_SIZE:
            position = min(LENGTH_SIZE - len(buffer), len(chunk))
            buffer += chunk[:position]
            if len(buffer) < LENGTH_SIZE:
                return position
        length: int = LENGTH.unpack_from(buffer)[0]
        check_frame_length(length, self._max_frame_bytes)
        take = min(LENGTH_SIZE + length - len(buffer), len(chunk) - position)
        buffer += chunk[position : position + take]
        position += take
        if len(buffer) == LENGTH_SIZE + length:
            self._buffer = bytearray()  # the views below own the old array now; it must never be resized
            frames.append(parse_frame_body(memoryview(buffer).toreadonly()[LENGTH_SIZE:]))
        return position

    def eof(self) -> None:
        """Declare the end of the stream: raises :class:`FrameError` if it stopped inside a frame."""
        if self._failure is None and self._buffer:
            pending = len(self._buffer)
            self._buffer = bytearray()
            self._failure = FrameError(f"stream ended inside a frame ({pending} bytes of it received)")
            raise self._failure


async def read_frame(reader: asyncio.StreamReader, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Frame | None:
    """Read exactly one frame from ``reader``; ``None`` on a clean end of stream between frames.

    The length is checked before the body is read, so ``readexactly`` never waits for (or buffers) more than
    ``max_frame_bytes``. A stream that ends inside a frame raises :class:`FrameError`.
    """
    try:
        prefix = await reader.readexactly(LENGTH_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError(f"stream ended inside a length prefix ({len(exc.partial)} of 4 bytes)") from exc
    (length,) = LENGTH.unpack(prefix)
    check_frame_length(length, max_frame_bytes)
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"stream ended inside a frame ({len(exc.partial)} of {length} bytes)") from exc
    return parse_frame_body(memoryview(body))
