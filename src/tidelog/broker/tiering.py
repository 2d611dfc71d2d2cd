"""Tiered storage on a broker: offload sealed segments, then keep only what local retention asks for.

One task per broker (:class:`Tiering`), not one per partition: each pass walks the replicas this broker holds and
does, for each partition of a tiered stream (:func:`tier_policy`),

1. **offload** (leaders only): every sealed segment that lies wholly below the high watermark and reaches past
   the end of the partition's remote segment list is read, checked batch by batch, described
   (:func:`~tidelog.storage.remote_segment.describe_segment`) and uploaded create-only under its content-derived
   name, the segment object first and its manifest second; then it is appended to the list in etcd by a write
   fenced by this broker's leadership (:mod:`tidelog.metadata.remote_segments`). A new leader resumes from the
   list: an object already there under the same name is the same bytes and is adopted, not written again; a write
   refused because leadership moved writes nothing. Replicas roll their segments on their own, so a new leader's
   segment may begin below the end of the list: it is uploaded from that end on (a batch boundary on every
   replica), and the list stays contiguous, each offset in exactly one listed object.
2. **total retention in the store** (leaders only): the stream's ``retention_*`` limits, applied to the remote
   segments followed by the local ones not yet offloaded. Segments retention drops leave the list first, then the
   store (an object left behind by a failure there is an orphan no reader plans from).
3. **local retention** (leaders and followers): ``local_retention_ms`` / ``local_retention_bytes`` delete local
   segments, but only those that end at or below the end of the list: nothing is deleted locally before its upload
   is recorded. The broker's cleaner applies the stream's total retention to local segments with the same cap
   (:meth:`Tiering.retention_cap`).
4. **deleted streams** (the controller only): the objects of a deleted stream's partitions go, then their lists.

Orphans: an object in the store that the list does not name (an upload that a leader could not record before it
failed or was deposed) is never read. A new leadership sweeps them first (:meth:`Tiering.sweep_orphans`): those
that begin below the end of the list can never be adopted, and are deleted.

Failures (the store unreachable or slow, etcd refusing): the partition is retried with exponential backoff
(:data:`BACKOFF_MIN` doubling to :data:`BACKOFF_MAX`), nothing is deleted locally meanwhile (the list does not move)
and the broker serves as before. Compacted streams do not tier: a stream that asks for both is refused when it is
created (:func:`tidelog.broker.streams.validate_config`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidelog.broker.config import BrokerConfig
from tidelog.broker.manager import PartitionManager
from tidelog.broker.partitions.cleaner import Cleanable
from tidelog.broker.partitions.committed_reads import CommittedReads
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.tier_catalog import TierCatalog
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.records import StreamRecord
from tidelog.metadata.remote_segments import ListedSegments, RemoteSegmentList, RemoteSegmentLists
from tidelog.protocol.records import iter_batches
from tidelog.storage.log import Log
from tidelog.storage.remote_read import RemoteReader
from tidelog.storage.remote_segment import (
    RemoteSegment,
    SegmentUploadError,
    describe_segment,
    encode_manifest,
    partition_prefix,
)
from tidelog.storage.retention import deletable_prefix
from tidelog.storage.segment_state import SegmentInfo
from tidelog.storage.tiered_store import (
    StoreSettings,
    TieredStore,
    TieredStoreConfigError,
    TieredStoreError,
    open_store,
)

log = logging.getLogger(__name__)

BACKOFF_MIN = 0.5
"""Seconds before a partition whose pass failed is tried again; doubled per failure up to :data:`BACKOFF_MAX`."""
BACKOFF_MAX = 60.0


async def open_tiered_store(cfg: BrokerConfig) -> TieredStore | None:
    """The tiered store, or None when none is configured; :class:`~tidelog.storage.tiered_store.TieredStoreConfigError`
    (one line) when it refuses this broker (credentials, bucket). One that does not answer is an outage: logged."""
    if not cfg.tiered_store:
        return None
    store = open_store(
        StoreSettings(
            cfg.tiered_store,
            endpoint=cfg.tiered_store_endpoint,
            region=cfg.tiered_store_region,
            access_key_id=cfg.tiered_store_access_key_id,
            secret_access_key=cfg.tiered_store_secret_access_key,
            timeout_ms=cfg.tiered_store_timeout_ms,
        )
    )
    try:
        await store.check()
    except TieredStoreConfigError:
        raise
    except TieredStoreError as exc:  # an outage, not a mistake: serve, and offload once it answers
        log.warning("%s; starting anyway: segments stay local until it answers", exc)
    return store


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """How a tiered stream's partitions keep data locally (None: no limit of that kind)."""

    local_retention_ms: int | None
    local_retention_bytes: int | None


