"""The wire protocol server: accepts TCP (optionally TLS) connections and runs one session per connection.

TLS: given ``ssl`` (a context, or a function that returns the current one, such as
:meth:`tidelog.api.server_tls.ServerTls.context`), every connection shakes hands with the context current at that
moment: a rotated certificate reaches new connections without a restart. A failed handshake (no client
certificate, an expired one, another CA, plaintext) closes the connection before any request is read; the client
is told why by the TLS alert. No plaintext request is ever served on a TLS listener.

This module is the listener and its lifecycle only. What happens on a connection (pipelining, reply order,
backpressure, error frames) is :mod:`tidelog.api.wire.session`; what each op does is
:mod:`tidelog.api.wire.handlers` and the modules it gathers. The broker builds it from its
:class:`~tidelog.broker.context.BrokerContext`::

    wire = WireServer(ctx, host, port)   # port 0: any free port
    await wire.start()                   # wire.port is the bound port from here on
    ...
    await wire.stop(grace=5.0)

Limits (:mod:`tidelog.api.wire.connection_limits`): at most ``max_connections`` connections in all and
``max_connections_per_ip`` from one address, when set (one more gets one UNAVAILABLE error frame and is closed); each
connection has at most ``max_in_flight`` requests (``max_in_flight_bytes`` of them) unanswered, which bounds
what a client that pipelines without limit or never reads its replies holds in the broker; a connection idle
for ``idle_timeout`` seconds is closed.

Stopping: the listener closes first (no new connections); every session stops reading, wakes its long-polling
fetches to answer at once, and writes the replies it still owes. Whatever is unfinished after ``grace``
seconds is cancelled and its connection closed. Appends started for ``acks=NONE`` produces are awaited within
the same grace, since the log is closed right after this returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl as ssl_
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.api.access_table import WIRE_ACCESS
from tidelog.api.authorizer import Authorizer
from tidelog.api.principals import ConnectionIdentity, PrincipalResolver, UserLookup
from tidelog.api.wire import admin, append, control, cursors, fetch, handlers, producers, replica, sasl, session_fetch
from tidelog.api.wire import groups as group_ops
from tidelog.api.wire.admission import TurnBudget
from tidelog.api.wire.connection_limits import ConnectionLimits, ensure_descriptors
from tidelog.api.wire.handlers import Route
from tidelog.api.wire.session import Session
from tidelog.broker.context import BrokerContext
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.frames import DEFAULT_MAX_FRAME_BYTES, Op
from tidelog.protocol.message_codec import encode_error
from tidelog.protocol.tls import following_context

log = logging.getLogger(__name__)

ROUTES: dict[int, Route] = {
    **handlers.ROUTES,
    **fetch.ROUTES,
    **admin.ROUTES,
    **control.ROUTES,
    **replica.ROUTES,
    **session_fetch.ROUTES,
    **producers.ROUTES,
    **append.ROUTES,
    **cursors.ROUTES,
    **group_ops.ROUTES,
    **sasl.ROUTES,
}
"""Every op this server answers, by family; anything else gets an UNSUPPORTED error frame."""

REFUSED_LINGER = 1.0
"""Seconds a refused connection stays half-open so that its client reads the reason (:meth:`WireServer._refuse`)."""

REFUSED_LINGERING = 256
"""Refused connections that may linger at once; more are closed at once."""


class WireServer:
    """Serves the tidelog wire protocol for one broker."""

    def __init__(
        self,
        ctx: BrokerContext,
        host: str,
        port: int,
        *,
        ssl: ssl_.SSLContext | Callable[[], ssl_.SSLContext] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 256,
        max_in_flight_bytes: int = 64 * 1024 * 1024,
        max_connections: int = 0,
        max_connections_per_ip: int = 0,
        idle_timeout: float = 600.0,
        zero_copy: bool = True,
        authorizer: Authorizer | None = None,
        principals: PrincipalResolver | None = None,
        users: UserLookup | None = None,
    ) -> None:
        """``max_in_flight`` requests or ``max_in_flight_bytes`` of request bytes unanswered on one connection
        make it stop reading until replies go out; what all connections together start in one turn of the loop
        is bounded too (:mod:`tidelog.api.wire.admission`). ``max_connections`` (in all) and
        ``max_connections_per_ip`` bound the open connections (0: no limit); one with nothing in flight that
        sends nothing for ``idle_timeout`` seconds (0: never) is closed. ``zero_copy`` allows ``os.sendfile`` for
        fetches on connections without TLS (it is always off with TLS, whose bytes must pass through Python).

        With ``authorizer``, each connection's principal is resolved once when it is accepted (by
        ``principals``) and every request is checked against :data:`~tidelog.api.access_table.WIRE_ACCESS`
        before anything of it runs. ``users`` lets clients without a certificate log in with SCRAM-SHA-256 over
        TLS (:mod:`tidelog.api.wire.sasl`)."""
        self._ctx = ctx
        self._host = host
        self._requested_port = port
        self._ssl = ssl
        self._max_frame_bytes = max_frame_bytes
        self._max_in_flight = max_in_flight
        self._max_in_flight_bytes = max_in_flight_bytes
        self._budget = TurnBudget()
        self._limits = ConnectionLimits(max_connections, max_connections_per_ip)
        self._idle_timeout = idle_timeout
        self._sweeper: asyncio.Task[None] | None = None
        self._lingering = 0  # refused connections waiting for their client to read the reason
        self._authorizer = authorizer
        self._principals = principals or PrincipalResolver("cn", ())
        self._users = users
        self._zero_copy = zero_copy and ssl is None and hasattr(os, "sendfile")
        self._server: asyncio.Server | None = None
        self._port = 0
        self._sessions: dict[Session, asyncio.Task[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._stopping: asyncio.Future[None] | None = None

    @property
    def port(self) -> int:
        """The bound port (the kernel's choice when 0 was asked); 0 before :meth:`start`."""
        return self._port

    @property
    def connections(self) -> int:
        return len(self._sessions)

    @property
    def limits(self) -> ConnectionLimits:
        return self._limits

    async def start(self) -> None:
        """Listen; :class:`~tidelog.broker.config_values.ConfigError` when the process cannot open as many files
        as ``max_connections`` needs (:func:`ensure_descriptors`)."""
        ensure_descriptors(self._limits.max_connections)
        loop = asyncio.get_running_loop()
        self._stopping = loop.create_future()
        self._server = await loop.create_server(
            lambda: _WireProtocol(self._accept, loop, tls=self._ssl is not None),
            self._host,
            self._requested_port,
            ssl=self._listener_context(),
        )
        self._port = int(self._server.sockets[0].getsockname()[1])
        if self._idle_timeout > 0:
            self._sweeper = loop.create_task(self._sweep_idle(), name="wire-idle-sweep")
        log.debug("wire server listening on %s:%d", self._host, self._port)

    def _listener_context(self) -> ssl_.SSLContext | None:
        """The context the listener is made with: fixed, or following a changing one at each handshake."""
        source = self._ssl
        if source is None or isinstance(source, ssl_.SSLContext):
            return source
        return following_context(source)

    async def _accept(self, protocol: _WireProtocol, writer: asyncio.StreamWriter) -> None:
        assert self._stopping is not None
        if self._stopping.done():
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        refused = self._limits.admit(address)
        if refused is not None:
            self._refuse(protocol, writer, address, refused)
            return
        try:
            await self._serve(protocol, writer)
        finally:
            self._limits.release(address)

    def _refuse(self, protocol: _WireProtocol, writer: asyncio.StreamWriter, address: str, why: str) -> None:
        """Answer a connection over a limit with one UNAVAILABLE error frame and close it; nothing of it is read.

        The reply is followed by our end of the stream, and what the client sends meanwhile is read and dropped
        for up to :data:`REFUSED_LINGER` seconds (or until it closes): closing a socket with unread bytes would
        reset it, and the client would lose the reason. At most :data:`REFUSED_LINGERING` refused connections
        linger at once (a flood of them must not hold descriptors); past that they are closed at once."""
        log.warning("wire connection from %s refused: %s", address, why)
        protocol.discard_input()
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.writelines(encode_error(0, 0, UnavailableError(why).to_error_body()))
            if self._lingering < REFUSED_LINGERING and writer.can_write_eof():
                writer.write_eof()
                self._lingering += 1
                asyncio.get_running_loop().call_later(REFUSED_LINGER, self._end_linger, writer)
                return
        writer.close()

    def _end_linger(self, writer: asyncio.StreamWriter) -> None:
        self._lingering -= 1
        writer.close()

    async def _sweep_idle(self) -> None:
        """Close the connections that have had nothing in flight and sent nothing for ``idle_timeout`` seconds,
        checking a few times per timeout."""
        period = min(max(self._idle_timeout / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for session in list(self._sessions):
                since = session.idle_since()
                if since is not None and now - since >= self._idle_timeout:
                    idle = now - since
                    log.info("wire connection %s idle %.0f s (wire_idle_timeout_ms): closing it", session.peer, idle)
                    session.stop_reading()

    async def _serve(self, protocol: _WireProtocol, writer: asyncio.StreamWriter) -> None:
        identity = ConnectionIdentity(self._principals.of_wire(writer), self._ssl is not None, self._users)
        session = Session(
            self._ctx,
            ROUTES,
            writer,
            zero_copy=self._zero_copy,
            background=self._background,
            max_frame_bytes=self._max_frame_bytes,
            max_in_flight=self._max_in_flight,
            max_in_flight_bytes=self._max_in_flight_bytes,
            budget=self._budget,
            authorize=self._authorize_for(identity),
            identity=identity,
        )
        task = asyncio.current_task()
        assert task is not None
        self._sessions[session] = task
        protocol.attach(session)
        try:
            await session.serve()
        except Exception:
            log.exception("wire session %s failed", session.peer)
        finally:
            self._sessions.pop(session, None)

    def _authorize_for(self, identity: ConnectionIdentity) -> Callable[[int, Any], None] | None:
        """The request check of a new connection, by its principal at the time of each request (a SCRAM login
        changes it), or None when authorization is off."""
        authorizer = self._authorizer
        if authorizer is None:
            return None

        def authorize(op: int, header: Any) -> None:
            rule = WIRE_ACCESS.get(op)
            if rule is None:
                authorizer.check_unknown(identity.principal, "wire", f"op {op}")
            else:
                authorizer.check(identity.principal, rule, header, "wire", _op_name(op))

        return authorize

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish for up to ``grace`` seconds, then close everything."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + grace
        assert self._stopping is not None
        if not self._stopping.done():
            self._stopping.set_result(None)
        server.close()
        for session in list(self._sessions):
            session.stop_reading()
        tasks = list(self._sessions.values())
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
        for session in list(self._sessions):
            session.abort()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._background:
            _, late = await asyncio.wait(set(self._background), timeout=max(0.0, deadline - time.monotonic()))
            for task in late:
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), max(0.1, deadline - time.monotonic()))
        log.debug("wire server on port %d stopped", self._port)


def _op_name(op: int) -> str:
    try:
        return Op(op).name
    except ValueError:
        return f"op {op}"


class _WireProtocol(asyncio.StreamReaderProtocol):
    """A connection's protocol: the received bytes go straight to its :class:`Session` (:meth:`Session.feed`),
    from the transport's callback, with no reader task between (the session module says why).

    A ``StreamReaderProtocol`` for the rest: the :class:`asyncio.StreamWriter` the session writes with, whose
    ``drain()`` relies on this protocol's flow control. Its stream reader stays empty. Bytes that arrive before
    the session is attached (its task has not run yet) are held and fed to it then."""

    def __init__(
        self,
        accept: Callable[[_WireProtocol, asyncio.StreamWriter], Awaitable[None]],
        loop: asyncio.AbstractEventLoop,
        *,
        tls: bool = False,
    ) -> None:
        super().__init__(asyncio.StreamReader(loop=loop), lambda _r, w: accept(self, w), loop)
        self._tls = tls  # over TLS a half-close cannot be kept open (the TLS layer warns when asked to)
        self._session: Session | None = None
        self._early: list[bytes] = []
        self._discarding = False
        self._ended: tuple[BaseException | None] | None = None  # input ended before the session was attached

    def attach(self, session: Session) -> None:
        self._session = session
        early, self._early = self._early, []
        for data in early:
            session.feed(data)
        if self._ended is not None:
            session.end_of_input(self._ended[0])

    def discard_input(self) -> None:
        """Read and drop whatever the peer sends from here on (a refused connection, closing)."""
        self._early = []
        self._session = None
        self._discarding = True

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if self._session is not None:
            self._session.feed(data)
        else:
            self._early.append(data)

    def eof_received(self) -> bool | None:
        if self._discarding:
            return False  # a refused connection: the client has read the reason and left; close
        self._end(None)
        keep_open = super().eof_received()
        return False if self._tls else keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)
        super().connection_lost(exc)

    def _end(self, exc: BaseException | None) -> None:
        if self._session is not None:
            self._session.end_of_input(exc)
        elif self._ended is None:
            self._ended = (exc,)
