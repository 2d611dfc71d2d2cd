"""Offloaded history straight from the tiered store: planned from etcd on the driver, read by the executors.

A partition of a tiered stream keeps its older segments in an object store (:mod:`tidelog.broker.tiering`), and
the list of them in etcd (:mod:`tidelog.metadata.remote_segments`). With the ``tieredStore`` and ``etcd``
options (:class:`~tidelog.spark.options.TieredSource`), a query reads that part of a range without a broker:

- on the driver, :func:`plan_remote` reads each partition's segment list (and its stream's record: a stream
  whose stored bytes are encrypted is left to the brokers, which hold its keys) and cuts the part of every range
  that lies in the store into tasks of whole segments, at most ``maxOffsetsPerSplit`` offsets each (one segment
  at least), carrying the segments' list entries with them. What lies above the offloaded end stays a task for
  the brokers, as before;
- in a task, :class:`SegmentScan` reads its segments' batches with
  :class:`~tidelog.storage.remote_read.RemoteReader`, the broker's own reader: ranged GETs with read-ahead,
  every manifest checked against its list entry and every batch against its CRC. Many tasks read in parallel,
  each from the store, none through a broker (Gazette's batch readers read its fragments the same way).

A segment that retention dropped between the plan and the read is missing from the store: the scan raises
:class:`SegmentLost` naming the offsets, which the task treats as any lost data (``failOnDataLoss``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from tidelog.client.records import FetchedBatch
from tidelog.metadata.etcd_client import EtcdTls, open_etcd
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.records import decode_stream
from tidelog.metadata.remote_segments import RemoteSegmentLists
from tidelog.protocol.records import iter_batches
from tidelog.spark.options import SourceOptions, TieredSource
from tidelog.spark.planning import OffsetRange
from tidelog.storage.remote_read import RemoteReader, RemoteSegmentError
from tidelog.storage.remote_segment import RemoteSegment
from tidelog.storage.tiered_store import StoreSettings, open_store

ETCD_TIMEOUT = 10  # seconds for the driver's reads of the segment lists


class SegmentLost(RuntimeError):
    """Offsets ``first..last`` of a task's segments cannot be read from the store (gone, or failing a check)."""

    def __init__(self, first: int, last: int, reason: str) -> None:
        super().__init__(reason)
        self.first = first
        self.last = last


def plan_remote(options: SourceOptions, ranges: Sequence[OffsetRange]) -> list[OffsetRange]:
    """``ranges`` with the part of each that lies in the tiered store cut into tasks that read it from there
    (none when the query has no ``tieredStore`` option)."""
    tiered = options.tiered
    if tiered is None or not ranges:
        return list(ranges)
    lists = asyncio.run(_segment_lists(tiered, sorted({(r.stream, r.partition) for r in ranges})))
    out: list[OffsetRange] = []
    for r in ranges:
        segments = lists.get((r.stream, r.partition), ())
        remote_end = min(r.end, segments[-1].end_offset) if segments else r.start
        if remote_end > r.start:
            out += _segment_tasks(r, segments, remote_end, options.max_offsets_per_split)
        if r.end > max(r.start, remote_end):
            out.append(OffsetRange(r.stream, r.partition, max(r.start, remote_end), r.end, r.subject))
    return out


def _segment_tasks(r: OffsetRange, segments: Sequence[RemoteSegment], end: int, max_offsets: int) -> list[OffsetRange]:
    """Tasks over ``[r.start, end)``, each of whole segments (cut at the range's ends) and at most ``max_offsets``
    offsets unless one segment holds more."""
    tasks: list[OffsetRange] = []
    group: list[RemoteSegment] = []
    for segment in segments:
        if segment.end_offset <= r.start or segment.base_offset >= end:
            continue
        if group and min(segment.end_offset, end) - max(group[0].base_offset, r.start) > max_offsets:
            tasks.append(_task(r, group, end))
            group = []
        group.append(segment)
    if group:
        tasks.append(_task(r, group, end))
    return tasks


def _task(r: OffsetRange, group: list[RemoteSegment], end: int) -> OffsetRange:
    start = max(r.start, group[0].base_offset)
    return OffsetRange(r.stream, r.partition, start, min(end, group[-1].end_offset), r.subject, tuple(group))


async def _segment_lists(
    tiered: TieredSource, partitions: Sequence[tuple[str, int]]
) -> dict[tuple[str, int], tuple[RemoteSegment, ...]]:
    """Each partition's remote segments, as etcd lists them now; none for a stream whose bytes are encrypted,
    or whose list belongs to an earlier stream of the same name."""
    keys = namespace_keys(tiered.namespace)
    tls = tiered.etcd_tls
    user, password = tiered.etcd_credentials or (None, None)
    client: Any = open_etcd(
        tiered.etcd,
        timeout=ETCD_TIMEOUT,
        tls=EtcdTls.from_files(tls.ca, tls.cert, tls.key) if tls is not None else None,
        user=user,
        password=password,
    )
    try:
        async with asyncio.timeout(ETCD_TIMEOUT):
            await client.connect()
            lists = RemoteSegmentLists(client, keys)
            out: dict[tuple[str, int], tuple[RemoteSegment, ...]] = {}
            records: dict[str, Any] = {}
            for stream, partition in partitions:
                if stream not in records:
                    found = [kv for kv in await client.get_prefix(keys.stream(stream)) if kv.key == keys.stream(stream)]
                    records[stream] = decode_stream(bytes(found[0].value)) if found else None
                record = records[stream]
                if record is None or record.config.encryption:
                    continue
                listed = await lists.read(stream, partition)
                if listed.segments.stream_created_ns == record.created_ns:
                    out[(stream, partition)] = listed.segments.segments
            return out
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), ETCD_TIMEOUT)


class SegmentScan:
    """A task's batches, read from its segments in the store in offset order; on the task's own event loop."""

    def __init__(self, tiered: TieredSource, task: OffsetRange, max_bytes: int) -> None:
        settings = StoreSettings(
            tiered.url, tiered.endpoint, tiered.region, tiered.access_key_id, tiered.secret_access_key
        )
        self._reader = RemoteReader(open_store(settings))
        self._task = task
        self._max_bytes = max_bytes
        self.position = task.start
        """The next offset to read: past every batch handed out, or past offsets skipped (:meth:`skip`)."""

    async def next(self) -> list[FetchedBatch]:
        """The next batches below the task's end (empty once it is reached)."""
        task = self._task
        if self.position >= task.end:
            return []
        try:
            data = await self._reader.read(task.segments, self.position, self._max_bytes)
        except RemoteSegmentError as exc:
            raise SegmentLost(exc.first, exc.last, str(exc)) from None
        view = memoryview(data)
        out: list[FetchedBatch] = []
        for position, header in iter_batches(data, verify=False):  # the reader checked every batch
            if header.base_offset >= task.end:
                break
            batch = view[position : position + header.size]
            out.append(FetchedBatch(task.stream, task.partition, header, batch, task.start))
            self.position = header.next_offset
        if not out:  # the segments end before the range the plan gave them: those offsets are not there
            raise SegmentLost(self.position, task.end - 1, f"the tiered store holds no batch from {self.position}")
        return out

    def skip(self, offset: int) -> None:
        """Go on reading from ``offset`` (after offsets found lost, with ``failOnDataLoss=false``)."""
        self.position = max(self.position, offset)

    def close(self) -> None:
        self._reader.close()