def tier_policy(config: BrokerConfig, stream: StreamRecord) -> TierPolicy | None:
    """The stream's tiering, or None when it does not tier (no store configured, compacted, or turned off)."""
    if not config.tiered_store:
        return None
    o = stream.config
    compacted = bool(config.compact_enabled if o.compact_enabled is None else o.compact_enabled)
    if compacted or o.tiered is False:
        return None
    ms = config.local_retention_ms if o.local_retention_ms is None else o.local_retention_ms
    size = config.local_retention_bytes if o.local_retention_bytes is None else o.local_retention_bytes
    return TierPolicy(ms or None, size or None)


@dataclass(slots=True)
class _Backoff:
    failures: int = 0
    retry_at_ns: int = 0


class UploadConflict(Exception):
    """The list changed under an upload's write (leadership moved, or another write landed): read it again."""


class Tiering:
    """The broker's one offload and local-retention task."""

    def __init__(
        self,
        broker_id: str,
        config: BrokerConfig,
        manager: PartitionManager,
        catalog: TierCatalog,
        lists: RemoteSegmentLists,
        *,
        interval: float,
        clock: Clock | None = None,
        janitor: Callable[[], bool] = lambda: True,
    ) -> None:
        """``janitor``: whether this broker removes what deleted streams left in the store (the controller)."""
        self._janitor = janitor
        self._broker_id = broker_id
        self._config = config
        self._manager = manager
        self._catalog = catalog
        self._lists = lists
        self._interval = interval
        self._clock = clock or SystemClock()
        self._task: asyncio.Task[None] | None = None
        self._backoff: dict[tuple[str, int], _Backoff] = {}
        self._doomed: list[str] = []  # objects retention took out of a list, not deleted yet (the store failed)
        self._swept: dict[tuple[str, int], int] = {}  # the leader epoch whose orphans were swept, per partition
        self._passes = 0
        self._passed = asyncio.Condition()
        self.uploaded = 0  # segments uploaded (adopted ones included), for metrics and tests
        self.adopted = 0  # uploads that found their object already in the store
        self.uploaded_bytes = 0
        self.failures = 0  # partition passes that failed (and backed off)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="tiering")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self._interval)
            await self.run_once()
            async with self._passed:
                self._passes += 1
                self._passed.notify_all()

    async def wait_for_passes(self, count: int) -> None:
        """Wait until the background loop has completed ``count`` more passes (for tests and tools)."""
        async with self._passed:
            target = self._passes + count
            await self._passed.wait_for(lambda: self._passes >= target)

    def policy(self, stream: StreamRecord) -> TierPolicy | None:
        return tier_policy(self._config, stream)

    def retention_cap(self, replica: Cleanable) -> int | None:
        """The highest offset the cleaner's total retention may delete locally up to: the end of the remote list
        for a tiered partition (its local start while nothing is uploaded); None for others."""
        if not isinstance(replica, CommittedReads) or self.policy(replica.stream) is None:
            return None
        end = self._catalog.remote_end(replica.stream.name, replica.record.id)
        return replica.log.start_offset if end is None else end

    async def run_once(self) -> None:
        """One pass over every replica of a tiered stream (see the module docstring)."""
        now = self._clock.monotonic_ns()
        for replica in self._manager.replicas():
            policy = self.policy(replica.stream)
            if policy is None or replica.log.closed:
                continue
            key = (replica.stream.name, replica.record.id)
            backoff = self._backoff.get(key)
            if backoff is not None and now < backoff.retry_at_ns:
                continue
            try:
                if isinstance(replica, Partition) and replica.record.leader == self._broker_id:
                    await self._offload(replica)
                await self._retain_locally(replica, policy)
            except UploadConflict as exc:
                log.info("tiering %s: %s; trying again next pass", replica.name, exc)
            except Exception as exc:  # the store or etcd failed: back off, delete nothing, keep serving
                self.failures += 1
                state = self._backoff.setdefault(key, _Backoff())
                delay = min(BACKOFF_MIN * 2**state.failures, BACKOFF_MAX)
                state.failures += 1
                state.retry_at_ns = now + int(delay * 1e9)
                level = logging.WARNING if state.failures == 1 else logging.DEBUG
                log.log(level, "tiering %s failed (%s); retrying in %.1fs", replica.name, exc, delay)
            else:
                self._backoff.pop(key, None)
        if self._doomed:
            try:
                await self._delete_doomed()
            except Exception as exc:
                log.debug("tiering: deleting %d object(s) retention removed failed: %s", len(self._doomed), exc)
        if self._janitor():
            await self._remove_orphans()

    async def _remove_orphans(self) -> None:
        """Delete the objects and then the list of every partition whose stream was deleted (4. in the module
        docstring); a failure leaves the rest for the next pass."""
        for stream, pid in self._catalog.orphans():
            try:
                listed = await self._lists.read(stream, pid)
                if listed.stream_created_ns is not None:
                    continue  # etcd has the stream (the mirror lagged, or it was created again: its leader decides)
                for segment in listed.segments.segments:
                    await self._catalog.store.delete(segment.manifest_name)
                    await self._catalog.store.delete(segment.log_name)
                if await self._lists.delete(stream, pid, listed):
                    self._catalog.forget(stream, pid)
                    log.info(
                        "tiering: removed %d segment(s) of deleted stream %s/%d",
                        len(listed.segments.segments),
                        stream,
                        pid,
                    )
            except Exception as exc:
                log.warning(
                    "tiering: removing what deleted stream %s/%d left in the store failed: %s", stream, pid, exc
                )
                return

    @property
    def reader(self) -> RemoteReader:
        """The broker's one reader of the store (its counters feed the metrics)."""
        return self._catalog.reader

    def upload_backlog(self, partition: Partition) -> tuple[int, float]:
        """How far the upload frontier lags (for the metrics): the offsets in sealed segments below the high
        watermark not in the store yet, and the age in seconds of the newest record of the oldest such segment
        (0 when none waits)."""
        remote_end = self._catalog.remote_end(partition.stream.name, partition.record.id)
        pending = self._pending(partition, remote_end)
        if not pending:
            return 0, 0.0
        floor = remote_end or 0
        records = sum(s.next_offset - max(s.base_offset, floor) for s in pending)
        newest = pending[0].max_timestamp
        age = 0.0 if newest is None else max(0, self._clock.now_ns() - newest) / 1e9
        return records, age

    # -- offload ----------------------------------------------------------------------------------------------

    def _pending(self, partition: Partition, remote_end: int | None) -> list[SegmentInfo]:
        hw = partition.high_watermark
        sealed = partition.log.segments[:-1]
        return [
            s for s in sealed if s.next_offset <= hw and s.size and (remote_end is None or s.next_offset > remote_end)
        ]

    async def _offload(self, partition: Partition) -> None:
        stream, pid = partition.stream.name, partition.record.id
        if self._swept.get((stream, pid)) != partition.record.leader_epoch:
            await self.sweep_orphans(partition)
            self._swept[(stream, pid)] = partition.record.leader_epoch
        if not self._pending(partition, self._catalog.remote_end(stream, pid)):
            await self._retain_remotely(partition)
            return
        listed = await self._listed(partition)
        for info in self._pending(partition, listed.segments.end_offset):
            segment = await self._upload(partition, info, listed.segments.end_offset)
            if segment is None:
                continue  # deleted meanwhile
            new = RemoteSegmentList(
                (*listed.segments.segments, segment.without_index()), partition.stream.created_ns, segment.end_offset
            )
            if not await self._lists.write(stream, pid, listed, new):
                raise UploadConflict("the remote segment list or the leadership changed")
            self._catalog.learn(stream, pid, new)
            log.info(
                "tiering %s: offloaded offsets %d..%d", partition.name, segment.base_offset, segment.end_offset - 1
            )
            listed = await self._listed(partition)
        await self._retain_remotely(partition)

    async def sweep_orphans(self, partition: Partition) -> int:
        """Delete the partition's objects that the list does not name and never will: those beginning below its
        end (the next upload starts there, so none of them can be adopted). They are uploads a leader made and
        could not record (it failed or lost the leadership first), or segments retention dropped from the list
        whose deletion did not happen. Run once per leadership, before its first upload; returns how many
        objects went."""
        listed = await self._listed(partition)
        end = listed.segments.end_offset
        if end is None:
            return 0  # nothing recorded yet: any object there may still be adopted
        known = {segment.stem for segment in listed.segments.segments}
        store = self._catalog.store
        prefix = partition_prefix(self._config.namespace, partition.stream.name, partition.record.id)
        removed = 0
        for name in await store.list_names(prefix):
            stem, _, kind = name.rpartition(".")
            base = stem.rpartition("/")[2][:20]
            if kind in ("log", "manifest") and stem not in known and base.isdigit() and int(base) < end:
                await store.delete(name)
                removed += 1
        if removed:
            log.info("tiering %s: removed %d object(s) no segment list names", partition.name, removed)
        return removed

    async def _listed(self, partition: Partition) -> ListedSegments:
        stream, pid = partition.stream.name, partition.record.id
        listed = await self._lists.read(stream, pid)
        if listed.leader != self._broker_id or listed.leader_epoch != partition.record.leader_epoch:
            raise UploadConflict(f"etcd names {listed.leader or 'no broker'} at epoch {listed.leader_epoch} leader")
        created = partition.stream.created_ns
        if listed.segments.stream_created_ns != created and listed.segments.segments:
            await self._forget_stale(partition, listed)
            listed = await self._lists.read(stream, pid)
        self._catalog.learn(stream, pid, listed.segments)
        return listed

    async def _forget_stale(self, partition: Partition, listed: ListedSegments) -> None:
        """A list left by a deleted stream of the same name: its objects go first (before an upload of this stream
        could adopt one of the same name), then the list is replaced by this stream's empty one."""
        for segment in listed.segments.segments:
            await self._catalog.store.delete(segment.manifest_name)
            await self._catalog.store.delete(segment.log_name)
        stream, pid, created = partition.stream.name, partition.record.id, partition.stream.created_ns
        if not await self._lists.write(stream, pid, listed, RemoteSegmentList((), created)):
            raise UploadConflict("the remote segment list or the leadership changed")
        log.info(
            "tiering %s: removed %d segment(s) of an earlier stream of this name",
            partition.name,
            len(listed.segments.segments),
        )

    async def _upload(self, partition: Partition, info: SegmentInfo, remote_end: int | None) -> RemoteSegment | None:
        """Upload the sealed segment ``info`` from ``remote_end`` on (a new leader's segment may begin below it)."""
        got = partition.log.sealed_segment_range(info.base_offset, 0, info.size)
        if got is None:
            return None
        file, size = got
        prefix = partition_prefix(self._config.namespace, partition.stream.name, partition.record.id)
        epochs = partition.log.epoch_entries

        def read() -> tuple[memoryview, RemoteSegment]:
            try:
                data = _read_all(file.fd, size)
            finally:
                file.close()
            base = info.base_offset
            if remote_end is not None and base < remote_end:
                data, base = _from_offset(data, remote_end), remote_end
            return data, describe_segment(prefix, data, base, epochs)

        try:
            data, segment = await asyncio.to_thread(read)
        except SegmentUploadError as exc:
            raise TieredStoreError(f"{partition.name}: {exc}") from None
        store = self._catalog.store
        if not await store.put_new(segment.log_name, data):
            existing = await store.size_of(segment.log_name)
            if existing != segment.size:
                raise TieredStoreError(
                    f"{store.description}: {segment.log_name} exists with {existing} bytes, not {segment.size}"
                )
            self.adopted += 1
        await store.put_new(segment.manifest_name, encode_manifest(segment))  # taken: the same manifest, by name
        self.uploaded += 1
        self.uploaded_bytes += segment.size
        return segment

    # -- retention --------------------------------------------------------------------------------------------

    async def _retain_remotely(self, partition: Partition) -> None:
        """Total retention over the remote segments followed by the local ones not offloaded yet."""
        stream, pid = partition.stream.name, partition.record.id
        remote = self._catalog.list_of(stream, pid).segments
        config = partition.log.config
        if not remote or not (
            config.retention_max_age_ms or config.retention_max_bytes or config.retention_max_messages
        ):
            return
        end = remote[-1].end_offset
        spans = [_as_info(s) for s in remote] + [s for s in partition.log.segments if s.base_offset >= end]
        count = deletable_prefix(
            spans, config, self._clock.now_ns(), partition.log.end_offset, max_offset=partition.high_watermark
        )
        drop = min(count, len(remote))
        if not drop:
            return
        listed = await self._listed(partition)
        current = listed.segments.segments
        gone = [s for s in current if s.end_offset <= remote[drop - 1].end_offset]
        keep = current[len(gone) :]
        created = partition.stream.created_ns
        new = RemoteSegmentList(keep, created, listed.segments.end_offset or 0)
        if not await self._lists.write(stream, pid, listed, new):
            raise UploadConflict("the remote segment list or the leadership changed")
        self._catalog.learn(stream, pid, new)
        for segment in gone:
            self._doomed.extend((segment.manifest_name, segment.log_name))
        log.info("tiering %s: retention removed %d remote segment(s)", partition.name, len(gone))
        await self._delete_doomed()

    async def _delete_doomed(self) -> None:
        """Delete the objects retention took out of the lists; what the store refuses now is tried next pass (a
        broker that stops first leaves them as orphans no reader plans from)."""
        while self._doomed:
            await self._catalog.store.delete(self._doomed[0])
            self._doomed.pop(0)

    async def _retain_locally(self, replica: CommittedReads, policy: TierPolicy) -> None:
        if policy.local_retention_ms is None and policy.local_retention_bytes is None:
            return
        remote_end = self._catalog.remote_end(replica.stream.name, replica.record.id)
        if remote_end is None:
            return
        log_: Log = replica.log
        local = dataclasses.replace(
            log_.config,
            retention_max_age_ms=policy.local_retention_ms,
            retention_max_bytes=policy.local_retention_bytes,
            retention_max_messages=None,
        )
        segments = log_.segments
        cap = min(replica.high_watermark, remote_end)
        count = deletable_prefix(segments, local, self._clock.now_ns(), log_.end_offset, max_offset=cap)
        if count:
            deleted = await log_.delete_segments_before(segments[count].base_offset)
            if deleted:
                log.info("tiering %s: %d offloaded segment(s) deleted locally", replica.name, len(deleted))


