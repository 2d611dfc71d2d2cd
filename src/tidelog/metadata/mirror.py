"""The broker's local mirror of the etcd keyspace (Gazette's KeySpace idea).

The mirror loads the whole prefix once, then follows a watch from the next revision, so it sees every change
exactly once and in etcd's order. Applied changes produce a new :class:`MetadataSnapshot`; listeners are called
with the old and new snapshot and reconcile what they run (open a partition, start a subscription).
``wait_for`` lets a request that just wrote to etcd wait until this broker has acted on it.

**A change costs what changed.** A watch event edits only its own record: the snapshot's maps are
:class:`~tidelog.metadata.shared_map.SharedMap` values, so the new snapshot shares every other record with the
old one, and its ``change`` (:class:`~tidelog.metadata.snapshot.SnapshotChange`) names the keys that changed, so
that listeners look at those only (:func:`~tidelog.metadata.snapshot.changed_partitions`). Events are applied
as they arrive, and published by a task of their own: the events applied while the listeners of the previous
snapshot ran (a transaction of a hundred partition records is a hundred events delivered together) are
published as one snapshot, whose ``change`` names them all, so a failover that moves many leaders reaches the
partition manager as one reconcile of exactly those partitions.

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
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from tidelog.metadata.prefix_follower import PrefixFollower
from tidelog.metadata.records import (
    BrokerRecord,
    Keys,
    PartitionRecord,
    StreamRecord,
    decode_broker,
    decode_partition,
    decode_stream,
)
from tidelog.metadata.remote_segments import remote_prefix
from tidelog.metadata.shared_map import DELETED, SharedMap
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey, SnapshotChange
from tidelog.protocol.errors import UnavailableError

log = logging.getLogger(__name__)

Listener = Callable[[MetadataSnapshot, MetadataSnapshot], Awaitable[None]]

K = TypeVar("K")
V = TypeVar("V")


class _Edit(Generic[K, V]):
    """Changes to one map of the snapshot, read through to it: applied with :meth:`SharedMap.edit`."""

    def __init__(self, base: Mapping[K, V]) -> None:
        self.base = base
        self.changes: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        if key in self.changes:
            found = self.changes[key]
            return None if found is DELETED else found
        return self.base.get(key)

    def __setitem__(self, key: K, value: V) -> None:
        self.changes[key] = value

    def pop(self, key: K) -> V | None:
        found = self.get(key)
        if found is not None:
            self.changes[key] = DELETED
        return found

    def result(self) -> SharedMap[K, V]:
        base = self.base if isinstance(self.base, SharedMap) else SharedMap(self.base)
        return base.edit(self.changes)


class _Head:
    """The newest state applied (ahead of the published snapshot while its listeners run), and what changed
    since the last snapshot published (None: a whole read, anything may have)."""

    def __init__(self, snapshot: MetadataSnapshot) -> None:
        self.revision = snapshot.revision
        self.streams: Mapping[str, StreamRecord] = snapshot.streams
        self.partitions: Mapping[PartitionKey, PartitionRecord] = snapshot.partitions
        self.brokers: Mapping[str, BrokerRecord] = snapshot.brokers
        self.changed: tuple[set[PartitionKey], set[str], set[str]] | None = (set(), set(), set())


class MetadataMirror:
    """Follows ``keys.prefix`` in etcd and keeps the latest :class:`MetadataSnapshot`."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._snapshot = MetadataSnapshot()
        self._head = _Head(self._snapshot)
        self._listeners: list[Listener] = []
        self._changed = asyncio.Condition()
        self._pending = asyncio.Event()  # the head has changes not published yet
        self._publisher: asyncio.Task[None] | None = None
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
        """Call ``listener(old, new)`` after every published change, in order, one at a time."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Load the prefix and start following it."""
        self._publisher = asyncio.create_task(self._publish_loop(), name="metadata-mirror-publish")
        try:
            await self._follower.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self._follower.stop()
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
            self._publisher = None

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

    async def with_registrations(self, timeout: float) -> MetadataSnapshot:
        """The snapshot once it shows every broker registration etcd holds now (:class:`UnavailableError` after
        ``timeout``): for a decision that needs the live brokers (placing replicas, checking a reassignment's).

        The snapshot lags etcd by the watch's delivery and by its listeners (a partition manager opening logs on
        a slow disk): a broker registered a moment before, already known to the client that asks, would be
        missing ("replicationFactor 3 needs 3 brokers but 1 is alive" right after a cluster started). One read
        of the registration keys (keys only) names the newest revision that wrote one, and the mirror applies
        changes in etcd's order, so a snapshot at that revision or later has them all. Not etcd's current
        revision: writes outside the prefix raise it, and the snapshot never would."""
        found = await self._client.get_prefix(self._keys.brokers.encode(), keys_only=True)
        newest = max((int(kv.mod_revision) for kv in found), default=0)
        if self._snapshot.revision >= newest:
            return self._snapshot
        try:
            return await self.wait_for(lambda s: s.revision >= newest, timeout)
        except TimeoutError:
            raise UnavailableError(
                f"this broker's metadata did not catch up with the broker registrations in etcd (revision {newest}) "
                f"within {timeout:.0f}s; try again"
            ) from None

    async def _load(self, result: Any, again: bool) -> None:
        """Take a whole read of the prefix as the new state (at start, and when the watch's history is gone); the
        first is published here, before the watch starts, a later one by the publishing task."""
        streams: _Edit[str, StreamRecord] = _Edit({})
        partitions: _Edit[PartitionKey, PartitionRecord] = _Edit({})
        brokers: _Edit[str, BrokerRecord] = _Edit({})
        self._hidden = {}
        for kv in sorted(result, key=lambda kv: not kv.key.startswith(self._keys.streams.encode())):
            self._apply_kv(streams, partitions, brokers, kv.key, kv.value)  # streams first: their partitions show
        head = self._head
        head.revision = int(result.header.revision)
        head.streams, head.partitions, head.brokers = streams.result(), partitions.result(), brokers.result()
        head.changed = None
        if again:
            self._pending.set()
        else:
            await self._publish_head()

    async def _apply(self, event: Any) -> None:
        """Apply one watch event to the head; the publishing task publishes it."""
        if event.kv.key.startswith(self._remote):
            return  # tiered storage's segment lists: followed by the tier catalog, never part of a snapshot
        if self._held_back(event):
            return  # a partition of a stream not (or no longer) in the snapshot: nothing anyone sees changed
        head = self._head
        streams, partitions, brokers = _Edit(head.streams), _Edit(head.partitions), _Edit(head.brokers)
        if event.kind == "DELETE":
            self._delete_kv(streams, partitions, brokers, event.kv.key)
        else:
            self._apply_kv(streams, partitions, brokers, event.kv.key, event.kv.value)
        head.revision = int(event.kv.mod_revision)
        head.streams, head.partitions, head.brokers = streams.result(), partitions.result(), brokers.result()
        if head.changed is not None:
            head.changed[0].update(partitions.changes)
            head.changed[1].update(streams.changes)
            head.changed[2].update(brokers.changes)
        self._pending.set()

    def _held_back(self, event: Any) -> bool:
        """Apply ``event`` to the held-back partitions if it is about one of a stream the snapshot does not have
        (True), without touching the snapshot: a stream of 10,000 partitions is 10,000 events."""
        text = event.kv.key.decode()
        if not text.startswith(self._keys.partitions):
            return False
        stream, _, pid = text[len(self._keys.partitions) :].rpartition("/")
        record = self._head.streams.get(stream)
        if record is not None and int(pid) < record.partitions:
            return False
        if event.kind == "DELETE":
            held = self._hidden.get(stream)
            if held is not None:
                held.pop(int(pid), None)
                if not held:
                    del self._hidden[stream]
        else:
            self._apply_kv(_Edit({}), _Edit({}), _Edit({}), event.kv.key, event.kv.value)
        return True

    async def _publish_loop(self) -> None:
        """Publish the head whenever it has changes, one snapshot at a time (those applied meanwhile together)."""
        while True:
            await self._pending.wait()
            self._pending.clear()
            try:
                await self._publish_head()
            except Exception:  # never: _publish guards the listeners; but the mirror must go on publishing
                log.exception("metadata mirror: publishing revision %d failed", self._head.revision)

    async def _publish_head(self) -> None:
        head = self._head
        changed, head.changed = head.changed, (set(), set(), set())
        change = None
        if changed is not None:
            change = SnapshotChange(frozenset(changed[0]), frozenset(changed[1]), frozenset(changed[2]))
        if change is not None and not change and head.revision == self._snapshot.revision:
            return
        await self._publish(MetadataSnapshot(head.revision, head.streams, head.partitions, head.brokers, change))

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
        self,
        streams: _Edit[str, StreamRecord],
        partitions: _Edit[PartitionKey, PartitionRecord],
        brokers: _Edit[str, BrokerRecord],
        key: bytes,
        value: bytes,
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
        self,
        streams: _Edit[str, StreamRecord],
        partitions: _Edit[PartitionKey, PartitionRecord],
        brokers: _Edit[str, BrokerRecord],
        key: bytes,
    ) -> None:
        """Apply a delete (a stream's partitions are held back until their own deletes arrive)."""
        text = key.decode()
        if text.startswith(self._keys.streams):
            name = text[len(self._keys.streams) :]
            record = streams.pop(name)
            for pid in range(record.partitions if record is not None else 0):  # shown: below the record's count
                p = partitions.pop((name, pid))
                if p is not None:  # held back until their own deletes arrive
                    self._hidden.setdefault(name, {})[pid] = p
        elif text.startswith(self._keys.partitions):
            stream, _, number = text[len(self._keys.partitions) :].rpartition("/")
            partitions.pop((stream, int(number)))
        elif text.startswith(self._keys.brokers):
            brokers.pop(text[len(self._keys.brokers) :])
