"""The broker's own NATS client (acks, ``PublishToSubject``, the nats-py ingest path), connected again whenever the
server closes it for good.

nats-py reconnects by itself after a network failure, but when the server answers ``-ERR`` (for instance
``maximum control line exceeded``, for an over-long subject) it closes the client for ever: every later publish
fails with ``nats: connection closed``, for every partition of the broker. Subjects that clients hand us are
checked where they enter (:mod:`tidelog.protocol.subjects`), so this should not happen; :class:`BrokerNats` is what
keeps one slip from taking the broker's NATS traffic down until a restart. It holds a nats-py client and, when the
server closes it, logs why and connects a new one (backing off while that fails), and subscribes again whatever
was subscribed through it. Messages published to those subscriptions in between are not received (NATS core
delivers at most once), as after any reconnect.

It offers the part of nats-py's client the broker uses: :meth:`publish`, :meth:`subscribe` (whose subscription
has ``unsubscribe()``), :meth:`flush` and :meth:`close`.

Failures to reach the servers are logged once per change of state, with the servers' addresses and what happens
next (:mod:`tidelog.launch.reachability`): the first connection is retried with a capped back-off until it
succeeds (or :meth:`connect` is cancelled), and a lost connection is reported once when it drops and once when
it is back, while nats-py reconnects; a repeated error goes to DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import nats

from tidelog.launch.reachability import ReachabilityLog, retry_until_reachable

log = logging.getLogger(__name__)

_RECONNECT_MAX_WAIT = 5.0  # seconds between attempts to connect a new client, at most (doubling from reconnect_wait)


class NatsNotTlsError(Exception):
    """TLS was asked for NATS, and the server does not use it."""


async def refuse_servers_in_clear(servers: Sequence[str], timeout: float) -> None:
    """Read each reachable server's greeting (its INFO line) and raise :class:`NatsNotTlsError` for one that does
    not require TLS, before nats-py connects and sends its CONNECT (with any credentials) to it: nats-py starts
    TLS only when the server asks. Servers that do not answer are left to nats-py."""
    for server in servers:
        parts = urlsplit(server if "://" in server else f"nats://{server}")
        host, port = parts.hostname or "127.0.0.1", parts.port or 4222
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port)
                try:
                    line = await reader.readuntil(b"\r\n")
                finally:
                    writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            continue
        head, _, body = line.partition(b" ")
        if head.upper() != b"INFO":
            continue
        try:
            info = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack: not a NATS server
            continue
        if not isinstance(info, dict):
            continue
        if not info.get("tls_required"):
            raise NatsNotTlsError(
                f"NATS server {host}:{port} does not use TLS, and nats_tls_ca/nats_tls_cert ask for it: "
                "refusing to talk to it in clear"
            )


class Subscription:
    """A subscription made through :class:`BrokerNats`; it is made again on every new client."""

    def __init__(self, owner: BrokerNats, subject: str, options: dict[str, Any]) -> None:
        self._owner = owner
        self.subject = subject
        self.options = options
        self.sub: Any = None  # nats-py's subscription on the current client

    async def unsubscribe(self) -> None:
        self._owner._subscriptions.discard(self)
        if self.sub is not None:
            with contextlib.suppress(Exception):  # already gone with a closed client, or max_msgs reached
                await self.sub.unsubscribe()


class BrokerNats:
    """A nats-py client to ``servers`` that is replaced by a new one whenever the server closes it."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        name: str,
        connect_timeout: float = 5.0,
        reconnect_wait: float = 0.5,
        pending_size: int = 64 * 1024 * 1024,
        security: dict[str, Any] | None = None,
        require_tls: bool = False,
    ) -> None:
        """``security``: nats-py's TLS and authentication options (``tls``, ``user``/``password``, ``token``,
        ``user_credentials``, ``nkeys_seed``), given to every client. ``require_tls``: a server that does not ask
        for TLS is refused (nats-py starts TLS only when the server asks, so a context alone guarantees nothing)."""
        self._security = dict(security or {})
        self._require_tls = require_tls
        self._servers = list(servers)
        self._name = name
        self._connect_timeout = connect_timeout
        self._reconnect_wait = reconnect_wait
        self._pending_size = pending_size
        self._client: Any = None
        self._closing = False
        self._last_error: Exception | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._subscriptions: set[Subscription] = set()
        self._changed = asyncio.Event()  # set on every new client (waiters clear nothing: they compare generation)
        self.generation = 0  # clients connected so far
        self._reach = ReachabilityLog(log, "NATS", ",".join(self._servers))
        self._said = ""  # the last error reported at WARNING, so a repeat goes to DEBUG

    async def connect(self) -> None:
        """Connect the first client, retrying with a capped back-off while no server can be reached (logged once
        per change of state, naming the servers). Cancel it to give up."""
        self._client = await retry_until_reachable(
            self._first_client, self._reach, retry_on=(OSError, nats.errors.Error)
        )
        self._connected()

    async def _first_client(self) -> Any:
        """One attempt: each server is tried twice (nats-py then gives up instead of retrying for ever); once
        connected, the client reconnects for ever like every later one. Raises the underlying failure."""
        self._last_error = None
        try:
            client = await self._new_client(1, attempts=1)
        except nats.errors.NoServersError:
            raise self._last_error or ConnectionRefusedError(111, "no server answered") from None
        client.options["max_reconnect_attempts"] = -1  # nats-py reads it at each reconnect
        if self._require_tls and not getattr(client, "_server_info", {}).get("tls_required"):
            with contextlib.suppress(Exception):
                await client.close()
            raise NatsNotTlsError(
                f"NATS server {client.connected_url.netloc if client.connected_url else '?'} does not use TLS, and "
                "nats_tls_ca/nats_tls_cert ask for it: refusing to talk to it in clear"
            )
        return client

    async def _new_client(self, generation: int, *, attempts: int = -1) -> Any:
        if self._require_tls:
            await refuse_servers_in_clear(self._servers, self._connect_timeout)

        async def closed() -> None:
            await self._on_closed(generation)

        async def error(exc: Exception) -> None:
            self._last_error = exc
            text = repr(exc)
            # While connecting for the first time, connect() reports; afterwards, a repeated error is not news.
            quiet = self.generation == 0 or text == self._said
            self._said = text
            log.log(logging.DEBUG if quiet else logging.WARNING, "NATS client %s: %s", self._name, text)

        async def disconnected() -> None:
            if not self._closing and generation == self.generation:
                self._reach.unreachable("connection lost", f"reconnecting every {self._reconnect_wait:g}s")

        async def reconnected() -> None:
            self._said = ""
            self._reach.reachable()

        return await nats.connect(
            self._servers,
            name=self._name,
            connect_timeout=self._connect_timeout,
            max_reconnect_attempts=attempts,
            reconnect_time_wait=self._reconnect_wait,
            pending_size=self._pending_size,
            closed_cb=closed,
            error_cb=error,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            **self._security,
        )

    def _connected(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def _on_closed(self, generation: int) -> None:
        if self._closing or generation != self.generation or self._reconnecting is not None:
            return
        log.error(
            "NATS client %s: the server closed the connection (%r); connecting a new one. Acks and "
            "PublishToSubject fail until it is connected",
            self._name,
            self._last_error,
        )
        self._reconnecting = asyncio.get_running_loop().create_task(self._reconnect(), name=f"{self._name}-reconnect")

    async def _reconnect(self) -> None:
        """Connect new clients (backing off) until one is connected with every subscription made again."""
        wait = self._reconnect_wait
        said = ""
        try:
            while not self._closing:
                client: Any = None
                try:
                    client = await self._new_client(self.generation + 1)
                    self._client = client
                    self._connected()
                    for subscription in list(self._subscriptions):
                        await self._subscribe(subscription, client)
                except Exception as exc:
                    text = repr(exc)
                    log.log(logging.DEBUG if text == said else logging.WARNING, "NATS client %s: %s", self._name, text)
                    said = text
                    if client is not None and not client.is_closed:  # connected, but a subscription failed
                        with contextlib.suppress(Exception):
                            await client.close()
                else:
                    if not client.is_closed:  # else it was closed again meanwhile: its own callback saw us busy
                        log.warning("NATS client %s: connected again", self._name)
                        return
                await asyncio.sleep(wait)
                wait = min(wait * 2, _RECONNECT_MAX_WAIT)
        finally:
            self._reconnecting = None

    async def wait_generation(self, generation: int) -> None:
        """Return once the ``generation``-th client has connected."""
        while self.generation < generation:
            await self._changed.wait()

    async def _current(self) -> Any:
        """The client to use: while a new one is being connected, wait for it (up to the connect timeout)."""
        reconnecting = self._reconnecting
        if reconnecting is not None and not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reconnecting), self._connect_timeout)
        return self._client

    # ------------------------------------------------------------------------------------------ nats-py's API

    async def publish(self, subject: str, payload: bytes = b"", **options: Any) -> None:
        await (await self._current()).publish(subject, payload, **options)

    async def subscribe(self, subject: str, *, cb: Callable[[Any], Awaitable[None]], **options: Any) -> Subscription:
        subscription = Subscription(self, subject, {"cb": cb, **options})
        await self._subscribe(subscription, await self._current())
        self._subscriptions.add(subscription)
        return subscription

    async def _subscribe(self, subscription: Subscription, client: Any = None) -> None:
        subscription.sub = await (client or self._client).subscribe(subscription.subject, **subscription.options)

    async def flush(self, timeout: float = 10.0) -> None:
        await (await self._current()).flush(timeout)

    @property
    def is_connected(self) -> bool:
        return self._client is not None and bool(self._client.is_connected)

    async def close(self) -> None:
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            await asyncio.gather(self._reconnecting, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
