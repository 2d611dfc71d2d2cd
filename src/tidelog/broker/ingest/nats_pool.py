"""The NATS connections a broker's ingests share: a few per broker, one subscription per partition on them.

Before this pool, every partition led here had a NATS connection of its own: 200 one-partition streams on a broker
meant 212 NATS sockets, and each connection's keepalive timer woke once per interval per partition. Now a broker
opens at most ``nats_ingest_connections`` :class:`~tidelog.broker.ingest.nats_reader.NatsReader` connections (the
setting; lazily: a broker leading one partition opens one), and each partition leader adds one subscription (one
sid) to the connection carrying fewest. Sockets, PINGs and timers grow with the connections, not the partitions;
subscribing a new leader is a SUB line on a connection already open, and the subscriptions of many leaders started
together share one PING round trip.

A hot partition cannot starve the others on its connection: the reader never pauses the socket, it pauses the
partition alone (see :mod:`tidelog.broker.ingest.nats_reader`, "Back-pressure, per partition"). A lost connection
subscribes all its partitions again on the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from tidelog.broker.ingest.nats_connection import UnsupportedServerError
from tidelog.broker.ingest.nats_reader import NatsReader, OnMessages, ReaderState, Subscription
from tidelog.clock import Clock, SystemClock

log = logging.getLogger(__name__)

DEFAULT_CONNECTIONS = 4


class IngestPool:
    """Up to ``size`` shared :class:`NatsReader` connections to ``urls``; :meth:`subscribe` puts a partition's
    subscription on the one carrying fewest. ``reader_options`` go to each reader (timeouts, PING interval)."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        size: int = DEFAULT_CONNECTIONS,
        name: str = "tidelog-ingest",
        clock: Clock | None = None,
        reader_options: dict[str, Any] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"an ingest pool needs at least one connection, got {size}")
        self._urls = list(urls)
        self.size = size
        self._name = name
        self._clock: Clock = clock or SystemClock()
        self._reader_options = reader_options or {}
        self.readers: list[NatsReader] = []  # started (connected, or reconnecting in the background)
        self._opening = asyncio.Lock()  # one connection opens at a time; subscribers wait for it
        self._refused: UnsupportedServerError | None = None  # the servers need what the reader cannot speak

    async def subscribe(
        self, subject: str, on_messages: OnMessages, queue: str | None = None
    ) -> tuple[NatsReader, Subscription]:
        """Subscribe ``on_messages`` to ``subject`` on a shared connection; returns once the server has processed
        the SUB. Raises UnsupportedServerError when the servers need TLS or websockets (then every later call does
        at once), NatsServerError when a server refuses the connection or the subscription."""
        if self._refused is not None:
            raise self._refused
        async with self._opening:
            reader = await self._pick()
            sub = reader.add(subject, on_messages, queue)
        try:
            await reader.confirm()
        except BaseException:
            await reader.unsubscribe(sub)
            raise
        return reader, sub

    async def _pick(self) -> NatsReader:
        """The connection carrying fewest subscriptions; a new one while fewer than ``size`` are open and each
        open one carries some."""
        live = [r for r in self.readers if r.state not in (ReaderState.CLOSING, ReaderState.CLOSED)]
        self.readers = live
        if len(live) < self.size and all(r.load for r in live):
            reader = NatsReader(
                self._urls, name=f"{self._name}-{len(live) + 1}", clock=self._clock, **self._reader_options
            )
            try:
                await reader.start()
            except UnsupportedServerError as exc:
                self._refused = exc
                raise
            self.readers.append(reader)
            return reader
        return min(live, key=lambda r: r.load)

    async def close(self) -> None:
        """Stop every connection (their subscriptions' last messages are delivered first)."""
        readers, self.readers = self.readers, []
        await asyncio.gather(*(r.stop() for r in readers), return_exceptions=True)
