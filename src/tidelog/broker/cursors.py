"""Cursors: a consumer's position in a partition, stored durably under an id (Liftbridge's ``SetCursor`` and
``FetchCursor``; committed offsets of consumer groups are cursors too).

A cursor is one keyed record in the internal compacted stream ``__cursors``
(:mod:`tidelog.broker.cursor_stream` creates it). Its key is Liftbridge's ``cursorId,stream,partition`` and it
lives in partition ``crc32(key) % partitions`` of ``__cursors`` (:mod:`tidelog.protocol.cursors`), so
Liftbridge clients that compute the partition themselves send the request to the right broker. Only the leader
of that partition answers; any other broker answers NOT_LEADER (gRPC ``FAILED_PRECONDITION``, as Liftbridge
does): it never forwards, because the answer must come from the one broker whose log orders the writes.

**Writes** are acks ``ALL``: :meth:`CursorStore.set` returns once the record is committed to the ISR of its
``__cursors`` partition (and, under the default flush policy, fsynced on each of them). Writes that arrive while
one is being written share the next append (:mod:`tidelog.broker.cursor_writes`). Compaction keeps the newest
record per key.

**Reads** come from a cache on the leader: every cursor of a ``__cursors`` partition, key → (offset of its
record in ``__cursors``, cursor offset). The cache belongs to one leadership (one
:class:`~tidelog.broker.partition.Partition` object). When this broker becomes the partition's leader (after a
failover, or when leadership comes back to it) the cache is rebuilt by reading the partition from its log start,
after waiting until everything this leader holds is committed: it never serves a position that a failover could
still take back, nor misses one its predecessor committed. The read starts as soon as the metadata makes this
broker the leader (:meth:`CursorStore.on_metadata`), so it is usually done before the first request arrives;
requests wait for it. A write updates the cache only when its record is newer than the cached one (writes to one
key need no lock to stay ordered); a write that fails after reaching the log (a timeout) drops the cache, so the
next read rebuilds it from what the log holds.

**Fenced commits** (a consumer group member's, :mod:`tidelog.broker.groups.fencing`): :meth:`CursorStore.set`
runs the member's check just before the write is issued, and the write counts as under way on its cursor from that
moment; :meth:`CursorStore.fetch` answers only once the writes under way when it arrived are done. A member taking a
partition over therefore reads an offset no older than any commit that passed the check.

**Deleting** (a consumer group's committed offsets, ``tidelog group delete``):
:meth:`CursorStore.delete_cursors_of` writes a tombstone (the key with no value) for every cursor of one id that
one ``__cursors`` partition holds, acks ALL, in one append ordered with the commits around it
(:meth:`CursorWrites.write_all <tidelog.broker.cursor_writes.CursorWrites.write_all>`); the cache and a rebuild
take a tombstone as "never set" (-1), and compaction drops it once it is older than the stream's
``delete_retention``. :meth:`CursorStore.cursors_of` lists what a partition holds of one id. Both work per
``__cursors`` partition, on its leader: a cursor's partition follows from its whole key, so a client asks each.

**Pausing**: ``__cursors`` partitions auto-pause when idle, as Liftbridge's do (:mod:`tidelog.broker.pausing`);
every request resumes the partition it needs first (``resume``), and the cache is read again from the log.

**Input** is checked before anything else, on any broker: a cursor id of 1 to :data:`MAX_CURSOR_ID_BYTES`
UTF-8 bytes, an existing stream and partition, an offset of -1 (nothing consumed) or more. Each failure is its
precise error (INVALID_ARGUMENT, UNKNOWN_STREAM, UNKNOWN_PARTITION) and nothing is stored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from tidelog.broker.cursor_writes import MAX_BATCH_RECORDS, CursorLeader, CursorWrites
from tidelog.broker.manager import PartitionManager
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.cursors import CURSORS_STREAM, MAX_CURSOR_ID_BYTES, cursor_key, cursors_partition
from tidelog.protocol.errors import (
    InvalidArgumentError,
    NotLeaderError,
    UnavailableError,
    UnknownPartitionError,
    UnknownStreamError,
    UnsupportedError,
)
from tidelog.protocol.records import decode_records, iter_batches

log = logging.getLogger(__name__)

_READ_BYTES = 1024 * 1024  # what one read of a rebuild takes from the log
_WARM_TIMEOUT = 30.0  # seconds a rebuild started on a leader change waits for the partition's tail to commit


class CursorValue(msgspec.Struct, frozen=True, array_like=True):
    """The value of a cursor's record (msgpack): what the key says, and the offset."""

    stream: str
    partition: int
    cursor_id: str
    offset: int


