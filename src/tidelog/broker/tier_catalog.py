"""What this broker knows of the tiered store: every partition's remote segment list, and reads from it.

The lists live in etcd (:mod:`tidelog.metadata.remote_segments`); the catalog follows their prefix with one watch
per broker (:class:`~tidelog.metadata.prefix_follower.PrefixFollower`), so every broker, leader or not, knows
within a watch's delay what every partition has in the store. A partition's readers ask it two things
(:class:`~tidelog.broker.partitions.committed_reads.RemoteTier`): where the partition's history now starts (the
first remote offset, below the local log start once segments were offloaded and deleted locally), and the batches
at an offset below the local log start, which it reads with the broker's one
:class:`~tidelog.storage.remote_read.RemoteReader`.

A list that changed under a read (retention dropped a segment meanwhile) shows as a missing object: the read is
tried once more on the list as it is then, and only a segment still listed and still missing is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tidelog.metadata.prefix_follower import PrefixFollower
from tidelog.metadata.records import Keys
from tidelog.metadata.remote_segments import RemoteSegmentList, decode_list, remote_prefix
from tidelog.storage.remote_read import RemoteReader, RemoteSegmentError
from tidelog.storage.tiered_store import TieredStore

log = logging.getLogger(__name__)


class TierCatalog:
    """Every partition's remote segment list, followed from etcd; reads below the local log start."""

    def __init__(self, client: Any, keys: Keys, store: TieredStore, created: Callable[[str], int | None]) -> None:
        """``created``: a stream's ``created_ns`` now (the metadata mirror's), or None when there is no such
        stream: a list from an earlier stream of the same name is not shown."""
        self.store = store
        self._created = created
        self.reader = RemoteReader(store)
        self._prefix = remote_prefix(keys)
        self._lists: dict[tuple[str, int], RemoteSegmentList] = {}
        self._follower = PrefixFollower(client, self._prefix, name="tier-catalog", load=self._load, apply=self._apply)

    async def start(self) -> None:
        await self._follower.start()

    async def stop(self) -> None:
        await self._follower.stop()
        self.reader.close()

    def _key_of(self, key: bytes) -> tuple[str, int]:
        stream, _, pid = key[len(self._prefix) :].decode().rpartition("/")
        return stream, int(pid)

    async def _load(self, result: Any, again: bool) -> None:
        lists: dict[tuple[str, int], RemoteSegmentList] = {}
        for kv in result:
            try:
                lists[self._key_of(kv.key)] = decode_list(bytes(kv.value))
            except Exception:
                log.exception("ignoring an undecodable remote segment list at %r", kv.key)
        self._lists = lists

    async def _apply(self, event: Any) -> None:
        try:
            key = self._key_of(event.kv.key)
            if event.kind == "DELETE":
                self._lists.pop(key, None)
            else:
                self._keep_newer(key, decode_list(bytes(event.kv.value)))
        except Exception:
            log.exception("ignoring an undecodable remote segment list at %r", event.kv.key)

    def forget(self, stream: str, partition: int) -> None:
        self._lists.pop((stream, partition), None)

    def orphans(self) -> list[tuple[str, int]]:
        """The partitions whose list belongs to no stream any more (deleted; not created again yet)."""
        return [key for key in self._lists if self._created(key[0]) is None]

    def learn(self, stream: str, partition: int, segments: RemoteSegmentList) -> None:
        """A list this broker just wrote or read (the watch brings it too, a moment later)."""
        self._keep_newer((stream, partition), segments)

    def _keep_newer(self, key: tuple[str, int], segments: RemoteSegmentList) -> None:
        """Take ``segments`` unless the list known is newer. The watch may deliver a list this broker already
        replaced (it learns its own writes at once): going back to it would lose the newest upload while local
        retention, capped by the newer list, has already deleted those offsets from disk."""
        known = self._lists.get(key)
        if known is None or _age(segments) >= _age(known):
            self._lists[key] = segments

    def list_of(self, stream: str, partition: int) -> RemoteSegmentList:
        found = self._lists.get((stream, partition))
        if found is None or found.stream_created_ns != self._created(stream):
            return RemoteSegmentList()
        return found

    # -- RemoteTier: what a partition's readers ask ----------------------------------------------------------

    def remote_start(self, stream: str, partition: int) -> int | None:
        return self.list_of(stream, partition).start_offset

    def remote_offset_for_timestamp(self, stream: str, partition: int, timestamp_ns: int) -> int | None:
        """The base offset of the first remote segment holding a record at or after ``timestamp_ns``; None when
        none does (the segments' newest timestamps say)."""
        for segment in self.list_of(stream, partition).segments:
            if segment.max_timestamp >= timestamp_ns:
                return segment.base_offset
        return None

    def remote_end(self, stream: str, partition: int) -> int | None:
        return self.list_of(stream, partition).end_offset

    async def read(self, stream: str, partition: int, offset: int, max_bytes: int, max_offset: int) -> bytes:
        """Whole batches from the store at ``offset`` (below ``max_offset``); empty when the store has none there."""
        segments = self.list_of(stream, partition).segments
        try:
            return await self.reader.read(segments, offset, max_bytes, max_offset)
        except RemoteSegmentError:
            now = self.list_of(stream, partition).segments
            if now == segments:
                raise
            return await self.reader.read(now, offset, max_bytes, max_offset)


def _age(segments: RemoteSegmentList) -> tuple[int, int, int]:
    """Orders a partition's lists by when they were written: a list only changes by an upload (its end grows),
    by retention (its start grows, its end stays), or by a new stream of the same name (a later creation)."""
    end = segments.end_offset or 0
    start = segments.start_offset if segments.start_offset is not None else end
    return segments.stream_created_ns, end, start
