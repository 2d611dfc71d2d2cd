"""One TCP connection to a broker's wire port: pipelined requests matched to responses by correlation id.

The connection is an ``asyncio.BufferedProtocol`` rather than a stream pair with a reader task: the transport
reads into buffers this side hands it (``get_buffer``), and each completed frame resolves the future of its
request in the same callback (``buffer_updated``). That is one hop fewer per response than a reader task waking
up, and responses to a deep pipeline are handled in one pass over each read. Small frames are read into a
reused scratch buffer and copied out once; a large frame (a fetch response of up to megabytes) gets a buffer of
exactly its declared length as soon as its length prefix is in, and the socket is read straight into it, so it
is never joined from chunks nor copied. The length is checked against ``max_frame_bytes`` first; unlike the
:class:`~tidelog.protocol.frames.FrameDecoder`, whose buffer only grows as bytes arrive, a large frame's buffer is
allocated whole at once, so a broker that declares a frame and never sends it costs up to ``max_frame_bytes``.

Requests:

- :meth:`Connection.send` writes a request *now* and returns the future of its :class:`Response`: the producer's
  sender uses it to keep many requests in flight without a task per request, in the order it calls it.
- :meth:`Connection.request` waits for room first (backpressure), sends, and awaits the response, with an
  optional timeout.

Backpressure: :meth:`Connection.wait_writable` returns once fewer than ``max_in_flight`` requests are
unanswered and the transport's write buffer is below its high-water mark, so a fast producer slows down to
what the socket and the broker take instead of buffering without bound.

Failure: an ERROR frame fails its request with the matching :class:`~tidelog.protocol.errors.TidelogError`; the
connection stays usable. A broken connection (peer closed, reset, a frame this side cannot parse) fails every
unanswered request with :class:`ConnectionClosedError`, a retriable ``UnavailableError``. Reconnecting is the
caller's decision (:class:`~tidelog.client.cluster.Cluster` opens a new connection on next use).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_
from collections.abc import Sequence
from typing import NamedTuple, cast

from tidelog.protocol.errors import (
    RequestTimeoutError,
    TidelogError,
    UnavailableError,
    error_from_exception,
    from_error_body,
)
from tidelog.protocol.frames import (
    BODY_FIXED_SIZE,
    DEFAULT_MAX_FRAME_BYTES,
    LENGTH,
    LENGTH_SIZE,
    MAX_U32,
    BytesLike,
    Frame,
    FrameError,
    Kind,
    check_frame_length,
    parse_frame_body,
)
from tidelog.protocol.message_codec import decode_as, decode_frame_header, encode_message
from tidelog.protocol.messages import ErrorBody, Header
from tidelog.protocol.tls import describe_tls_failure

_SCRATCH_BYTES = 256 * 1024  # what one read may fill while no large frame is pending
_DIRECT_BYTES = 32 * 1024  # a frame this long or longer is read into a buffer of its own


class ConnectionClosedError(UnavailableError):
    """The connection to the broker is gone, or never came up; requests on it failed. Retriable elsewhere."""


class Response(NamedTuple):
    """A decoded response: its typed header and its payload (a read-only view into the received bytes)."""

    header: Header
    payload: memoryview


class Connection(asyncio.BufferedProtocol):
    """A pipelined wire-protocol connection. Open with :meth:`open`; close with :meth:`close`."""

    def __init__(self, address: str, *, max_frame_bytes: int, max_in_flight: int) -> None:
        self.address = address
        if not BODY_FIXED_SIZE <= max_frame_bytes <= MAX_U32:
            raise ValueError(f"max_frame_bytes must be within {BODY_FIXED_SIZE}..{MAX_U32}, not {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._scratch = memoryview(bytearray(_SCRATCH_BYTES))
        self._scratch_used = 0  # the start of a small frame (or of a length prefix) not complete yet
        self._direct: memoryview | None = None  # the body of a large frame being read, and how much of it is in
        self._direct_used = 0
        self._unreadable = False
        self._max_in_flight = max_in_flight
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._next_id = 1  # 0 is never used: the server's error frame for a broken stream carries it
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._room: asyncio.Future[None] | None = None
        self._closed_reason: TidelogError | None = None
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tls = False  # the connection speaks TLS (set by open)
        self._answered = False  # a frame arrived: the broker accepted this connection (TLS or not)

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        ssl: ssl_.SSLContext | None = None,
        connect_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 1024,
    ) -> Connection:
        """Connect to ``host:port``; a failure raises :class:`ConnectionClosedError`."""
        loop = asyncio.get_running_loop()
        address = f"{host}:{port}"
        try:
            async with asyncio.timeout(connect_timeout):
                _, protocol = await loop.create_connection(
                    lambda: cls(address, max_frame_bytes=max_frame_bytes, max_in_flight=max_in_flight),
                    host,
                    port,
                    ssl=ssl,
                )
            protocol._tls = ssl is not None
        except ssl_.SSLError as exc:
            raise ConnectionClosedError(
                f"cannot connect to tidelog broker at {address}: TLS refused: {describe_tls_failure(exc)}"
            ) from exc
        except (OSError, TimeoutError) as exc:
            raise ConnectionClosedError(f"cannot connect to tidelog broker at {address}: {exc}") from exc
        return protocol

    # -- state ---------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    # -- requests ------------------------------------------------------------------------------------------

    def send(self, header: Header, payload: BytesLike | Sequence[BytesLike] = b"") -> asyncio.Future[Response]:
        """Write a request now; the returned future resolves with its response (or fails with its error).

        Does not wait for room: callers that send in bulk call :meth:`wait_writable` between sends.
        """
        if self._closed_reason is not None or self._transport is None:
            raise ConnectionClosedError(f"connection to {self.address} is closed: {self._closed_reason}")
        cid = self._next_id
        self._next_id = cid + 1 if cid < MAX_U32 else 1
        future: asyncio.Future[Response] = self._lost.get_loop().create_future()
        self._pending[cid] = future
        self._transport.writelines(encode_message(cid, header, payload))
        return future

    async def request(
        self, header: Header, payload: BytesLike | Sequence[BytesLike] = b"", *, timeout: float | None = None
    ) -> Response:
        """Send one request when there is room and await its response (``timeout`` in seconds: TIMEOUT)."""
        await self.wait_writable()
        future = self.send(header, payload)
        if timeout is None:
            return await future
        try:
            # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that arrives just as the
            # response does, and a caller being stopped (a replica fetcher) would then run on.
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            raise RequestTimeoutError(f"no response from {self.address} within {timeout:.3f}s") from None

    async def wait_writable(self) -> None:
        """Return once a request may be sent without piling up: see the module docstring."""
        while self._paused or len(self._pending) >= self._max_in_flight:
            if self._closed_reason is not None:
                raise ConnectionClosedError(f"connection to {self.address} is closed: {self._closed_reason}")
            if self._room is None or self._room.done():
                self._room = self._lost.get_loop().create_future()
            await asyncio.wait((self._room, self._lost), return_when=asyncio.FIRST_COMPLETED)
        if self._closed_reason is not None:
            raise ConnectionClosedError(f"connection to {self.address} is closed: {self._closed_reason}")

    async def close(self) -> None:
        """Close the connection; unanswered requests fail with :class:`ConnectionClosedError`."""
        if self._transport is not None:
            self._transport.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5.0):  # not wait_for: see request()
                await asyncio.shield(self._lost)
        self._fail_all(ConnectionClosedError(f"connection to {self.address} was closed"))

    # -- asyncio.Protocol ------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without inheriting from it: no isinstance check.
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:
            return direct[self._direct_used :]
        return self._scratch[self._scratch_used :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._unreadable:
            return
        direct = self._direct
        if direct is not None:
            used = self._direct_used + nbytes
            if used < len(direct):
                self._direct_used = used
                return
            self._direct = None
            self._direct_used = 0
            frames = [direct.toreadonly()]
        else:
            try:
                frames = self._cut_scratch(self._scratch_used + nbytes)
            except FrameError as exc:
                self._stream_unreadable(exc)
                return
        for body in frames:
            try:
                frame = parse_frame_body(body)
            except FrameError as exc:
                self._stream_unreadable(exc)
                return
            self._resolve(frame)
        if self._room is not None and not self._room.done() and len(self._pending) < self._max_in_flight:
            self._room.set_result(None)

    def _cut_scratch(self, end: int) -> list[memoryview]:
        """The bodies of the frames complete in ``scratch[:end]``, each copied out of it; keeps the rest.

        A large frame that has begun moves to a buffer of its own (``_direct``) that later reads fill directly.
        """
        scratch = self._scratch
        bodies: list[memoryview] = []
        position = 0
        while end - position >= LENGTH_SIZE:
            (length,) = LENGTH.unpack_from(scratch, position)
            check_frame_length(length, self._max_frame_bytes)
            start = position + LENGTH_SIZE
            stop = start + length
            if stop <= end:
                bodies.append(memoryview(scratch[start:stop].tobytes()))
                position = stop
                continue
            if length >= _DIRECT_BYTES:
                direct = memoryview(bytearray(length))
                have = end - start
                direct[:have] = scratch[start:end]
                self._direct = direct
                self._direct_used = have
                position = end
            break
        left = end - position
        if left and position:
            scratch[:left] = scratch[position:end]
        self._scratch_used = left
        return bodies

    def _stream_unreadable(self, exc: FrameError) -> None:
        """The peer's bytes lost their framing: fail every waiting request and drop the connection."""
        self._unreadable = True
        self._fail_all(ConnectionClosedError(f"{self.address} sent an unreadable byte stream: {exc}"))
        if self._transport is not None:
            self._transport.abort()

    def _resolve(self, frame: Frame) -> None:
        self._answered = True
        future = self._pending.pop(frame.correlation_id, None)
        if future is None:
            if frame.kind is Kind.ERROR and frame.correlation_id == 0:
                # The broker could not parse our byte stream and is about to close: the reason for everyone.
                with contextlib.suppress(Exception):
                    self._closed_reason = from_error_body(decode_as(ErrorBody, frame.header))
            return  # a response to a request given up on (timeout, cancellation), or a push: ignore
        if future.done():
            return
        try:
            header = decode_frame_header(frame)
        except Exception as exc:
            future.set_exception(error_from_exception(exc))
            return
        if frame.kind is Kind.ERROR:
            assert isinstance(header, ErrorBody)
            future.set_exception(from_error_body(header))
        else:
            future.set_result(Response(header, frame.payload))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self._closed_reason
        if reason is None:
            cause = f": {exc}" if exc is not None else ""
            hint = ""
            if not self._answered and (exc is None or isinstance(exc, ConnectionResetError | ssl_.SSLError)):
                # Closed (or reset) before any answer: most often the broker refused the connection in the TLS
                # handshake, which TLS 1.3 finishes on the client's side before the server has checked its
                # certificate; or a plaintext client met a TLS port.
                hint = (
                    " before any answer (if the broker requires client certificates, it refused ours: none given, "
                    "expired, or signed by a CA it does not trust)"
                    if self._tls
                    else " before any answer (is it a TLS port? then connect with TLS and its CA)"
                )
            detail = hint + cause
            reason = ConnectionClosedError(f"connection to {self.address} was lost{detail}")
        self._fail_all(reason)
        if not self._lost.done():
            self._lost.set_result(None)

    def _fail_all(self, reason: TidelogError) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(_closed_error(reason))
        if self._room is not None and not self._room.done():
            self._room.set_result(None)


def _closed_error(reason: TidelogError) -> TidelogError:
    """Each failed request gets its own exception object (tracebacks must not be shared between awaiters)."""
    if isinstance(reason, ConnectionClosedError):
        return ConnectionClosedError(reason.message)
    return type(reason)(reason.message, retriable=reason.retriable)
