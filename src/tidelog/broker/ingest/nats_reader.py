"""A minimal NATS subscriber for ingest: one TCP connection carrying the subscriptions of many partitions.

Why not nats-py here: its per-operation parser, a ``Msg`` object, a pending queue and a task wake-up for each received
message took more than half the broker's time at full ingest load (docs/performance.md). This reader parses each socket
read in one pass (:func:`tidelog.broker.ingest.natsproto.parse`), sorting the messages by subscription (sid) as it
goes, and hands each subscription its messages of the read in one callback, together with one reception time; it
creates no object per message beyond a view of the payload (or a small tuple for the uncommon shapes), and no task
or queue at all. The connection also publishes the NATS copies of API publishes to its partitions
(:meth:`NatsReader.publish`; :mod:`tidelog.broker.ingest.copies`): its ``echo`` is off, so the server never sends
them back to it. nats-py stays the broker's client for everything else (acks, ``PublishToSubject``, the metadata of
other components).

A broker holds a few of these (:class:`~tidelog.broker.ingest.nats_pool.IngestPool`, ``nats_ingest_connections``),
each carrying one :class:`Subscription` (one sid) per partition led here: sockets, PINGs and timers grow with the
connections, not with the partitions. One TCP connection at a time is a
:class:`~tidelog.broker.ingest.nats_connection.NatsConnection` (parsing, PING/PONG); this module owns the
subscriptions across connections. It speaks ``nats://`` only (plain TCP, optionally ``user:password@`` or
``token@`` in the URL). A ``tls://`` or ``ws(s)://`` URL, or a server that requires TLS, raises
:class:`~tidelog.broker.ingest.nats_connection.UnsupportedServerError`, and the ingest then uses nats-py instead.

Lifecycle (:class:`ReaderState`)::

    NEW ─start()─▶ CONNECTING ─▶ CONNECTED ⇄ RECONNECTING
                                      │            │
                                      └─ stop() ───┴─▶ CLOSING ─▶ CLOSED

- **subscribe** (:meth:`NatsReader.add`, then :meth:`NatsReader.confirm`) returns once the server has processed
  the SUB (a PING sent after it came back as PONG, and the server handles a connection's operations in order):
  whatever is published afterwards reaches the subscription. The SUBs of every partition subscribing in the same
  loop turn share one PING: a hundred new leaders cost a hundred SUB lines and one round trip, not a hundred
  connections. When no server can be reached, the reader logs it and keeps trying in the background, as a NATS
  client would; a subscription made meanwhile is sent when it connects.
- **Reconnect.** When the connection drops, the reader connects again (each known server in turn, ``reconnect_wait``
  between rounds, for ever) and subscribes every partition again (the same sids, in one write). NATS core delivers
  at most once: messages published while no connection was subscribed are not received — exactly as with nats-py,
  which cannot replay them either. The gap is logged as a warning with its length. A message whose bytes were cut
  off by the drop was never received whole and is not stored; every complete one before it was.
- **Liveness.** The server's PINGs are answered at once; the reader PINGs every ``ping_interval`` and treats
  ``max_pings_out`` unanswered PINGs as a dead connection (a half-open TCP connection shows nothing otherwise).
- **Back-pressure, per partition.** A shared socket is never paused: that would stop every partition on the
  connection behind one slow one. :meth:`NatsReader.pause` instead unsubscribes that partition alone (UNSUB of its
  sid; what the server had already sent still arrives and is delivered), and :meth:`NatsReader.resume` subscribes it
  again (the same sid). Core NATS keeps nothing for a subscription that does not exist, so messages published on the
  subject while it was paused are not received here: in a queue group the other members take them, otherwise they
  are lost, and the resume logs the gap as a warning with its length. Before connections were shared, a slow
  partition paused its own socket and NATS buffered for it (up to ``max_pending``, 64 MiB by default) before
  dropping it as a slow consumer, which lost messages the same way, only later. A partition **alone** on its
  connection still pauses that way (the socket, which stops no one else): nothing is lost until the server's buffer
  for the connection overflows, when it drops the connection as a slow consumer and the reader reconnects (a paused
  socket shows no end of stream, so the reader notices once it reads again, after taking every complete message
  the kernel held). A subscription added to a connection paused for another turns that pause into an UNSUB. A
  publisher that needs more uses Liftbridge envelopes with acks, or the tidelog client.
- **unsubscribe** (:meth:`NatsReader.unsubscribe`) sends UNSUB and a PING, and keeps delivering until the PONG:
  every message sent before the UNSUB took effect has then been delivered. **stop()** does that for every
  subscription at once and closes the connection.
"""

