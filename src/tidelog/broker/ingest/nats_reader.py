"""A minimal NATS subscriber for ingest: its own TCP connection, one subscription, messages read in bulk.

Why not nats-py here: its per-operation parser, a ``Msg`` object, a pending queue and a task wake-up for each received
message took more than half the broker's time at full ingest load (docs/performance.md). This reader parses each socket
read in one pass (:func:`tidelog.broker.ingest.natsproto.parse`) and hands the messages to one callback per read,
together with one reception time; it creates no object per message beyond a view of the payload (or a small tuple for
the uncommon shapes), and no task or queue at all. The connection also publishes the NATS copies of API publishes
to its partition (:meth:`NatsReader.publish`; :mod:`tidelog.broker.ingest.copies`): its ``echo`` is off, so the
server never sends them back to this subscription. nats-py stays the broker's client for everything else (acks,
``PublishToSubject``, the metadata of other components).

One TCP connection at a time is a :class:`~tidelog.broker.ingest.nats_connection.NatsConnection` (parsing, PING/PONG);
this module owns the subscription across connections. It speaks ``nats://`` only (plain TCP, optionally
``user:password@`` or ``token@`` in the URL). A ``tls://`` or ``ws(s)://`` URL, or a server that requires TLS,
raises :class:`~tidelog.broker.ingest.nats_connection.UnsupportedServerError`, and the ingest then uses nats-py instead.

Lifecycle (:class:`ReaderState`)::

    NEW ─start()─▶ CONNECTING ─▶ CONNECTED ⇄ RECONNECTING
                                      │            │
                                      └─ stop() ───┴─▶ CLOSING ─▶ CLOSED

- **start()** returns once the server has processed the SUB (a PING sent after it came back as PONG, and the server
  handles a connection's operations in order): whatever is published afterwards reaches this subscription. When
  no server can be reached, start() logs it and keeps trying in the background, as a NATS client would.
- **Reconnect.** When the connection drops, the reader connects again (each known server in turn, ``reconnect_wait``
  between rounds, for ever) and subscribes again. NATS core delivers at most once: messages published while no
  connection was subscribed are not received — exactly as with nats-py, which cannot replay them either. The gap is
  logged as a warning with its length. A message whose bytes were cut off by the drop was never received whole and
  is not stored; every complete one before it was.
- **Liveness.** The server's PINGs are answered at once; the reader PINGs every ``ping_interval`` and treats
  ``max_pings_out`` unanswered PINGs as a dead connection (a half-open TCP connection shows nothing otherwise).
- **Back-pressure.** :meth:`pause_reading` stops reading the socket; the caller does it when what it received but
  has not stored passes its bound. Three buffers then fill, in order: the kernel's receive buffer (left to Linux's
  autotuning, up to ``net.ipv4.tcp_rmem``'s maximum: setting ``SO_RCVBUF`` would switch autotuning off and cap it at
  ``net.core.rmem_max``), then the server's per-connection buffer (``max_pending``, 64 MiB by default). When that
  overflows, or a write to us stalls past the server's ``write_deadline``, the server drops the connection as a
  **slow consumer**: the reader reconnects, and what was published meanwhile is lost (logged as above). A paused
  socket shows no end of stream, so the reader notices the drop once it reads again: it first takes everything the
  kernel still held (complete messages are all delivered), then reconnects. That is the NATS core contract; a
  publisher that needs more uses Liftbridge envelopes with acks, or the tidelog client.
- **stop()** sends UNSUB and a PING, keeps reading (resuming a paused socket) until the PONG — every message sent
  before the UNSUB took effect has then been delivered — and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tidelog import __version__
from tidelog.broker.ingest.nats_connection import (
    NatsConnection,
    NatsServerError,
    ServerAddress,
    UnsupportedServerError,
)
from tidelog.broker.ingest.natsproto import (
    DEFAULT_MAX_PAYLOAD,
    Item,
    ProtocolError,
    connect_command,
    plain_prefix,
    sub_command,
    unsub_command,
)
from tidelog.clock import Clock, SystemClock

log = logging.getLogger(__name__)

OnMessages = Callable[[list[Item], int], None]
"""Called once per read with its messages, in order, and the read's reception time (ns since the epoch)."""

_SID = "1"  # one subscription per connection, and the same sid after a reconnect


PUBLISH_DELAY = 0.005
"""Seconds a :meth:`NatsReader.publish` command may wait for others to share its write. Only other streams and
plain subscribers wait for it (the publisher's ack never does); at 1 ms the NATS server still woke for every few
copies, which cost about a fifth of gRPC publish throughput on a small machine, at 5 ms it is within noise."""

PUBLISH_BYTES = 256 * 1024
"""Bytes of waiting commands that are written at once, without waiting for :data:`PUBLISH_DELAY`."""


class ReaderState(enum.Enum):
    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    CLOSING = "closing"
    CLOSED = "closed"


