"""One NATS connection of the ingest reader: the TCP protocol object, and the URLs it can reach.

:class:`NatsConnection` is what asyncio calls back: it feeds each read to a
:class:`~tidelog.broker.ingest.natsproto.Parser`, which sorts the messages by subscription, and hands them to its
owner (a :class:`~tidelog.broker.ingest.nats_reader.NatsReader`) in one call per read, with the read's reception
time; it answers
the server's PINGs at once, matches PONGs to the PINGs it sent, and reports INFO and ``-ERR``. A protocol error drops
the connection (the owner reconnects). Connecting, subscribing, reconnecting and closing are the owner's: this object
lives and dies with one TCP connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

from tidelog.broker.ingest.natsproto import (
    PING,
    PONG,
    Item,
    Parser,
    ProtocolError,
    Route,
    Routes,
    parse_error,
    parse_info,
)
from tidelog.clock import Clock

log = logging.getLogger(__name__)

DEFAULT_PORT = 4222


class UnsupportedServerError(Exception):
    """The server or URL needs something this reader does not speak (TLS, websockets)."""


class NatsServerError(Exception):
    """The server answered ``-ERR`` while connecting or subscribing (authorization, permissions)."""


@dataclass(frozen=True, slots=True)
class ServerAddress:
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    token: str | None = None

    @classmethod
    def parse(cls, url: str) -> ServerAddress:
        """``nats://[user:password@|token@]host[:port]`` or ``host[:port]``."""
        text = url.strip()
        parts = urlsplit(text if "://" in text else f"nats://{text}")
        if parts.scheme != "nats":
            raise UnsupportedServerError(f"{url!r}: the ingest reader speaks nats:// only")
        if not parts.hostname:
            raise ValueError(f"not a NATS URL: {url!r}")
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        if user is not None and password is None:
            return cls(parts.hostname, parts.port or DEFAULT_PORT, token=user)
        return cls(parts.hostname, parts.port or DEFAULT_PORT, user, password)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"nats://{host}:{self.port}"


def supports(urls: Sequence[str]) -> bool:
    """Whether the ingest's :class:`~tidelog.broker.ingest.nats_reader.NatsReader` can use these URLs (all
    ``nats://``)."""
    try:
        return bool(urls) and all(ServerAddress.parse(url) for url in urls)
    except (UnsupportedServerError, ValueError):
        return False


class ConnectionOwner(Protocol):
    """What a :class:`NatsConnection` needs from the reader that opened it."""

    name: str
    clock: Clock
    reads: int
    bytes_read: int

    @property
    def routes(self) -> Routes: ...

    def on_read(self, touched: list[Route], unrouted: list[Item], received_ns: int) -> None: ...

    def connection_lost(self, conn: NatsConnection, exc: Exception | None) -> None: ...

    def server_info(self, info: dict[str, Any]) -> None: ...


def _fail(future: asyncio.Future[Any] | None, error: Exception) -> None:
    """Fail ``future`` if still pending, without asyncio logging it when nobody waits for it any more."""
    if future is not None and not future.done():
        future.set_exception(error)
        future.exception()  # marks it retrieved: whoever awaits it still gets the error


class NatsConnection(asyncio.Protocol):
    """One TCP connection: keeps the bytes of a split operation, parses each read, answers the server's PINGs."""

    def __init__(self, reader: ConnectionOwner) -> None:
        self._reader = reader
        self.parser = Parser(self._on_control, routes=reader.routes)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.info: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._pings: collections.deque[asyncio.Future[None] | None] = collections.deque()
        self.handshaking = True
        self.paused = False

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        received = reader.clock.now_ns()
        reader.reads += 1
        reader.bytes_read += len(data)
        messages: list[Item] = []
        try:
            self.parser.feed(data, messages)
        except ProtocolError as exc:
            self._deliver(messages, received)
            log.error("NATS ingest %s: protocol error from the server, reconnecting: %s", self._reader.name, exc)
            self.abort()
            return
        self._deliver(messages, received)

    def connection_lost(self, exc: Exception | None) -> None:
        error = ConnectionError(str(exc or "connection closed"))
        while self._pings:
            _fail(self._pings.popleft(), error)
        _fail(self.info, error)
        if not self.closed.done():
            self.closed.set_result(None)
        self._reader.connection_lost(self, exc)

    # ---- what the reader does with it

    def _deliver(self, messages: list[Item], received: int) -> None:
        """Hand the read's messages, sorted by subscription, to the reader (``messages``: those of no subscription)."""
        touched = self.parser.touched
        if touched or messages:
            self.parser.touched = []
            self._reader.on_read(touched, messages, received)

    def _on_control(self, op: bytes, arg: bytes) -> None:
        if op == b"PING":
            self.write(PONG)
        elif op == b"PONG":
            if self._pings:
                future = self._pings.popleft()
                if future is not None and not future.done():
                    future.set_result(None)
        elif op == b"INFO":
            info = parse_info(arg)
            if not self.info.done():
                self.info.set_result(info)
            self._reader.server_info(info)
        elif op == b"-ERR":
            self._on_error(parse_error(arg))
        # +OK: only sent in verbose mode, which is off

    def _on_error(self, text: str) -> None:
        # Fail whatever waits for a PONG (the handshake, subscriptions being confirmed): an -ERR names no sid, so
        # each of them learns of it; the server closes the connection after most errors anyway.
        error = NatsServerError(text)
        for future in self._pings:
            _fail(future, error)
        if self.handshaking:
            _fail(self.info, error)
            return
        log.warning("NATS ingest %s: the server says: %s", self._reader.name, text)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def ping(self, *, wait: bool) -> asyncio.Future[None] | None:
        """Send a PING; with ``wait``, a future that the PONG (or the connection's end) resolves."""
        future = asyncio.get_running_loop().create_future() if wait else None
        self._pings.append(future)
        self.write(PING)
        return future

    @property
    def pings_out(self) -> int:
        return len(self._pings)

    @property
    def is_closed(self) -> bool:
        return self.closed.done()

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self.paused = False

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