from __future__ import annotations

import asyncio
import collections
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
    Route,
    connect_command,
    plain_prefix,
    sub_command,
    unsub_command,
)
from tidelog.clock import Clock, SystemClock

log = logging.getLogger(__name__)

OnMessages = Callable[[list[Item], int], None]
"""Called once per read that holds messages of the subscription, with them in order and the read's reception time
(ns since the epoch)."""


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


class Subscription(Route):
    """One partition's subscription on a :class:`NatsReader`: its sid, subject, queue group and callback.

    ``paused``: paused by :meth:`NatsReader.pause` (its route stays, for what is in flight); ``away``: unsubscribed
    at the server for it (a subscription alone on its connection pauses the socket instead)."""

    __slots__ = ("away", "command", "on_messages", "paused", "paused_ns", "queue", "sid", "subject")

    def __init__(self, sid: str, subject: str, queue: str | None, on_messages: OnMessages) -> None:
        super().__init__(plain_prefix(subject, sid))
        self.sid = sid
        self.subject = subject
        self.queue = queue or None
        self.on_messages = on_messages
        self.paused = False
        self.away = False
        self.paused_ns = 0
        self.command = sub_command(subject, sid, self.queue)  # raises ValueError for a bad subject or group

    @property
    def wildcard(self) -> bool:
        return self.prefix is None


