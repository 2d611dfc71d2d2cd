"""The broker's local mirror of the etcd keyspace (Gazette's KeySpace idea).

The mirror loads the whole prefix once, then follows a watch from the next revision, so it sees every change
exactly once and in etcd's order. Each applied change produces a new :class:`MetadataSnapshot`; listeners are
called with the old and new snapshot and reconcile what they run (open a partition, start a subscription).
``wait_for`` lets a request that just wrote to etcd wait until this broker has acted on it.

A partition appears in a snapshot only while its stream record exists. A stream's partitions are written before
its record, in several transactions when there are many (:mod:`tidelog.metadata.stream_creation`): the mirror
holds them back (``_hidden``, no snapshot is published for them) and publishes them with the stream record, in
one snapshot. A deleted stream takes its partitions out of the snapshot with it, in the same way. So no listener
or reader ever sees a stream without all its partitions, or acts on the partitions of a stream half created,
abandoned or being deleted. Partitions added to an existing stream (:mod:`tidelog.metadata.stream_changes`) are
held back the same way while their id is at or above the stream record's partition count, and show together
when the record with the new count arrives.

The prefix is followed through broken watches (:mod:`~tidelog.metadata.prefix_follower`), so the mirror never
freezes on a change it has not seen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tidelog.metadata.prefix_follower import PrefixFollower
from tidelog.metadata.records import Keys, PartitionRecord, decode_broker, decode_partition, decode_stream
from tidelog.metadata.remote_segments import remote_prefix
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
        self._follower = PrefixFollower(
            client, keys.prefix.encode() + b"/", name="metadata-mirror", load=self._load, apply=self._apply
        )
        self._hidden: dict[str, dict[int, PartitionRecord]] = {}  # partitions of streams not in the snapshot
        self._remote = remote_prefix(keys)

    @property
    def snapshot(self) -> MetadataSnapshot:
        """The latest snapshot whose listeners have all run."""
        return self._snapshot

    @property
    def in_sync(self) -> bool:
        """Whether the mirror follows etcd now: loaded, and its watch up (not broken and being made again)."""
        return self._follower.watching

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(old, new)`` after every applied change, in order, one at a time."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Load the prefix and start following it."""
        await self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()

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

    async def _load(self, result: Any, again: bool) -> None:
        """Publish a whole read of the prefix as one snapshot (at start, and when the watch's history is gone)."""
        streams: dict[str, Any] = {}
        partitions: dict[Any, Any] = {}
        brokers: dict[str, Any] = {}
        self._hidden = {}
        for kv in sorted(result, key=lambda kv: not kv.key.startswith(self._keys.streams.encode())):
            self._apply_kv(streams, partitions, brokers, kv.key, kv.value)  # streams first: their partitions show
        await self._publish(MetadataSnapshot(result.header.revision, streams, partitions, brokers))

    async def _apply(self, event: Any) -> None:
        if event.kv.key.startswith(self._remote):
            return  # tiered storage's segment lists: followed by the tier catalog, never part of a snapshot
        if self._held_back(event):
            return  # a partition of a stream not (or no longer) in the snapshot: nothing anyone sees changed
        snap = self._snapshot
        streams, partitions, brokers = dict(snap.streams), dict(snap.partitions), dict(snap.brokers)
        if event.kind == "DELETE":
            self._delete_kv(streams, partitions, brokers, event.kv.key)
        else:
            self._apply_kv(streams, partitions, brokers, event.kv.key, event.kv.value)
        await self._publish(MetadataSnapshot(event.kv.mod_revision, streams, partitions, brokers))

    def _held_back(self, event: Any) -> bool:
        """Apply ``event`` to the held-back partitions if it is about one of a stream the snapshot does not have
        (True), without copying the snapshot: a stream of 10,000 partitions is 10,000 events."""
        text = event.kv.key.decode()
        if not text.startswith(self._keys.partitions):
            return False
        stream, _, pid = text[len(self._keys.partitions) :].rpartition("/")
        record = self._snapshot.streams.get(stream)
        if record is not None and int(pid) < record.partitions:
            return False
        if event.kind == "DELETE":
            held = self._hidden.get(stream)
            if held is not None:
                held.pop(int(pid), None)
                if not held:
                    del self._hidden[stream]
        else:
            self._apply_kv({}, {}, {}, event.kv.key, event.kv.value)
        return True

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
        """Apply a put (a partition of a stream not in ``streams`` is held back)."""
        text = key.decode()
        try:
            if text.startswith(self._keys.streams):
                record = decode_stream(value)
                held = self._hidden.get(record.name, {})
                for pid in [pid for pid in held if pid < record.partitions]:  # written first, they show with it
                    p = held.pop(pid)
                    partitions[(p.stream, p.id)] = p
                if not held:
                    self._hidden.pop(record.name, None)
                streams[record.name] = record
            elif text.startswith(self._keys.partitions):
                p = decode_partition(value)
                stream = streams.get(p.stream)
                if stream is None or p.id >= stream.partitions:
                    self._hidden.setdefault(p.stream, {})[p.id] = p
                    return
                partitions[(p.stream, p.id)] = p
            elif text.startswith(self._keys.brokers):
                b = decode_broker(value)
                brokers[b.id] = b
        except Exception:
            log.exception("ignoring undecodable metadata at %s", text)

    def _delete_kv(
        self, streams: dict[Any, Any], partitions: dict[Any, Any], brokers: dict[Any, Any], key: bytes
    ) -> None:
        """Apply a delete (a stream's partitions are held back until their own deletes arrive)."""
        text = key.decode()
        if text.startswith(self._keys.streams):
            name = text[len(self._keys.streams) :]
            streams.pop(name, None)
            for pkey in [k for k in partitions if k[0] == name]:  # held back until their own deletes arrive
                self._hidden.setdefault(name, {})[pkey[1]] = partitions.pop(pkey)
        elif text.startswith(self._keys.partitions):
            stream, _, pid = text[len(self._keys.partitions) :].rpartition("/")
            partitions.pop((stream, int(pid)), None)
        elif text.startswith(self._keys.brokers):
            brokers.pop(text[len(self._keys.brokers) :], None)