class NatsReader:
    """Subscribes to ``subject`` (in ``queue`` group when given) and hands every read's messages to ``on_messages``."""

    def __init__(
        self,
        urls: Sequence[str],
        subject: str,
        on_messages: OnMessages,
        *,
        queue: str | None = None,
        name: str = "tidelog-ingest",
        clock: Clock | None = None,
        connect_timeout: float = 5.0,
        reconnect_wait: float = 0.5,
        ping_interval: float = 30.0,
        max_pings_out: int = 2,
        drain_timeout: float = 5.0,
    ) -> None:
        self._servers = [ServerAddress.parse(url) for url in urls]
        if not self._servers:
            raise ValueError("no NATS server URL")
        self.subject = subject
        self.queue = queue or None
        self.on_messages = on_messages
        self.name = name
        self.clock: Clock = clock or SystemClock()
        self.plain_prefix = plain_prefix(subject, _SID)
        self._sub = sub_command(subject, _SID, self.queue)
        self._connect_timeout = connect_timeout
        self._reconnect_wait = reconnect_wait
        self._ping_interval = ping_interval
        self._max_pings_out = max_pings_out
        self._drain_timeout = drain_timeout
        self.state = ReaderState.NEW
        self.info: dict[str, Any] = {}  # the server's latest INFO
        self.connected_to: ServerAddress | None = None
        self.disconnects = 0
        self.reads = 0  # socket reads, and the bytes they brought (for metrics)
        self.bytes_read = 0
        self._conn: NatsConnection | None = None
        self._watchers: list[asyncio.Future[None]] = []  # woken on every change of state
        self._paused = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._out: list[bytes] = []  # publish() commands waiting to be written together
        self._out_bytes = 0
        self._out_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.state is not ReaderState.NEW:
            raise RuntimeError(f"reader {self.name} is {self.state.value}, not new")
        self._set_state(ReaderState.CONNECTING)
        try:
            await self._connect_any()
        except (UnsupportedServerError, NatsServerError, ValueError):
            self._set_state(ReaderState.CLOSED)
            raise
        except (OSError, TimeoutError, ProtocolError) as exc:
            log.warning(
                "NATS ingest %s: cannot connect to NATS (%s); retrying in the background. Messages published on "
                "%r before it connects are not received (NATS core delivers at most once)",
                self.name,
                repr(exc),
                self.subject,
            )
            self._begin_reconnect()
        else:
            self._set_state(ReaderState.CONNECTED)
        self._spawn(self._keepalive())

    async def stop(self) -> None:
        """UNSUB, deliver everything the server sent before it took effect, close. Safe to call twice."""
        if self.state in (ReaderState.CLOSING, ReaderState.CLOSED):
            return
        self._set_state(ReaderState.CLOSING)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._write_out()  # copies still waiting go before the UNSUB
        conn = self._conn
        if conn is not None and not conn.is_closed:
            conn.resume()
            conn.write(unsub_command(_SID))
            pong = conn.ping(wait=True)
            try:
                async with asyncio.timeout(self._drain_timeout):
                    await pong  # type: ignore[misc]
            except (TimeoutError, ConnectionError, NatsServerError) as exc:
                log.warning("NATS ingest %s: no PONG after UNSUB (%s); closing anyway", self.name, exc or "timeout")
            conn.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._drain_timeout):
                    await conn.closed
            conn.abort()
        self._conn = None
        self._set_state(ReaderState.CLOSED)

    def pause_reading(self) -> None:
        """Stop reading the socket until :meth:`resume_reading` (see the module's notes on back-pressure)."""
        self._paused = True
        if self._conn is not None:
            self._conn.pause()

    def resume_reading(self) -> None:
        self._paused = False
        if self._conn is not None:
            self._conn.resume()

    @property
    def paused(self) -> bool:
        return self._paused

    async def wait_until(self, predicate: Callable[[NatsReader], bool]) -> None:
        """Return once ``predicate(reader)`` holds; it is checked now and after every change of state."""
        while not predicate(self):
            future = asyncio.get_running_loop().create_future()
            self._watchers.append(future)
            await future

    def _set_state(self, state: ReaderState) -> None:
        self.state = state
        watchers, self._watchers = self._watchers, []
        for future in watchers:
            if not future.done():
                future.set_result(None)

    # ------------------------------------------------------------------------------------------ connecting

    def _candidates(self) -> list[ServerAddress]:
        """Every known server, starting after the one last connected to (so a dead one is not retried first)."""
        servers = self._servers
        if self.connected_to in servers:
            i = servers.index(self.connected_to) + 1
            return servers[i:] + servers[:i]
        return list(servers)

    async def _connect_any(self) -> None:
        error: BaseException | None = None
        for server in self._candidates():
            try:
                await self._connect(server)
                return
            except (OSError, TimeoutError, ProtocolError) as exc:
                error = exc
        assert error is not None
        raise error

    async def _connect(self, server: ServerAddress) -> None:
        loop = asyncio.get_running_loop()
        conn = NatsConnection(self)
        try:
            async with asyncio.timeout(self._connect_timeout):
                await loop.create_connection(lambda: conn, server.host, server.port)
                info = await conn.info
                if info.get("tls_required"):
                    raise UnsupportedServerError(f"{server} requires TLS; the ingest reader speaks plain TCP only")
                conn.parser.max_payload = int(info.get("max_payload") or DEFAULT_MAX_PAYLOAD)
                conn.write(connect_command(self._connect_options(server)) + self._sub)
                pong = conn.ping(wait=True)
                await pong  # type: ignore[misc]
        except BaseException:
            conn.abort()
            raise
        conn.handshaking = False
        self._conn = conn
        self.connected_to = server
        if self._paused:
            conn.pause()

    def _connect_options(self, server: ServerAddress) -> dict[str, object]:
        options: dict[str, object] = {
            "verbose": False,
            "pedantic": False,
            "tls_required": False,
            "name": self.name,
            "lang": "python",
            "version": f"tidelog-{__version__}",
            "protocol": 1,
            "headers": True,
            "no_responders": False,
            "echo": False,  # what this connection publishes (API publishes' copies) never comes back to it
        }
        if server.user is not None:
            options["user"] = server.user
            options["pass"] = server.password or ""
        if server.token is not None:
            options["auth_token"] = server.token
        return options

    def server_info(self, info: dict[str, Any]) -> None:
        self.info = info
        base = self.connected_to or self._servers[0]
        for url in info.get("connect_urls") or ():
            try:
                found = ServerAddress.parse(str(url))
            except (UnsupportedServerError, ValueError):
                continue
            found = ServerAddress(found.host, found.port, base.user, base.password, base.token)
            if all((s.host, s.port) != (found.host, found.port) for s in self._servers):
                self._servers.append(found)

    # ------------------------------------------------------------------------------------------ reconnecting

    def connection_lost(self, conn: NatsConnection, exc: Exception | None) -> None:
        if conn is not self._conn:
            return  # a connection that never finished its handshake, or one already replaced
        self._conn = None
        if self.state is ReaderState.CONNECTED:
            self.disconnects += 1
            log.warning(
                "NATS ingest %s: lost the connection to %s (%s); reconnecting", self.name, self.connected_to, exc
            )
            self._begin_reconnect()

    def _begin_reconnect(self) -> None:
        self._set_state(ReaderState.RECONNECTING)
        self._spawn(self._reconnect(self.clock.now_ns()))

    async def _reconnect(self, lost_at_ns: int) -> None:
        attempts = 0
        said = ""  # the last failure logged as a warning: a new kind of failure is worth one, each retry is not
        while self.state is ReaderState.RECONNECTING:
            for server in self._candidates():
                attempts += 1
                try:
                    await self._connect(server)
                except (OSError, TimeoutError, ProtocolError, NatsServerError, UnsupportedServerError) as exc:
                    text = f"{type(exc).__name__}: {exc}"
                    level = logging.DEBUG if text == said else logging.WARNING
                    log.log(level, "NATS ingest %s: reconnecting to %s failed (%s)", self.name, server, text)
                    said = text
                    continue
                self._set_state(ReaderState.CONNECTED)
                log.warning(
                    "NATS ingest %s: subscribed again through %s after %.3f s (%d attempts). Messages published on "
                    "%r in that time were not received: NATS core delivers at most once",
                    self.name,
                    server,
                    (self.clock.now_ns() - lost_at_ns) / 1e9,
                    attempts,
                    self.subject,
                )
                return
            await self.clock.sleep(self._reconnect_wait)

    async def _keepalive(self) -> None:
        while True:
            await self.clock.sleep(self._ping_interval)
            conn = self._conn
            if conn is None or self.state is not ReaderState.CONNECTED or conn.paused:
                continue  # a paused reader cannot see PONGs: the server's own PINGs judge it then
            if conn.pings_out >= self._max_pings_out:
                log.warning("NATS ingest %s: %d PINGs unanswered; dropping the connection", self.name, conn.pings_out)
                conn.abort()
                continue
            conn.ping(wait=False)

    def publish(self, command: bytes) -> bool:
        """Send a ready-made ``PUB``/``HPUB`` command on this connection (its ``echo`` is off, so the subscription
        never receives it); False when not connected, or when it exceeds the server's ``max_payload`` (the caller
        sends it another way).

        Commands wait up to :data:`PUBLISH_DELAY` seconds (or until :data:`PUBLISH_BYTES` wait) and go out in one
        write, in order: one write per message cost the broker and the NATS server each a system call and a
        wake-up per message, which under ``PublishAsync`` load was a fifth of the broker's time."""
        conn = self._conn
        if conn is None or self.state is not ReaderState.CONNECTED or conn.is_closed:
            return False
        if len(command) > conn.parser.max_payload:  # payload and headers are below the command's length
            return False
        if not self._out:
            self._out_timer = asyncio.get_running_loop().call_later(PUBLISH_DELAY, self._write_out)
        self._out.append(command)
        self._out_bytes += len(command)
        if self._out_bytes >= PUBLISH_BYTES:
            self._write_out()
        return True

    def _write_out(self) -> None:
        out, self._out, self._out_bytes = self._out, [], 0
        if self._out_timer is not None:
            self._out_timer.cancel()
            self._out_timer = None
        conn = self._conn
        if conn is not None and out:
            conn.write(b"".join(out))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}-{coro.__name__}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