class NatsReader:
    """One NATS connection (across reconnects) carrying many :class:`Subscription`; each read's messages go to
    their subscriptions' callbacks."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
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
        self.name = name
        self.clock: Clock = clock or SystemClock()
        self.routes: dict[bytes, Subscription] = {}  # every subscription, by sid (the parser reads it)
        self._next_sid = 1
        self._subjects: collections.Counter[str] = collections.Counter()  # subscriptions per subject...
        self._wildcards = 0  # ...and how many have a wildcard subject (for publish())
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
        self.unrouted = 0  # messages for a sid no subscription holds (none expected)
        self._conn: NatsConnection | None = None
        self._watchers: list[asyncio.Future[None]] = []  # woken on every change of state
        self._barrier: list[asyncio.Future[None]] = []  # confirm() calls waiting for the next PING's PONG
        self._socket_paused: Subscription | None = None  # the one subscription, paused by pausing the socket
        self._tasks: set[asyncio.Task[None]] = set()
        self._out: list[bytes] = []  # publish() commands waiting to be written together
        self._out_bytes = 0
        self._out_timer: asyncio.TimerHandle | None = None

    @property
    def load(self) -> int:
        """Subscriptions carried (the pool puts a new one on the connection carrying fewest)."""
        return len(self.routes)

    @property
    def socket_paused(self) -> bool:
        """Whether the socket is paused (for the one subscription it carries: see the module's notes)."""
        return self._conn is not None and self._conn.paused

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect; raises what a server refuses (TLS required, an ``-ERR``), retries in the background otherwise."""
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
                "NATS ingest %s: cannot connect to NATS (%s); retrying in the background. Messages published "
                "before it connects are not received (NATS core delivers at most once)",
                self.name,
                repr(exc),
            )
            self._begin_reconnect()
        else:
            self._set_state(ReaderState.CONNECTED)
        self._spawn(self._keepalive())

    async def stop(self) -> None:
        """UNSUB everything, deliver what the server sent before that took effect, close. Safe to call twice."""
        if self.state in (ReaderState.CLOSING, ReaderState.CLOSED):
            return
        self._set_state(ReaderState.CLOSING)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._write_out()  # copies still waiting go before the UNSUBs
        conn = self._conn
        self._socket_paused = None
        if conn is not None and not conn.is_closed:
            conn.resume()
            conn.write(b"".join(unsub_command(s.sid) for s in self.routes.values() if not s.away))
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
        self.routes.clear()
        self._subjects.clear()
        self._wildcards = 0
        self._set_state(ReaderState.CLOSED)

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

    # ------------------------------------------------------------------------------------------ subscriptions

    def add(self, subject: str, on_messages: OnMessages, queue: str | None = None) -> Subscription:
        """Subscribe ``on_messages`` to ``subject`` (in ``queue`` group when given): the SUB is written now; await
        :meth:`confirm` for the server to have processed it. Raises ValueError for a subject or group NATS refuses."""
        if self.state in (ReaderState.CLOSING, ReaderState.CLOSED):
            raise RuntimeError(f"reader {self.name} is {self.state.value}")
        sub = Subscription(str(self._next_sid), subject, queue, on_messages)
        self._next_sid += 1
        self._unpause_socket(away=True)  # the socket is shared from now on
        self.routes[sub.sid.encode()] = sub
        self._subjects[subject] += 1
        self._wildcards += sub.wildcard
        conn = self._conn
        if conn is not None and self.state is ReaderState.CONNECTED:
            conn.write(sub.command)
        return sub

    async def confirm(self) -> None:
        """Return once the server has processed every SUB written so far (or there is no connection to wait on:
        the reconnect subscribes everything again). Raises NatsServerError when the server answers ``-ERR`` in
        between (a subject it does not allow): the caller unsubscribes and retries."""
        conn = self._conn
        if conn is None or self.state is not ReaderState.CONNECTED or conn.is_closed:
            return
        future = asyncio.get_running_loop().create_future()
        if not self._barrier:
            asyncio.get_running_loop().call_soon(self._send_barrier)
        self._barrier.append(future)
        with contextlib.suppress(ConnectionError):  # lost meanwhile: the reconnect subscribes it again
            await future

    def _send_barrier(self) -> None:
        """One PING for every confirm() of this loop turn; its PONG (or the connection's end) answers them all."""
        waiters, self._barrier = self._barrier, []
        conn = self._conn
        if conn is None or conn.is_closed:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            return
        pong = conn.ping(wait=True)
        assert pong is not None

        def answer(done: asyncio.Future[None]) -> None:
            error = done.exception()
            for waiter in waiters:
                if waiter.done():
                    continue
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)
                    waiter.exception()  # retrieved: a cancelled confirm() must not make asyncio log it

        pong.add_done_callback(answer)

    async def unsubscribe(self, sub: Subscription) -> None:
        """UNSUB, and deliver everything the server sent before it took effect; then forget the subscription."""
        key = sub.sid.encode()
        if self.routes.get(key) is not sub:
            return
        conn = self._conn
        if conn is not None and self.state is ReaderState.CONNECTED and not conn.is_closed:
            self._write_out()  # copies waiting go before the UNSUB
            if self._socket_paused is sub:
                self._unpause_socket(away=False)  # PONGs must be read
            if not sub.away:
                conn.write(unsub_command(sub.sid))
            try:
                async with asyncio.timeout(self._drain_timeout):
                    await self.confirm()
            except (TimeoutError, NatsServerError) as exc:
                log.warning("NATS ingest %s: no PONG after UNSUB of %r (%s)", self.name, sub.subject, exc or "timeout")
        if self.routes.get(key) is sub:
            del self.routes[key]
            self._subjects[sub.subject] -= 1
            if not self._subjects[sub.subject]:
                del self._subjects[sub.subject]
            self._wildcards -= sub.wildcard

    def pause(self, sub: Subscription) -> None:
        """Stop the server sending ``sub``'s messages (UNSUB), leaving the connection's other subscriptions alone;
        what it had already sent is still delivered. See the module's notes on back-pressure."""
        if sub.paused or self.routes.get(sub.sid.encode()) is not sub:
            return
        sub.paused = True
        sub.paused_ns = self.clock.now_ns()
        conn = self._conn
        if len(self.routes) == 1:
            self._socket_paused = sub  # alone: the socket stops no one else, and NATS buffers for it
            if conn is not None:
                conn.pause()
            return
        sub.away = True
        if conn is not None and self.state is ReaderState.CONNECTED:
            conn.write(unsub_command(sub.sid))

    def resume(self, sub: Subscription) -> None:
        """Subscribe ``sub`` again after :meth:`pause` (the same sid); logs how long it was away."""
        if not sub.paused or self.routes.get(sub.sid.encode()) is not sub:
            return
        sub.paused = False
        if self._socket_paused is sub:
            self._unpause_socket(away=False)
            return
        sub.away = False
        conn = self._conn
        if conn is not None and self.state is ReaderState.CONNECTED:
            conn.write(sub.command)
        log.warning(
            "NATS ingest %s: subscribed again to %r after %.3f s paused. Messages published on it in that time "
            "were not received here (NATS core keeps nothing for a paused subscriber)",
            self.name,
            sub.subject,
            (self.clock.now_ns() - sub.paused_ns) / 1e9,
        )

    def _unpause_socket(self, *, away: bool) -> None:
        """Read the socket again; with ``away``, the subscription it was paused for stays paused by an UNSUB."""
        sub, self._socket_paused = self._socket_paused, None
        if sub is None:
            return
        conn = self._conn
        if away:
            sub.away = True
            if conn is not None and self.state is ReaderState.CONNECTED:
                conn.write(unsub_command(sub.sid))
        if conn is not None:
            conn.resume()

    def on_read(self, touched: list[Route], unrouted: list[Item], received_ns: int) -> None:
        """One read's messages, already sorted by subscription: each subscription's go to its callback."""
        if unrouted:
            self.unrouted += len(unrouted)
        for route in touched:
            items = route.items
            if not items:
                continue
            route.items = []
            sub: Subscription = route  # type: ignore[assignment]
            try:
                sub.on_messages(items, received_ns)
            except Exception:
                log.exception("NATS ingest %s: %r could not take %d messages", self.name, sub.subject, len(items))

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
                sent = {key: sub for key, sub in self.routes.items() if not sub.away}
                subs = b"".join(sub.command for sub in sent.values())
                conn.write(connect_command(self._connect_options(server)) + subs)
                pong = conn.ping(wait=True)
                await pong  # type: ignore[misc]
        except BaseException:
            conn.abort()
            raise
        conn.handshaking = False
        self._conn = conn
        self.connected_to = server
        # Subscriptions added, paused, resumed or removed while the handshake was under way.
        fix = [sub.command for key, sub in self.routes.items() if not sub.away and sent.get(key) is not sub]
        fix += [unsub_command(sub.sid) for key, sub in sent.items() if self.routes.get(key) is not sub or sub.away]
        if fix:
            conn.write(b"".join(fix))
        if self._socket_paused is not None:
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
                    "NATS ingest %s: %d subscriptions again through %s after %.3f s (%d attempts). Messages "
                    "published on their subjects in that time were not received: NATS core delivers at most once",
                    self.name,
                    len(self.routes),
                    server,
                    (self.clock.now_ns() - lost_at_ns) / 1e9,
                    attempts,
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

    def publish(self, command: bytes, sub: Subscription) -> bool:
        """Send a ready-made ``PUB``/``HPUB`` command on ``sub``'s subject on this connection (its ``echo`` is off,
        so ``sub`` never receives it); False when not connected, when it exceeds the server's ``max_payload``, or
        when another subscription of this connection could match the subject (echo off would keep the copy from it
        too): the caller then sends it another way.

        Commands wait up to :data:`PUBLISH_DELAY` seconds (or until :data:`PUBLISH_BYTES` wait) and go out in one
        write, in order: one write per message cost the broker and the NATS server each a system call and a
        wake-up per message, which under ``PublishAsync`` load was a fifth of the broker's time."""
        conn = self._conn
        if conn is None or self.state is not ReaderState.CONNECTED or conn.is_closed:
            return False
        if len(command) > conn.parser.max_payload:  # payload and headers are below the command's length
            return False
        if self._subjects[sub.subject] != 1 or self._wildcards != sub.wildcard:
            return False  # another subscription here might match: it must receive the copy
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
