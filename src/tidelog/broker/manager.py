"""The partition manager: makes what this broker runs match what the metadata says it should.

It listens to the :class:`~tidelog.metadata.mirror.MetadataMirror`. Every partition with this broker among its
replicas has its log open here, in one of two roles:

- **leader**: a :class:`~tidelog.broker.partitions.partition.Partition` (writes, the high watermark, the ISR) and NATS
  ingest (an ingest that fails to start is logged as an error and retried with backoff until it subscribes:
  :meth:`PartitionManager.ingesting` says whether it has);
- **follower**: a :class:`~tidelog.replication.follower.fetcher.ReplicaFetcher` pulling from the leader named in the
  metadata, restarted whenever the leader or its epoch changes (and idle while the partition has no live
  leader).

A role change keeps the log open: a promoted follower leads from the high watermark it learnt (nothing above
it was known committed), a deposed leader stops its ingest and writers before it fetches. The replica's
producer state (idempotent producers) is loaded with its log and handed on with it. A partition that
disappeared (its stream was deleted, or a reassignment moved it away: :mod:`tidelog.metadata.reassignment_plans`)
has its data deleted; a changed record (paused, read-only, ISR) goes to the leader. Requests never open or close
partitions: they change metadata and wait for the manager to act, so the on-disk state follows one source of
truth whatever protocol the change came through.

A **paused** partition (:mod:`tidelog.broker.pausing`) runs in neither role: its leader stops ingest and closes
its log, each follower stops fetching and closes its copy, so it holds no descriptor, subscription or memory,
and a starting broker does not open it. The manager remembers only where its data lives (deleting the stream
meanwhile still deletes it). Requests get PARTITION_PAUSED (:meth:`PartitionManager.leader_of`) until its
record says it is resumed, when it opens like a partition after a restart.

A log that start-up recovery finds damaged in the middle (intact batches after a bad one) is opened only where
:class:`~tidelog.broker.partitions.damaged.DamagedPartitions` allows the cut; otherwise the partition is not run
here, and its requests get CORRUPT_DATA naming the damage. A log whose disk failed a write or an fsync is handed
on (leader) and recovered (follower) by :class:`~tidelog.broker.partitions.failed_logs.FailedLogs`.

Partition data lives at ``<data_dir>/streams/<stream>@<created_ns>/<partition>``
(:mod:`~tidelog.broker.partitions.data_dirs`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tidelog.broker.encryption import KeyVault
from tidelog.broker.ingest.nats_ingest import NatsIngest
from tidelog.broker.ingest.runs import IngestRuns
from tidelog.broker.partitions.committed_reads import RemoteTier
from tidelog.broker.partitions.damage_repair import DamageRepairs
from tidelog.broker.partitions.damaged import DamagedPartitions
from tidelog.broker.partitions.data_dirs import (
    check_open_file_limit,
    delete_directory,
    partition_path,
    remove_orphans,
)
from tidelog.broker.partitions.failed_logs import FailedLogs
from tidelog.broker.partitions.followed import FollowedPartition
from tidelog.broker.partitions.maintenance import LeaderMaintenance
from tidelog.broker.partitions.partition import AlterIsr, Partition
from tidelog.broker.partitions.safety import ReportSuspension, apply_confirmed_head
from tidelog.broker.peers import Peers
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.namespace import DEFAULT_NAMESPACE
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey, changed_partitions
from tidelog.protocol.errors import NotLeaderError, PartitionPausedError, UnknownPartitionError, UnknownStreamError
from tidelog.protocol.tls import SslSource
from tidelog.replication.follower.fetcher import ReplicaFetcher
from tidelog.replication.follower.session import FetchSessions
from tidelog.replication.hw_checkpoint import checkpointed_hw
from tidelog.replication.idempotence.producer_state import DEFAULT_PRODUCER_EXPIRY_MS, ProducerStateTable
from tidelog.replication.idempotence.producer_sync import open_producer_state
from tidelog.storage.config import LogConfig
from tidelog.storage.flush import FlushShares
from tidelog.storage.log import Log
from tidelog.storage.open_files import OPEN_FILES
from tidelog.storage.recovery_damage import DamagedLogError

log = logging.getLogger(__name__)

LogConfigFactory = Callable[[StreamRecord], LogConfig]

RECONCILE_CONCURRENCY = 32
"""Partitions a reconcile brings in line at once (opening logs, starting leaders and their NATS ingest)."""

UnreachableHook = Callable[[str], Any]
"""Called with the id of a leader a follower could not connect to (a hint for the controller)."""


class PartitionManager:
    """Owns every partition this broker leads."""

    def __init__(
        self,
        broker_id: str,
        data_dir: Path,
        nc: Any,
        log_config_for: LogConfigFactory,
        *,
        ack_timeout: float,
        nats_urls: Sequence[str] = (),
        alter_isr: AlterIsr | None = None,
        report_suspension: ReportSuspension | None = None,
        on_leader_unreachable: UnreachableHook | None = None,
        replica_lag_time_max: float = 15.0,
        replica_fetch_wait_max_ms: int = 500,
        replica_copy_threshold_bytes: int = 256 * 1024 * 1024,
        replica_ack_poll_us: int = 0,
        nats_duplicate_window_ms: int = 120_000,
        nats_max_msg_ids: int = 100_000,
        nats_ingest_connections: int = 4,
        namespace: str = DEFAULT_NAMESPACE,
        producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
        recovery_truncate_damaged: bool = False,
        max_open_segment_files: int | None = None,
        peers: Peers | None = None,
        clock: Clock | None = None,
        vault: KeyVault | None = None,
        peer_ssl: SslSource | None = None,
    ) -> None:
        self.broker_id = broker_id
        if max_open_segment_files is not None:  # the process's bound on open segment files (storage.open_files)
            OPEN_FILES.set_limit(max_open_segment_files)
            check_open_file_limit(max_open_segment_files)
        self.vault = vault or KeyVault(None)  # each log's keyring, from its record's data keys (broker.encryption)
        self.tier: RemoteTier | None = None  # the tiered store's catalog, given to every replica (broker.tiering)
        self._clock: Clock = clock or SystemClock()  # handed to every partition, fetcher and ingest it makes
        self._root = data_dir / "streams"
        self._log_config_for = log_config_for
        self._flush_shares = FlushShares()  # every log of this broker weighs its inline fsyncs against the others'
        self._alter_isr = alter_isr
        self._report_suspension = report_suspension
        self._on_leader_unreachable = on_leader_unreachable
        self._lag_max = replica_lag_time_max
        self._fetch_wait_ms = replica_fetch_wait_max_ms
        self._copy_threshold = replica_copy_threshold_bytes
        self._ack_poll_us = replica_ack_poll_us
        self._producer_expiry_ms = producer_expiry_ms
        self.damaged = DamagedPartitions(
            broker_id, truncate_damaged=recovery_truncate_damaged, alter_isr=alter_isr, clock=self._clock
        )
        self.failed = FailedLogs(broker_id, alter_isr=alter_isr, retry=self._retry_failed, clock=self._clock)
        self._partitions: dict[PartitionKey, Partition] = {}
        self._followers: dict[PartitionKey, FollowedPartition] = {}
        self._ingests = IngestRuns(  # one per partition led here, retried until it subscribes
            nc,
            urls=nats_urls,
            ack_timeout=ack_timeout,
            duplicate_window_ms=nats_duplicate_window_ms,
            max_msg_ids=nats_max_msg_ids,
            namespace=namespace,
            clock=self._clock,
            connections=nats_ingest_connections,
        )
        self._paused: dict[PartitionKey, Path] = {}  # replicas held here while paused (not open): their directory
        self._paused_bounds: dict[PartitionKey, tuple[int, int]] = {}  # (HW, log end) of those closed here
        self._snapshot = MetadataSnapshot()
        self._lock = asyncio.Lock()
        self._checkpointer: asyncio.Task[None] | None = None
        self._maintenance = LeaderMaintenance(self._clock)  # one timer for every led partition's periodic work
        self._lead_listeners: list[Callable[[], None]] = []  # told when a partition starts being led or is altered
        self._peer_ssl = peer_ssl  # TLS for the fetchers' connections to their leaders (None: plaintext)
        # one fetch session (one connection) per leader broker, shared by every partition followed from it
        self._sessions = FetchSessions(broker_id, max_wait_ms=replica_fetch_wait_max_ms, ssl=peer_ssl)
        self._repairs = DamageRepairs(peers, self._repair_sources)  # bit rot: restore from a replica

    def add_lead_listener(self, listener: Callable[[], None]) -> None:
        """Have ``listener`` called when this broker starts leading a partition or a led stream's settings change
        (the auto-pause sweep sleeps until the next deadline it knows of)."""
        self._lead_listeners.append(listener)

    def _tell_lead_listeners(self) -> None:
        for listener in self._lead_listeners:
            listener()

    # ------------------------------------------------------------------------------------------ lookups

    def local(self, stream: str, partition: int) -> Partition | None:
        """The partition if this broker leads it, else None (for reports that cover every partition)."""
        return self._partitions.get((stream, partition))

    def leader_of(self, stream: str, partition: int) -> Partition:
        """The partition if this broker leads it; the precise error otherwise."""
        found = self._partitions.get((stream, partition))
        if found is not None:
            return found
        record = self._snapshot.stream(stream)
        if record is None:
            raise UnknownStreamError(f"no stream named {stream!r}")
        if not 0 <= partition < record.partitions:
            raise UnknownPartitionError(f"stream {stream!r} has partitions 0..{record.partitions - 1}, not {partition}")
        meta = self._snapshot.partition(stream, partition)
        if meta is not None and meta.paused:
            raise PartitionPausedError(
                f"partition {stream}/{partition} is paused: a publish to it, or a subscribe with resume set, resumes it"
            )
        refusal = self.damaged.error((stream, partition))
        if refusal is not None and meta is not None and meta.leader == self.broker_id:
            raise refusal
        leader = meta.leader if meta is not None else "?"
        raise NotLeaderError(f"this broker ({self.broker_id}) does not lead {stream}/{partition}; {leader} does")

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def paused(self) -> list[PartitionKey]:
        """The replicas this broker holds that are paused (closed)."""
        return list(self._paused)

    def paused_bounds(self, stream: str, partition: int) -> tuple[int, int] | None:
        """A paused partition's high watermark and log end when this broker led it as it was paused (None after a
        restart: its log is not opened to find out)."""
        return self._paused_bounds.get((stream, partition))

    def replicas(self) -> list[Partition | FollowedPartition]:
        """Every partition this broker holds a copy of, led or followed."""
        return [*self._partitions.values(), *self._followers.values()]

    def ingest_of(self, stream: str, partition: int) -> NatsIngest | None:
        """The NATS ingest of a partition led here, if it runs."""
        return self._ingests.of((stream, partition))

    def ingests(self) -> list[NatsIngest]:
        """The NATS ingests running now, one per partition led here."""
        return self._ingests.running()

    def ingest_totals(self) -> dict[str, int]:
        """The NATS ingests' counters summed over every ingest run here (see :meth:`IngestRuns.totals`)."""
        return self._ingests.totals()

    def follower(self, stream: str, partition: int) -> FollowedPartition | None:
        """The partition if this broker follows it, else None."""
        return self._followers.get((stream, partition))

    def reader_of(self, stream: str, partition: int, *, isr_replica: bool = False) -> Partition | FollowedPartition:
        """Where a subscriber reads: the leader, or with ``isr_replica`` (Liftbridge's ``readISRReplica``) this
        broker's copy when it is in the ISR; the leader's precise error otherwise."""
        if isr_replica:
            follower = self._followers.get((stream, partition))
            if follower is not None and self.broker_id in follower.record.isr:
                return follower
        return self.leader_of(stream, partition)

    def _repair_sources(self, stream: str, partition: int) -> list[str]:
        """Who holds a sound copy of a range this broker found damaged: as leader its in-sync followers, as a
        follower its leader."""
        leading = self._partitions.get((stream, partition))
        if leading is not None:
            return [b for b in leading.record.isr if b != self.broker_id]
        following = self._followers.get((stream, partition))
        if following is not None and following.record.leader and following.record.leader != self.broker_id:
            return [following.record.leader]
        return []

    def path_of(self, stream: StreamRecord, partition: int) -> Path:
        return partition_path(self._root, stream, partition)

    async def remove_orphans(self, snapshot: MetadataSnapshot) -> list[Path]:
        """Delete the data of streams and partitions that left this broker while it was down."""
        return await asyncio.to_thread(remove_orphans, self._root, snapshot, self.broker_id)

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        """Mirror listener: bring the running partitions in line with ``new``.

        Only the partitions the change touched are looked at (:func:`changed_partitions`), all of them when it
        does not say or a broker came or went; those this broker holds are brought in line
        :data:`RECONCILE_CONCURRENCY` at a time (a failover makes many leaders here at once, and each waits on
        its log and its NATS subscription)."""
        async with self._lock:
            self._snapshot = new
            if self._checkpointer is None:
                self._checkpointer = asyncio.create_task(self._checkpoint_followers(), name="follower-hw")
            keys = changed_partitions(old, new)
            held = (*self._partitions, *self._followers, *self._paused, *self.damaged.refused())
            if keys is None:
                keys = {k for k, p in new.partitions.items() if self.broker_id in p.replicas} | set(held)
            mine: dict[PartitionKey, PartitionRecord] = {}
            for key in keys:
                record = new.partitions.get(key)
                if record is not None and self.broker_id in record.replicas and key[0] in new.streams:
                    mine[key] = record
                else:
                    await self._drop(key, new)
            limit = asyncio.Semaphore(RECONCILE_CONCURRENCY)

            async def bounded(key: PartitionKey, record: PartitionRecord) -> None:
                async with limit:
                    await self._reconcile_one(key, record, new)

            outcomes = await asyncio.gather(*(bounded(k, r) for k, r in mine.items()), return_exceptions=True)
            for key, outcome in zip(mine, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    log.error("%s/%d: acting on its new metadata failed", *key, exc_info=outcome)

    async def _drop(self, key: PartitionKey, new: MetadataSnapshot) -> None:
        """Stop holding a partition this broker is no longer a replica of, deleting its data (its stream was
        deleted, or it was reassigned away)."""
        if key in self._partitions or key in self._followers:
            await self._stop(key, delete=True)
        closed = self._paused.pop(key, None)
        if closed is not None:
            self._paused_bounds.pop(key, None)
            if key[0] not in new.streams:  # deleted while paused: its log is closed already
                await delete_directory(closed)
                log.info("deleted partition %s/%d (it was paused)", *key)
        self.failed.forget(key)
        if key in self.damaged.refused():
            directory = self.damaged.forget(key)
            if directory is not None and key[0] not in new.streams:  # a log never opened: deleted all the same
                await delete_directory(directory)
                log.info("deleted partition %s/%d (it was not opened: damaged)", *key)

    async def _reconcile_one(self, key: PartitionKey, record: PartitionRecord, new: MetadataSnapshot) -> None:
        """Bring one partition this broker is a replica of in line with its record."""
        stream = new.streams[key[0]]
        if record.paused:
            await self._pause(key, stream, record)
            return
        if self._paused.pop(key, None) is not None:
            self._paused_bounds.pop(key, None)
            log.info("resuming %s/%d", *key)
        if record.leader == self.broker_id:
            running = self._partitions.get(key)
            if running is None:
                await self._lead(stream, record)
            elif running.record.leader_epoch != record.leader_epoch:
                # Re-elected: a new term starts from fresh follower state, on the same open log.
                await self._stop(key, delete=False, keep_log=True)
                reuse = (running.log, running.high_watermark, running.producers)
                await self._lead(stream, record, reuse=reuse)
            elif running.record != record:
                running.update_record(record)
        else:
            await self._follow(stream, record, new)
        replica = self._partitions.get(key) or self._followers.get(key)
        if replica is not None:  # a rotated key: new writes seal with it
            replica.log.keyring = self.vault.keyring(record)
        if replica is not None and replica.stream != stream:  # settings changed: `tidelog stream alter`
            self._restream(replica, stream)

    def _restream(self, replica: Partition | FollowedPartition, stream: StreamRecord) -> None:
        """Apply a stream's changed settings to a running replica: its log's roll, retention and compaction, a
        leader's ``min_isr``; what reads the stream record (auto-pause, tiering, concurrency control) sees it."""
        replica.log.reconfigure(self._log_config_for(stream))
        if isinstance(replica, Partition):
            replica.update_stream(stream, stream.config.min_isr or max(1, stream.replication_factor - 1))
            self._tell_lead_listeners()
        else:
            replica.stream = stream
        log.info("%s/%d: stream settings changed", stream.name, replica.record.id)

    async def _pause(self, key: PartitionKey, stream: StreamRecord, record: PartitionRecord) -> None:
        """Close a replica that is paused (its ingest or fetcher first), or keep one closed."""
        if key in self._paused:
            return
        running = key in self._partitions or key in self._followers
        for replica in (self._partitions.get(key), self._followers.get(key)):
            if replica is not None:  # its readers see the pause (they end with PARTITION_PAUSED, not UNAVAILABLE)
                replica.record = record
                replica.record_changed()
        leading = self._partitions.get(key)
        if leading is not None:
            self._paused_bounds[key] = (leading.high_watermark, leading.log_end)
        if running:
            await self._stop(key, delete=False)
        self._paused[key] = self.path_of(stream, record.id)
        log.info("%s/%d is paused%s", *key, ": closed its log" if running else "; not opening it")

    async def _open_log(self, stream: StreamRecord, record: PartitionRecord) -> tuple[Log, ProducerStateTable] | None:
        """Open a replica's log and load its producer state (a snapshot and the log after it, off the loop).

        None if it cannot be opened; a log damaged in the middle only when :class:`DamagedPartitions` says who
        may cut it (and is then remembered as refused, so it is not tried again in the same role)."""
        partition, path = record.id, self.path_of(stream, record.id)
        where = {"stream": stream.name, "partition": partition, "path": str(path)}
        if self.damaged.still_refused(record):
            return None
        try:
            cut = self.damaged.may_cut(record)
            config = self._log_config_for(stream)
            opening = Log.open_async(path, config, truncate_damaged=cut, flush_shares=self._flush_shares)
            log_ = await self.failed.opened((stream.name, partition), opening, leading=record.leader == self.broker_id)
            if log_ is None:
                return None  # its disk failed, and still fails: tried again later
            log_.keyring = self.vault.keyring(record)  # before anything reads or writes it
        except DamagedLogError as exc:
            self.damaged.refuse(record, exc)
            return None
        except Exception:
            log.exception("cannot open %s; not served here until its metadata changes or a restart", path, extra=where)
            return None
        try:
            producers = await asyncio.to_thread(_load_producers, log_, self._producer_expiry_ms)
        except Exception:
            log.exception("cannot load the producer state of %s; closed again, not served here", path, extra=where)
            await log_.close()
            return None
        finally:
            OPEN_FILES.trim()  # what the loading kept open past the bound
        self.damaged.forget((stream.name, partition))
        return log_, producers

    async def _take_log(
        self, stream: StreamRecord, record: PartitionRecord
    ) -> tuple[Log, int | None, ProducerStateTable] | None:
        """The partition's log, open already (from a previous role) or opened now, the HW to start from, and the
        producer state that goes with the log."""
        key = (stream.name, record.id)
        follower = self._followers.pop(key, None)
        if follower is not None:
            if follower.fetcher is not None:
                await follower.fetcher.stop()
            return follower.log, follower.known_committed, follower.producers
        opened = await self._open_log(stream, record)
        if opened is None:
            return None
        log_, producers = opened
        replicated = len(record.replicas) > 1
        # Unclamped: a checkpoint above the log end is evidence the log lost committed records (fail to safety).
        return log_, checkpointed_hw(log_) if replicated else None, producers

    async def _lead(
        self,
        stream: StreamRecord,
        record: PartitionRecord,
        *,
        reuse: tuple[Log, int, ProducerStateTable] | None = None,
    ) -> None:
        taken = reuse or await self._take_log(stream, record)
        if taken is None:
            return
        log_, initial_hw, producers = taken
        replicated = len(record.replicas) > 1
        hw = initial_hw if replicated else None
        await apply_confirmed_head(record, log_, hw, producers, rewrite_checkpoint=reuse is not None)
        min_isr = stream.config.min_isr or max(1, stream.replication_factor - 1)
        partition = Partition(
            stream,
            record,
            log_,
            self.broker_id,
            min_isr=min_isr,
            initial_hw=hw,
            alter_isr=self._alter_isr,
            replica_lag_time_max=self._lag_max,
            producers=producers,
            report_suspension=self._report_suspension,
            ack_poll_us=self._ack_poll_us,
            clock=self._clock,
            maintenance=self._maintenance,
            on_log_failed=self.failed.leader_failed,
        )
        partition.tier = self.tier
        self._partitions[(stream.name, record.id)] = partition
        self._repairs.watch(log_, stream.name, record.id)
        self._tell_lead_listeners()
        await self._ingests.start(partition)  # on failure: logged as an error, retried until it subscribes
        log.info(
            "leading %s (epoch %d) on NATS subject %r (log %d..%d, HW %d)",
            partition.name,
            record.leader_epoch,
            partition.subject,
            log_.start_offset,
            log_.end_offset,
            partition.high_watermark,
        )

    def ingesting(self, stream: str, partition: int) -> bool:
        """Whether this broker leads the partition and its NATS ingest is subscribed."""
        return self._ingests.subscribed((stream, partition))

    async def _follow(self, stream: StreamRecord, record: PartitionRecord, snap: MetadataSnapshot) -> None:
        """Be a follower of ``record``'s leader: demote a local leader first, (re)start the fetcher when the
        leader, its epoch or its address changed, idle while the leader is not alive."""
        key = (stream.name, record.id)
        follower = self._followers.get(key)
        if (failed := self._partitions.get(key) or follower) is not None and failed.log.flusher.failed is not None:
            await self.failed.retire(key, failed.log, self._stop(key, delete=False))  # reopened below, cut
            follower = None
        if follower is None:
            partition = self._partitions.get(key)
            if partition is not None:
                await self._stop(key, delete=False, keep_log=True)  # its appends settle into its table first
                log_, producers, hw = partition.log, partition.producers, partition.high_watermark
            else:
                opened = await self._open_log(stream, record)
                if opened is None:
                    return
                (log_, producers), hw = opened, None
            # A demoted leader's HW (which its close() has checkpointed) is what the follower may serve and start
            # from; a log just opened starts from its checkpoint.
            follower = FollowedPartition(stream, record, log_, producers, high_watermark=hw)
            follower.tier = self.tier
            self._followers[key] = follower
            self._repairs.watch(log_, stream.name, record.id)
        if follower.record != record:
            follower.record = record
            follower.record_changed()
        broker = snap.brokers.get(record.leader) if record.leader else None
        wanted = None if broker is None else (record.leader, record.leader_epoch, f"{broker.host}:{broker.wire_port}")
        if wanted == follower.leader:
            return
        if follower.fetcher is not None:
            await follower.fetcher.stop()
            follower.fetcher = None
        follower.leader = wanted
        if wanted is None:
            log.info("following %s/%d: no live leader (%r) for now", stream.name, record.id, record.leader)
            return
        leader_id, epoch, address = wanted
        fetcher = ReplicaFetcher(
            follower.log,
            stream.name,
            record.id,
            self.broker_id,
            leader_id,
            epoch,
            address,
            max_wait_ms=self._fetch_wait_ms,
            copy_threshold_bytes=self._copy_threshold,
            initial_hw=follower.starting_high_watermark(),
            on_high_watermark=follower.high_watermark_moved,
            on_leader_unreachable=self._unreachable_hook(leader_id),
            producers=follower.producers,
            clock=self._clock,
            ssl=self._peer_ssl,
            sessions=self._sessions,
        )
        follower.fetcher = fetcher
        await fetcher.start()
        log.info("following %s/%d from %s at %s (epoch %d)", stream.name, record.id, leader_id, address, epoch)

    def _unreachable_hook(self, leader_id: str) -> Callable[[], Any] | None:
        hook = self._on_leader_unreachable
        return None if hook is None else functools.partial(hook, leader_id)

    async def _checkpoint_followers(self) -> None:
        """Persist each follower's high watermark once a second while it moves; recover a failed log."""
        while True:
            await self._clock.sleep(1.0)
            for key, follower in list(self._followers.items()):  # an idle one costs a comparison, no coroutine
                if follower.log.flusher.failed is not None:
                    self.failed.retry_later(key)
                elif follower.fetcher is not None and follower.known_committed != follower.checkpointed:
                    await follower.checkpoint()

    async def _retry_failed(self, key: PartitionKey) -> None:
        """:class:`FailedLogs`' retry: bring ``key`` in line with its record again, recovering its log."""
        async with self._lock:
            record = self._snapshot.partitions.get(key)
            if record is not None and self.broker_id in record.replicas and key[0] in self._snapshot.streams:
                await self._reconcile_one(key, record, self._snapshot)

    async def _stop(self, key: PartitionKey, *, delete: bool, keep_log: bool = False) -> None:
        await self._ingests.stop(key)
        partition = self._partitions.pop(key, None)
        follower = self._followers.pop(key, None)
        log_: Log | None = None
        if partition is not None:
            await partition.close(close_log=not keep_log)
            log_ = partition.log
            log.info("stopped leading %s", partition.name)
        if follower is not None:
            if follower.fetcher is not None:
                await follower.fetcher.stop()
            log_ = follower.log
            if not keep_log and delete:
                await follower.log.close()
            elif not keep_log:  # paused: what it knows is committed stays on disk
                await follower.close()
        if delete and log_ is not None:
            await log_.close()
            await delete_directory(log_.directory)
            log.info("deleted partition %s/%d", *key)

    async def close(self) -> None:
        """Stop ingest first (no new writes), then the fetchers, then flush and close every log."""
        async with self._lock:
            if self._checkpointer is not None:
                self._checkpointer.cancel()
            await self._ingests.cancel_retries()
            await self.damaged.close()
            await self.failed.close()
            await self._repairs.stop()
            await self._ingests.stop_all()
            partitions, self._partitions = self._partitions, {}
            await asyncio.gather(*(p.close() for p in partitions.values()), return_exceptions=True)
            followers, self._followers = self._followers, {}
            await asyncio.gather(*(f.fetcher.stop() for f in followers.values() if f.fetcher), return_exceptions=True)
            await self._sessions.close()
            await asyncio.gather(*(f.close() for f in followers.values()), return_exceptions=True)


def _load_producers(log_: Log, expiry_ms: int) -> ProducerStateTable:
    """Blocking (a worker thread): the log's producer state; it reads segments, so none is released meanwhile."""
    with OPEN_FILES.busy(log_.directory):
        return open_producer_state(log_, expiry_ms)