_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE = msgspec.msgpack.Decoder(CursorValue).decode


@dataclass(eq=False, slots=True)
class _Positions:
    """The cursors of one ``__cursors`` partition, for one leadership of it."""

    partition: Partition
    # key -> (record offset, cursor offset; None: deleted, a tombstone)
    by_key: dict[bytes, tuple[int, int | None]] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, key: bytes, record_offset: int, offset: int | None) -> None:
        known = self.by_key.get(key)
        if known is None or known[0] < record_offset:
            self.by_key[key] = (record_offset, offset)


class CursorStore:
    """Stores and reads cursors on the leaders of ``__cursors`` partitions (see the module docstring)."""

    def __init__(
        self,
        broker_id: str,
        mirror: MetadataMirror,
        manager: PartitionManager,
        *,
        enabled: bool,
        resume: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        """``enabled``: whether this broker is configured with cursors (``cursors_stream_partitions`` > 0).
        ``resume(stream, partition)``: resumes a paused partition (:meth:`tidelog.broker.pausing.Pauses.resume`)."""
        self._resume = resume
        self._broker_id = broker_id
        self._mirror = mirror
        self._manager = manager
        self._enabled = enabled
        self._caches: dict[int, _Positions] = {}  # __cursors partition id -> its cache
        self._rebuilds: set[asyncio.Task[None]] = set()
        self._writes = CursorWrites(self._drop)  # every cursor record stored, grouped per __cursors partition

    # ---- the two operations ----

    async def set(
        self,
        stream: str,
        partition: int,
        cursor_id: str,
        offset: int,
        timeout: float,
        *,
        fence: Callable[[], None] | None = None,
    ) -> None:
        """Store ``offset`` as the cursor's position; returns once it is committed (acks ALL).

        ``fence`` (a group member's commit) runs just before the write is issued and refuses it by raising; the
        write counts as under way on the cursor from that same moment (no await between), for :meth:`fetch`.
        Concurrent writes share one append (:mod:`tidelog.broker.cursor_writes`)."""
        key = self.check(stream, partition, cursor_id, offset)
        await self._awake_for(key)
        pid, leader = self._leader_for(key)
        value = _ENCODE(CursorValue(stream, partition, cursor_id, offset))
        record_offset = await self._writes.write(pid, leader, key, value, timeout, fence)
        cache = self._caches.get(pid)
        if cache is not None and cache.partition is leader:  # also while it is rebuilt: put keeps the newest
            cache.put(key, record_offset, offset)

    async def fetch(self, stream: str, partition: int, cursor_id: str, timeout: float) -> int:
        """The cursor's stored position; -1 for a cursor never set. Answered once the writes of the cursor under
        way when the request arrived are done (stored or failed): never older than a write that was accepted."""
        key = self.check(stream, partition, cursor_id)
        await self._awake_for(key)
        pid, leader = self._leader_for(key)
        under_way = self._writes.under_way(key)
        if under_way:
            await asyncio.wait(under_way, timeout=timeout)
        cache = await self._positions(pid, leader, timeout)
        known = cache.by_key.get(key)
        return -1 if known is None or known[1] is None else known[1]

    # ---- every cursor of one id in one __cursors partition: listed, deleted ----

    async def cursors_of(self, cursor_id: str, pid: int, timeout: float) -> list[tuple[str, int, int]]:
        """``(stream, partition, offset)`` of every cursor of ``cursor_id`` in ``__cursors`` partition ``pid``."""
        await self._awake(pid)
        leader = self._leader_of(pid)
        cache = await self._positions(pid, leader, timeout)
        return sorted((*where, offset) for key, (_, offset) in cache.by_key.items()
                      if offset is not None and (where := _parse_key(key, cursor_id)) is not None)  # fmt: skip

    async def delete_cursors_of(self, cursor_id: str, pid: int, timeout: float) -> int:
        """Write a tombstone for every cursor of ``cursor_id`` in ``__cursors`` partition ``pid`` (acks ALL);
        how many there were."""
        await self._awake(pid)
        leader = self._leader_of(pid)
        cache = await self._positions(pid, leader, timeout)
        keys = sorted(key for key, (_, offset) in cache.by_key.items()
                      if offset is not None and _parse_key(key, cursor_id) is not None)  # fmt: skip
        if not keys:
            return 0
        offsets = []
        for start in range(0, len(keys), MAX_BATCH_RECORDS):  # in order with the commits (cursor_writes)
            offsets += await self._writes.write_all(pid, leader, keys[start : start + MAX_BATCH_RECORDS], timeout)
        if self._caches.get(pid) is cache:
            for key, record_offset in zip(keys, offsets, strict=True):
                cache.put(key, record_offset, None)
        return len(keys)

    async def on_metadata(self, _old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        """A mirror listener, run after the partition manager acted on a change: start reading the cursors of each
        ``__cursors`` partition this broker has come to lead (the first request after a failover then finds them
        read, or the read under way), and forget those of partitions it no longer leads."""
        if not self._enabled:
            return
        for pid, cache in list(self._caches.items()):
            if self._manager.local(CURSORS_STREAM, pid) is not cache.partition:
                del self._caches[pid]
        for record in new.partitions_of(CURSORS_STREAM):
            leader = self._manager.local(CURSORS_STREAM, record.id) if record.leader == self._broker_id else None
            if leader is not None:
                self._start(record.id, leader, _WARM_TIMEOUT)

    async def close(self) -> None:
        """Stop any rebuild still running (the broker is stopping)."""
        for task in list(self._rebuilds):
            task.cancel()
        await asyncio.gather(*self._rebuilds, return_exceptions=True)
        await self._writes.close()
        self._caches.clear()

    # ---- input ----

    def check(self, stream: str, partition: int, cursor_id: str, offset: int | None = None) -> bytes:
        """Validate a request (see the module docstring) and return the cursor's key."""
        if not cursor_id:
            raise InvalidArgumentError(f"cursor id is empty: give 1 to {MAX_CURSOR_ID_BYTES} bytes of UTF-8")
        size = len(cursor_id.encode())
        if size > MAX_CURSOR_ID_BYTES:
            raise InvalidArgumentError(f"cursor id is {size} bytes long: at most {MAX_CURSOR_ID_BYTES} are allowed")
        if offset is not None and offset < -1:
            raise InvalidArgumentError(f"cursor offset {offset} is below -1: give -1 (nothing consumed) or more")
        if not stream:
            raise InvalidArgumentError("no stream given for the cursor")
        record = self._mirror.snapshot.stream(stream)
        if record is None:
            raise UnknownStreamError(f"no stream named {stream!r}")
        if not 0 <= partition < record.partitions:
            raise UnknownPartitionError(f"stream {stream!r} has partitions 0..{record.partitions - 1}, not {partition}")
        return cursor_key(cursor_id, stream, partition)

    # ---- where a cursor lives ----

    async def _awake(self, pid: int) -> None:
        """Resume ``__cursors`` partition ``pid`` when it is paused (auto-paused while idle)."""
        record = self._mirror.snapshot.partition(CURSORS_STREAM, pid)
        if self._resume is not None and record is not None and record.paused:
            await self._resume(CURSORS_STREAM, pid)

    async def _awake_for(self, key: bytes) -> None:
        stream = self._mirror.snapshot.stream(CURSORS_STREAM)
        if self._enabled and stream is not None:
            await self._awake(cursors_partition(key, stream.partitions))

    def _leader_of(self, pid: int) -> Partition:
        """This broker's leader of ``__cursors`` partition ``pid``; the precise error otherwise."""
        if not self._enabled:
            raise UnsupportedError("cursors are disabled on this broker (cursors_stream_partitions is 0)")
        stream = self._mirror.snapshot.stream(CURSORS_STREAM)
        if stream is None:
            raise UnavailableError(f"the {CURSORS_STREAM} stream is not created yet; retry shortly")
        if not 0 <= pid < stream.partitions:
            raise UnknownPartitionError(f"{CURSORS_STREAM} has partitions 0..{stream.partitions - 1}, not {pid}")
        leader = self._manager.local(CURSORS_STREAM, pid)
        if leader is None:
            raise NotLeaderError(f"broker {self._broker_id!r} is not the leader of {CURSORS_STREAM} partition {pid}")
        return leader

    def _leader_for(self, key: bytes) -> tuple[int, Partition]:
        """The ``__cursors`` partition of ``key`` and this broker's leader of it; the precise error otherwise."""
        if not self._enabled:
            raise UnsupportedError("cursors are disabled on this broker (cursors_stream_partitions is 0)")
        snap = self._mirror.snapshot
        stream = snap.stream(CURSORS_STREAM)
        if stream is None:
            raise UnavailableError(f"the {CURSORS_STREAM} stream is not created yet; retry shortly")
        pid = cursors_partition(key, stream.partitions)
        leader = self._manager.local(CURSORS_STREAM, pid)
        if leader is None:
            record = snap.partition(CURSORS_STREAM, pid)
            who = f"broker {record.leader!r}" if record is not None and record.leader else "no broker right now"
            raise NotLeaderError(
                f"broker {self._broker_id!r} is not the leader of {CURSORS_STREAM} partition {pid}, which holds "
                f"this cursor; its leader is {who}"
            )
        return pid, leader

    def cached(self) -> list[tuple[str, str, int, int]]:
        """Every cursor the caches of the ``__cursors`` partitions this broker leads hold, as (cursor id, stream,
        partition, offset): what the metrics export (a consumer group's committed offsets are cursors named after
        it). Caches still being read are left out; nothing is read from the log here."""
        found = []
        for cache in self._caches.values():
            if not cache.ready.is_set():
                continue
            for key, (_, offset) in cache.by_key.items():
                cursor_id, _, rest = key.decode(errors="replace").rpartition(",")
                cursor_id, _, stream = cursor_id.rpartition(",")
                if offset is not None and rest.isdigit():
                    found.append((cursor_id, stream, int(rest), offset))
        return found

    # ---- the cache ----

    def _drop(self, pid: int, leader: Partition | CursorLeader) -> None:
        cache = self._caches.get(pid)
        if cache is not None and cache.partition is leader:
            del self._caches[pid]

    async def _positions(self, pid: int, leader: Partition, timeout: float) -> _Positions:
        """The cache of ``pid`` for this leadership, rebuilt from the log when there is none yet."""
        cache = self._start(pid, leader, timeout)
        if not cache.ready.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await cache.ready.wait()
            except TimeoutError:
                raise UnavailableError(
                    f"the cursors of {CURSORS_STREAM} partition {pid} are still being read after a leader change; retry"
                ) from None
        return cache

    def _start(self, pid: int, leader: Partition, timeout: float) -> _Positions:
        """The cache of ``pid`` for this leadership; a new one, being read from the log, if there was none."""
        cache = self._caches.get(pid)
        if cache is None or cache.partition is not leader:
            cache = self._caches[pid] = _Positions(leader)
            task = asyncio.create_task(self._rebuild(pid, cache, timeout), name=f"cursors-rebuild-{pid}")
            self._rebuilds.add(task)
            task.add_done_callback(self._rebuilds.discard)
        return cache

    async def _rebuild(self, pid: int, cache: _Positions, timeout: float) -> None:
        """Fill ``cache`` from the partition's log; on failure forget it, so the next request tries again."""
        try:
            await self._read_log(cache, max(timeout, 5.0))
        except Exception as exc:
            log.warning("cannot read the cursors of %s partition %d: %s", CURSORS_STREAM, pid, exc)
            if self._caches.get(pid) is cache:
                del self._caches[pid]
            return
        cache.ready.set()
        log.info("%s partition %d: %d cursor(s) read from the log", CURSORS_STREAM, pid, len(cache.by_key))

    @staticmethod
    async def _read_log(cache: _Positions, timeout: float) -> None:
        partition = cache.partition
        end = partition.log_end
        if end > 0:
            await partition.wait_committed(end - 1, timeout)  # what this leader holds is committed first
        offset = partition.log_start
        while offset < end:
            data = partition.read_committed(offset, _READ_BYTES)
            if not data:
                break
            for pos, header in iter_batches(data):
                for record in decode_records(data, pos, header=header):
                    if record.offset < offset or record.key is None:
                        continue
                    if record.value is None:  # a tombstone: the cursor was deleted
                        cache.put(record.key, record.offset, None)
                        continue
                    try:
                        value = _DECODE(record.value)
                    except msgspec.DecodeError:
                        log.warning("%s: record %d is not a cursor; skipped", partition.name, record.offset)
                        continue
                    cache.put(record.key, record.offset, value.offset)
                offset = header.next_offset
            await asyncio.sleep(0)  # let requests run between chunks of a long partition


def _parse_key(key: bytes, cursor_id: str) -> tuple[str, int] | None:
    """``(stream, partition)`` of a cursor key of ``cursor_id`` (``cursorId,stream,partition``); None for a key of
    another id. Unambiguous although ids may hold commas: stream names cannot."""
    prefix = f"{cursor_id},".encode()
    if not key.startswith(prefix):
        return None
    stream, sep, partition = key[len(prefix) :].decode(errors="replace").partition(",")
    if not sep or "," in partition or not partition.isdigit():
        return None
    return stream, int(partition)