def _as_info(segment: RemoteSegment) -> SegmentInfo:
    timestamp = None if segment.max_timestamp < 0 else segment.max_timestamp
    return SegmentInfo(segment.base_offset, segment.end_offset, segment.size, timestamp, Path(segment.log_name), False)


def _from_offset(data: memoryview, offset: int) -> memoryview:
    """The batches of a segment's bytes from the one at ``offset`` on (a view: not copied). Replicas hold the
    same batches, so the end of the list (a batch boundary of the leader that uploaded it) is a batch boundary
    here too."""
    for position, header in iter_batches(data, verify=False):
        if header.base_offset >= offset:
            if header.base_offset != offset:
                raise TieredStoreError(f"no batch starts at offset {offset}, the end of the remote segment list")
            return data[position:]
    return data[len(data) :]


def _read_all(fd: int, size: int) -> memoryview:
    """The first ``size`` bytes of the file (a sealed segment does not change), read straight into one buffer:
    the segment is in memory once, not in pieces and then joined. Blocking."""
    buffer = memoryview(bytearray(size))
    position = 0
    while position < size:
        got = os.preadv(fd, [buffer[position : position + 8 * 1024 * 1024]], position)
        if not got:
            raise TieredStoreError(f"segment file ended at byte {position} of {size}")
        position += got
    return buffer
