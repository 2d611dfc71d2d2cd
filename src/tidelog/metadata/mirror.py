"""The broker's local mirror of the etcd keyspace (Gazette's KeySpace idea).

The mirror loads the whole prefix once, then follows a watch from the next revision, so it sees every change
exactly once and in etcd's order. Each applied change produces a new :class:`MetadataSnapshot`; listeners are
called with the old and new snapshot and reconcile what they run (open a partition, start a subscription).
``wait_for`` lets a request that just wrote to etcd wait until this broker has acted on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.metadata.records import Keys, decode_broker, decode_partition, decode_stream
from tidelog.metadata.snapshot import MetadataSnapshot

log = logging.getLogger(__name__)

Listener = Callable[[MetadataSnapshot, MetadataSnapshot], Awaitable[None]]


class MetadataMirror:
    """Follows ``keys.prefix`` in etcd and keeps the latest :class:`MetadataSnapshot`."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._snapshot = MetadataSnapshot()
        self._listeners: list[Listener] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._watch: Any = None

    @property
    def snapshot(self) -> MetadataSnapshot:
        """The latest snapshot whose listeners have all run."""
        return self._snapshot

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(old, new)`` after every applied change, in order, one at a time."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Load the prefix and start following it."""
        result = await self._client.get_prefix(self._keys.prefix.encode() + b"/")
        streams: dict[str, Any] = {}
        partitions: dict[Any, Any] = {}
        brokers: dict[str, Any] = {}
        for kv in result:
            self._apply_kv(streams, partitions, brokers, kv.key, kv.value)
        revision = result.header.revision
        await self._publish(MetadataSnapshot(revision, streams, partitions, brokers))
        self._watch = await self._client.watch_prefix(self._keys.prefix.encode() + b"/", start_revision=revision + 1)
        self._task = asyncio.create_task(self._follow(), name="metadata-mirror")

    async def stop(self) -> None:
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await self._watch.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def wait_for(
        self, predicate: Callable[[MetadataSnapshot], bool], timeout: float | None = None
    ) -> MetadataSnapshot:
        """Wait until ``predicate(snapshot)`` holds (and the listeners of that snapshot have run).

        A predicate rather than a revision: etcd delivers a transaction's keys as separate watch events with
        one revision, so "revision R applied" would be true after the first key of R but before the last.
        """

        async def wait() -> MetadataSnapshot:
            async with self._changed:
                await self._changed.wait_for(lambda: predicate(self._snapshot))
                return self._snapshot

        async with asyncio.timeout(timeout):  # not wait_for: see client.connection.Connection.request
            return await wait()

    async def _follow(self) -> None:
        async for event in self._watch:
            snap = self._snapshot
            streams, partitions, brokers = dict(snap.streams), dict(snap.partitions), dict(snap.brokers)
            if event.kind == "DELETE":
                self._delete_kv(streams, partitions, brokers, event.kv.key)
            else:
                self._apply_kv(streams, partitions, brokers, event.kv.key, event.kv.value)
            await self._publish(MetadataSnapshot(event.kv.mod_revision, streams, partitions, brokers))

    async def _publish(self, new: MetadataSnapshot) -> None:
        old = self._snapshot
        for listener in self._listeners:
            try:
                await listener(old, new)
            except Exception:  # a listener's failure must not stop the mirror
                log.exception("metadata listener failed at revision %d", new.revision)
        # Only now, after its listeners ran: ``wait_for`` (and every reader) must never see a snapshot that the
        # partition manager has not acted on yet, or a stream would be "created" before its partitions open.
        self._snapshot = new
        async with self._changed:
            self._changed.notify_all()

    def _apply_kv(
        self, streams: dict[Any, Any], partitions: dict[Any, Any], brokers: dict[Any, Any], key: bytes, value: bytes
    ) -> None:
        text = key.decode()
        try:
            if text.startswith(self._keys.streams):
                record = decode_stream(value)
                streams[record.name] = record
            elif text.startswith(self._keys.partitions):
                p = decode_partition(value)
                partitions[(p.stream, p.id)] = p
            elif text.startswith(self._keys.brokers):
                b = decode_broker(value)
                brokers[b.id] = b
        except Exception:
            log.exception("ignoring undecodable metadata at %s", text)

    def _delete_kv(
        self, streams: dict[Any, Any], partitions: dict[Any, Any], brokers: dict[Any, Any], key: bytes
    ) -> None:
        text = key.decode()
        if text.startswith(self._keys.streams):
            streams.pop(text[len(self._keys.streams) :], None)
        elif text.startswith(self._keys.partitions):
            stream, _, pid = text[len(self._keys.partitions) :].rpartition("/")
            partitions.pop((stream, int(pid)), None)
        elif text.startswith(self._keys.brokers):
            brokers.pop(text[len(self._keys.brokers) :], None)
