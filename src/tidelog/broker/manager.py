"""The partition manager: makes what this broker runs match what the metadata says it should.

It listens to the :class:`~tidelog.metadata.mirror.MetadataMirror`. For every partition this broker leads it
opens the log, builds a :class:`~tidelog.broker.partition.Partition` and starts NATS ingest; for every
partition that disappeared (its stream was deleted) it stops ingest, closes the log and deletes the data; for a
changed record (paused, read-only, ISR) it hands the new record to the partition. Requests never open or close
partitions themselves: they change metadata and wait for the manager to act on it, so the on-disk state follows
one source of truth whatever protocol the change came through.

Partition data lives at ``<data_dir>/streams/<stream>@<created_ns>/<partition>``: the creation time in the path
means a stream deleted while this broker was down and then created again under the same name never adopts the
old stream's files.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tidelog.api.errors import NotLeaderError, UnknownPartitionError, UnknownStreamError
from tidelog.broker.ingest import NatsIngest
from tidelog.broker.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey
from tidelog.storage.config import LogConfig
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

LogConfigFactory = Callable[[StreamRecord], LogConfig]
ResumeHook = Callable[[Partition], Any]


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
        on_resume: ResumeHook | None = None,
        nats_urls: Sequence[str] = (),
    ) -> None:
        self.broker_id = broker_id
        self._root = data_dir / "streams"
        self._nc = nc
        self._nats_urls = list(nats_urls)  # for each ingest's own NATS connection (see broker.ingest)
        self._log_config_for = log_config_for
        self._ack_timeout = ack_timeout
        self._on_resume = on_resume
        self._partitions: dict[PartitionKey, Partition] = {}
        self._ingests: dict[PartitionKey, NatsIngest] = {}
        self._snapshot = MetadataSnapshot()
        self._lock = asyncio.Lock()

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
        leader = meta.leader if meta is not None else "?"
        raise NotLeaderError(f"this broker ({self.broker_id}) does not lead {stream}/{partition}; {leader} does")

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def path_of(self, stream: StreamRecord, partition: int) -> Path:
        return self._root / f"{stream.name}@{stream.created_ns}" / str(partition)

    # ------------------------------------------------------------------------------------------ reconcile

    async def reconcile(self, _old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        """Mirror listener: bring the running partitions in line with ``new``."""
        async with self._lock:
            self._snapshot = new
            wanted = {
                (p.stream, p.id): p
                for p in new.partitions.values()
                if p.leader == self.broker_id and p.stream in new.streams
            }
            for key in [k for k in self._partitions if k not in wanted]:
                await self._stop(key, delete=key[0] not in new.streams)
            for key, record in wanted.items():
                running = self._partitions.get(key)
                if running is None:
                    await self._start(new.streams[key[0]], record)
                elif running.record != record:
                    running.update_record(record)

    async def _start(self, stream: StreamRecord, record: PartitionRecord) -> None:
        path = self.path_of(stream, record.id)
        config = self._log_config_for(stream)
        try:
            log_ = await Log.open_async(path, config)
        except Exception:
            log.exception("cannot open partition %s/%d at %s", stream.name, record.id, path)
            return
        min_isr = stream.config.min_isr or max(1, stream.replication_factor - 1)
        partition = Partition(stream, record, log_, self.broker_id, min_isr=min_isr, on_resume=self._on_resume)
        self._partitions[(stream.name, record.id)] = partition
        ingest = NatsIngest(self._nc, partition, urls=self._nats_urls, ack_timeout=self._ack_timeout)
        try:
            await ingest.start()
        except Exception:
            log.exception("cannot subscribe %s to NATS subject %s", partition.name, partition.subject)
        else:
            self._ingests[(stream.name, record.id)] = ingest
        log.info(
            "leading %s on NATS subject %r (log %d..%d)",
            partition.name,
            partition.subject,
            log_.start_offset,
            log_.end_offset,
        )

    async def _stop(self, key: PartitionKey, *, delete: bool) -> None:
        ingest = self._ingests.pop(key, None)
        if ingest is not None:
            await ingest.stop()
        partition = self._partitions.pop(key, None)
        if partition is None:
            return
        await partition.close()
        if delete:
            path = partition.log.directory
            await asyncio.to_thread(shutil.rmtree, path, True)
            parent = path.parent
            if parent.exists() and not any(parent.iterdir()):
                parent.rmdir()
            log.info("deleted partition %s", partition.name)
        else:
            log.info("stopped leading %s", partition.name)

    async def remove_orphans(self, snapshot: MetadataSnapshot) -> list[Path]:
        """Delete stream directories of streams that no longer exist (deleted while this broker was down)."""
        if not self._root.exists():
            return []
        live = {f"{s.name}@{s.created_ns}" for s in snapshot.streams.values()}
        removed = [d for d in self._root.iterdir() if d.is_dir() and d.name not in live]
        for d in removed:
            await asyncio.to_thread(shutil.rmtree, d, True)
            log.info("removed data of deleted stream %s", d.name)
        return removed

    async def close(self) -> None:
        """Stop ingest first (no new writes), then flush and close every log."""
        async with self._lock:
            ingests, self._ingests = self._ingests, {}
            await asyncio.gather(*(i.stop() for i in ingests.values()), return_exceptions=True)
            partitions, self._partitions = self._partitions, {}
            await asyncio.gather(*(p.close() for p in partitions.values()), return_exceptions=True)
