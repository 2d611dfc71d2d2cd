"""Reading a remote segment's batches by offset range, every batch's CRC checked, with read-ahead.

The one module that reads batches back from the object store, for every reader: a consumer's fetch or
subscription below the local log start (:mod:`tidelog.broker.partitions.committed_reads`), and any later reader
that plans from the segment list in etcd (the Spark executors can call :meth:`RemoteReader.read` with the same
:class:`~tidelog.storage.remote_segment.RemoteSegment` entries; nothing here needs a broker).

Objects are fetched in aligned chunks of :data:`CHUNK_BYTES` through a small cache shared by every read of the
reader. After each read the :data:`READ_AHEAD` chunks that follow the last one used are requested in the
background (running on into the next segment at a segment's end), so a sequential scan finds its next chunks
already arriving, several requests in flight at once: one ranged GET of 1 MiB at a time left a scan at a fifth of
what the store gives a client GETting whole objects (``benchmarks.tiered``, ``remote_read``). A read's buffer keeps only
the bytes from the batch it is at when it grows, so a read copies each byte once into its answer. A segment's
manifest (its offset index) is fetched once and cached.

Trust: a manifest must match the list entry it was reached from (same checksum and offsets); every batch served
passes :func:`~tidelog.protocol.records.check_batch`. A missing object or a batch that fails is a
:class:`RemoteSegmentError` naming the offsets it covers: bytes that fail are never served, never "repaired".
"""

from __future__ import annotations

import asyncio
import contextlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence

from tidelog.protocol.records import HEADER_SIZE, BatchHeader, check_batch
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.layout import HEADER
from tidelog.storage.errors import StorageError
from tidelog.storage.remote_segment import RemoteSegment, decode_manifest
from tidelog.storage.tiered_store import RemoteObjectMissingError, TieredStore

CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes of one ranged GET: large enough that a request's latency is small beside its transfer (1 MiB chunks
read about half as fast in ``benchmarks.tiered``; a read at a random offset fetches up to this much first)."""
READ_AHEAD = 4
"""Chunks requested ahead of a sequential read, all in flight together."""
CACHE_BYTES = 32 * 1024 * 1024  # what a reader keeps of the chunks it fetched (and reads ahead into)
CACHED_MANIFESTS = 4096


class RemoteSegmentError(StorageError):
    """Offsets ``first..last`` cannot be read from the store: the object is missing, or a batch fails its check."""

    def __init__(self, first: int, last: int, reason: str) -> None:
        super().__init__(f"offsets {first}..{last} in the tiered store cannot be read: {reason}")
        self.first = first
        self.last = last
        self.reason = reason


def segment_for(segments: Sequence[RemoteSegment], offset: int) -> int | None:
    """The index of the segment holding ``offset``, or of the first one after it (a gap), or None past the last."""
    i = bisect_right(segments, offset, key=lambda s: s.base_offset) - 1
    if i >= 0 and offset < segments[i].end_offset:
        return i
    return i + 1 if i + 1 < len(segments) else None


class RemoteReader:
    """Reads batches of remote segments; one per broker, shared by every partition (its caches are bounded)."""

    def __init__(self, store: TieredStore, *, chunk_bytes: int = CHUNK_BYTES, read_ahead: int = READ_AHEAD) -> None:
        self._store = store
        self._chunk = chunk_bytes
        self._ahead = read_ahead
        self._cached = max(read_ahead + 2, CACHE_BYTES // chunk_bytes)  # chunks kept
        self._chunks: OrderedDict[tuple[str, int], asyncio.Task[bytes]] = OrderedDict()
        self._manifests: OrderedDict[str, RemoteSegment] = OrderedDict()
        self.remote_reads = 0  # ranged GETs made (read-ahead included), for metrics and tests
        self.read_bytes = 0  # batch bytes served from the store (after their checks), for metrics

    async def read(
        self, segments: Sequence[RemoteSegment], offset: int, max_bytes: int, max_offset: int | None = None
    ) -> bytes:
        """Whole batches of the remote segment holding ``offset`` (or the next one), from the batch holding it:
        at least one, then as many as ``max_bytes`` allows, none reaching ``max_offset``. Empty past the list."""
        i = segment_for(segments, offset)
        if i is None:
            return b""
        entry = segments[i]
        offset = max(offset, entry.base_offset)
        following = segments[i + 1] if i + 1 < len(segments) else None
        manifest = await self._manifest(entry)
        position = manifest.position_for(offset)
        out: list[memoryview] = []
        served = 0
        buffer = memoryview(b"")
        buffer_start = position
        cursor = position
        last_chunk = position // self._chunk
        while cursor < entry.size:
            header_end = cursor + HEADER_SIZE
            if header_end > buffer_start + len(buffer):
                buffer, buffer_start, last_chunk = await self._extend(entry, buffer, buffer_start, cursor, header_end)
            local = cursor - buffer_start
            header = BatchHeader._make(HEADER.unpack_from(buffer, local))
            batch_end = cursor + header.size
            if header.size < HEADER_SIZE or batch_end > entry.size:
                raise RemoteSegmentError(entry.base_offset, entry.end_offset - 1, f"a batch at byte {cursor} is torn")
            if header.next_offset <= offset:
                cursor = batch_end
                continue
            if (max_offset is not None and header.last_offset >= max_offset) or (out and served >= max_bytes):
                break
            if out and served + header.size > max_bytes:
                break
            if batch_end > buffer_start + len(buffer):
                buffer, buffer_start, last_chunk = await self._extend(entry, buffer, buffer_start, cursor, batch_end)
                local = cursor - buffer_start
            batch = buffer[local : local + header.size]
            try:
                check_batch(batch)
            except CorruptBatchError as exc:
                raise RemoteSegmentError(header.base_offset, header.last_offset, f"{entry.log_name}: {exc}") from None
            out.append(batch)
            served += header.size
            cursor = batch_end
        self._read_ahead(entry, last_chunk + 1, following)
        self.read_bytes += served
        return b"".join(out)

    async def _extend(
        self, entry: RemoteSegment, buffer: memoryview, start: int, keep: int, need_end: int
    ) -> tuple[memoryview, int, int]:
        """``buffer`` (bytes from ``start``) from ``keep`` on, grown by whole chunks until it reaches ``need_end``
        (the batches before ``keep`` were served already: views of them stay valid, and are not copied again)."""
        have_end = start + len(buffer)
        kept = buffer[max(0, keep - start) :]
        parts: list[memoryview] = [kept] if len(kept) else []
        if parts:
            start = max(start, keep)
        else:  # nothing kept: start at ``keep`` (batches skipped past the buffer need no bytes of their own)
            start = have_end = max(have_end, keep)
        k = have_end // self._chunk
        while have_end < need_end:
            chunk = await self._get_chunk(entry, k)
            skip = have_end - k * self._chunk
            parts.append(memoryview(chunk)[skip:])
            have_end = k * self._chunk + len(chunk)
            if len(chunk) < self._chunk and have_end < need_end:
                raise RemoteSegmentError(
                    entry.base_offset, entry.end_offset - 1, f"{entry.log_name} is shorter than its manifest says"
                )
            k += 1
        return memoryview(b"".join(parts)), start, k - 1

    async def _get_chunk(self, entry: RemoteSegment, k: int) -> bytes:
        task = self._chunk_task(entry, k)
        try:
            return await asyncio.shield(task)
        except RemoteObjectMissingError:
            self._chunks.pop((entry.stem, k), None)
            raise RemoteSegmentError(entry.base_offset, entry.end_offset - 1, f"{entry.log_name} is missing") from None
        except BaseException:
            if task.done():
                self._chunks.pop((entry.stem, k), None)  # a failed fetch is not cached: the next read tries again
            raise

    def _chunk_task(self, entry: RemoteSegment, k: int) -> asyncio.Task[bytes]:
        key = (entry.stem, k)
        task = self._chunks.get(key)
        if task is not None:
            self._chunks.move_to_end(key)
            return task
        start = k * self._chunk
        end = min(entry.size, start + self._chunk)
        self.remote_reads += 1
        task = asyncio.ensure_future(self._store.get_range(entry.log_name, start, end))
        task.add_done_callback(_quiet)
        self._chunks[key] = task
        while len(self._chunks) > self._cached:
            _, old = self._chunks.popitem(last=False)
            if not old.done():
                old.cancel()
        return task

    def _read_ahead(self, entry: RemoteSegment, k: int, following: RemoteSegment | None) -> None:
        """Request the :data:`READ_AHEAD` chunks from chunk ``k`` of ``entry`` on, into ``following`` past its end."""
        chunks = -(-entry.size // self._chunk)
        for i in range(self._ahead):
            if k + i < chunks:
                self._chunk_task(entry, k + i)
            elif following is not None and (j := k + i - chunks) * self._chunk < following.size:
                self._chunk_task(following, j)

    async def _manifest(self, entry: RemoteSegment) -> RemoteSegment:
        found = self._manifests.get(entry.stem)
        if found is not None:
            self._manifests.move_to_end(entry.stem)
            return found
        try:
            manifest = decode_manifest(await self._store.get(entry.manifest_name))
        except RemoteObjectMissingError:
            raise RemoteSegmentError(
                entry.base_offset, entry.end_offset - 1, f"{entry.manifest_name} is missing"
            ) from None
        except ValueError as exc:
            raise RemoteSegmentError(
                entry.base_offset, entry.end_offset - 1, f"{entry.manifest_name} is unreadable: {exc}"
            ) from None
        if (manifest.sha256, manifest.base_offset, manifest.end_offset, manifest.size) != (
            entry.sha256,
            entry.base_offset,
            entry.end_offset,
            entry.size,
        ):
            raise RemoteSegmentError(
                entry.base_offset, entry.end_offset - 1, f"{entry.manifest_name} does not match the segment list"
            )
        self._manifests[entry.stem] = manifest
        while len(self._manifests) > CACHED_MANIFESTS:
            self._manifests.popitem(last=False)
        return manifest

    def close(self) -> None:
        for task in self._chunks.values():
            if not task.done():
                task.cancel()
        self._chunks.clear()


def _quiet(task: asyncio.Task[bytes]) -> None:
    """Mark a read-ahead's failure as seen (it is raised to the read that awaits it, if any)."""
    with contextlib.suppress(BaseException):
        task.exception()
