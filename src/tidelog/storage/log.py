"""The partition log: one directory of segments behind one interface (append, read, truncate, roll, retain).

Writing. :meth:`Log.append` takes one or more whole batches exactly as a client sent them. It validates each
batch once (header sanity and CRC; per-batch work, records are never decoded) and assigns offsets by giving
each batch a freshly packed 16-byte head (base offset, length, leader epoch: the CRC does not cover them).
The run is written with one ``pwritev`` of those heads interleaved with the rest of the client's buffer, so
the payload is never copied in Python. Batches that do not fit the active segment roll it; the split falls
on batch boundaries. Then the append waits for the flush policy (:mod:`tidelog.storage.flush`): under
``ALWAYS`` it returns only after a group fsync covers it (for a lone append on a quiet loop, an fsync made
right there on the loop thread). :meth:`Log.append_as_follower` writes batches that already carry offsets
(replication) byte for byte.

Ordering. One ``asyncio.Lock`` serializes everything that changes the log. An append takes its offsets and
writes them with no ``await`` in between, so appends are ordered, never interleaved and never half-done, and
an append cancelled while it waits for the lock writes nothing. When the lock is free and nobody is queued
for it, an append does not take it at all: nothing can run between its check and its write, and taking an
``asyncio.Lock`` (Python code: two coroutines and four calls) cost a replicated write 4–29 µs of p50 (paired
runs, 1 KiB acks-ALL, 3 brokers on 2 cores: it sits on the leader's and both followers' paths). Everything
else takes the lock through :meth:`Log._holding_lock`, which counts who is queued, so an append never jumps
ahead of a truncation or a close waiting for it.
A roll is synchronous too: the sealed segment is made durable by a background task (see
:mod:`tidelog.storage.recovery` for the recovery point this maintains). Truncation, retention, compaction and
close hold the lock across disk work in a worker thread, in a *shielded* task: if the caller is cancelled the
operation still completes. Waiting for the fsync happens after the lock is released, which is what lets other
appends join the same group commit.

Reading. Readers never take the lock: reads are synchronous and run on the event loop thread between
writes, and they stop at each segment's committed size. :meth:`Log.read` returns whole batches, CRC-checked
every time. :meth:`Log.read_range` returns a file and byte range for ``os.sendfile``; its guarantee is that
every byte in the range has passed its CRC *in this process* — when appended (the log validated the batch
before writing it), when recovery scanned it, or on first serving (the range is read and checked once, and the
segment remembers it). A read at an offset that compaction removed returns the next batch after it; a segment
with nothing at or after the offset is skipped. Bytes that fail their CRC when read are recorded as a damaged
range (:mod:`tidelog.storage.damage`): reads serve everything before and after it and never pass through it.

Layout and recovery: :mod:`tidelog.storage.segment`, :mod:`tidelog.storage.recovery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from tidelog.clock import Clock, SystemClock
from tidelog.protocol.records import (
    LEADER_EPOCH_POS,
    LENGTH_FIELD_END,
    REGISTERS_FLAG,
    BatchHeader,
    check_batch,
    decode_records,
    iter_batches,
)
from tidelog.storage import disk_full as full
from tidelog.storage.atomic import fsync_directory
from tidelog.storage.compaction import CompactionResult, compact_segment_files
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.damage import DamagedRange, DamageRegistry
from tidelog.storage.damage_repair import covering, locate, write_patch
from tidelog.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE, EpochEndOffset, LeaderEpochCache
from tidelog.storage.errors import (
    CorruptBatchError,
    CorruptSegmentError,
    InvalidBatchError,
    LogClosedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
)
from tidelog.storage.flush import Flusher
from tidelog.storage.preallocation import AppendRate
from tidelog.storage.recovery import RecoveryReport, batch_epochs, recover, write_recovery_point
from tidelog.storage.retention import deletable_prefix
from tidelog.storage.segment import MAX_RELATIVE_OFFSET, Buffer, FileSlice, Placed, Planned, Segment, SegmentInfo
from tidelog.storage.segment_install import (
    StagedSegment,
    check_installable,
    discard_staging,
    move_into_place,
    seal_for_install,
)

T = TypeVar("T")
MAX_LEADER_EPOCH = 2**31 - 1
_DAMAGE_ATTEMPTS = 8  # damaged ranges one read may find and record before it gives up with the last one
_HEAD = struct.Struct(">qii")  # the first 16 header bytes: base offset, batch length, leader epoch
_Slicer = Callable[[int, int], list[Buffer | FileSlice]]  # (first batch, end batch) -> what writes them
TailListener = Callable[[int, int, Sequence[Buffer | FileSlice]], None]
"""``(first_offset, end_offset, parts)``: a write's offsets and what it wrote (see :meth:`Log.add_tail_listener`)."""
assert _HEAD.size == LEADER_EPOCH_POS + 4  # the head ends where the leader epoch does


def _frozen(data: Buffer) -> memoryview:
    """A read-only byte view of ``data``: zero-copy for ``bytes``, one copy for anything mutable."""
    view = memoryview(data)
    if not view.readonly or view.format != "B" or view.ndim != 1:
        view = memoryview(bytes(view))
    return view


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an append landed."""

    base_offset: int
    last_offset: int
    batches: int
    size: int
    """Bytes written."""
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class FileRange:
    """Whole, CRC-verified batches ``[position, position + length)`` of a segment file, for ``os.sendfile``.

    ``fd`` is a duplicate descriptor owned by this object: it stays valid (and keeps showing the same
    bytes) even if the segment is deleted, truncated or compacted meanwhile. Close it (or use ``with``).
    """

    fd: int
    path: Path
    position: int
    length: int
    first_offset: int
    next_offset: int
    """The offset to read from next: one past the last batch in the range."""

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> FileRange:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


NEVER_SEAL_DELAY_MS = 30_000


def _seal_delay_ms(config: LogConfig) -> int:
    """How long after a roll the sealed segment is fsynced.

    Under ``ALWAYS`` every byte was fsynced when appended: at once. Under ``INTERVAL`` the flush ticker
    covers the sealed segment within one interval: after that, so the seal's fsync finds nothing left to
    write. Under ``NEVER`` an immediate fsync of a whole segment competes with the appends still streaming
    in (measured: about a third of the throughput while it runs); after 30 s the kernel's own write-back
    (``dirty_expire_centisecs``, 30 s by default) has usually done the work. The recovery point lags by that
    much, which only makes a crash recovery scan a few more segments.
    """
    if config.flush_policy is FlushPolicy.ALWAYS:
        return 0
    if config.flush_policy is FlushPolicy.INTERVAL:
        return config.flush_interval_ms
    return NEVER_SEAL_DELAY_MS


def _persist_all(segments: list[Segment]) -> None:
    for segment in segments:
        segment.persist_indexes()


def _forget_index_files(segments: list[Segment], directory: Path) -> None:
    for segment in segments:
        segment.forget_index_files()
    fsync_directory(directory)


def _durable_from(directory: Path, offset: int) -> None:
    """Make a new segment's name durable, then move the recovery point to it."""
    fsync_directory(directory)
    write_recovery_point(directory, offset)


def _reopen_sealed(directory: Path, base_offset: int, index_interval_bytes: int) -> Segment:
    segment = Segment.open(directory, base_offset, index_interval_bytes)
    try:
        segment.rebuild(verify=True, keep_tail=True)
        segment.persist_indexes()
    except BaseException:
        segment.close()
        raise
    segment.sealed = True
    return segment


class Log:
    """One partition's commit log. Construct with :meth:`open` (or :meth:`open_async`)."""

    def __init__(
        self, directory: Path, config: LogConfig, clock: Clock, segments: list[Segment], report: RecoveryReport
    ) -> None:
        self._directory = directory
        self._config = config
        self._clock = clock
        self._segments = segments  # offset order; the last one is active
        self._recovery = report
        self._lock = asyncio.Lock()
        self._lock_queued = 0  # waiting in _holding_lock: a free lock is then not free for an append's fast path
        self._flusher = Flusher(config.flush_policy, config.flush_interval_ms, clock)
        self._preallocate = config.flush_policy is FlushPolicy.ALWAYS and config.preallocate_bytes > 0
        self._append_rate = AppendRate()
        self._recovery_point = report.recovery_point
        self._sealing: asyncio.Task[None] | None = None  # the latest background seal; each awaits the one before
        self._expedite = asyncio.Event()  # set: pending seals stop waiting for their due time
        self._seal_delay_ns = _seal_delay_ms(config) * 1_000_000
        self._closed = False
        # Leader epoch -> start offset (KIP-101/279). An entry may outlive the bytes it names when a crash came
        # between writing the checkpoint and the batch, so what lies at or past the log end is dropped here.
        epochs_file = directory / LEADER_EPOCH_CHECKPOINT_FILE  # derived: rebuilt from the batches if damaged
        self._epochs = LeaderEpochCache.load_or_rebuild(epochs_file, lambda: batch_epochs(segments))
        self._epochs.truncate_from_end(self.end_offset)
        self._epochs.truncate_from_start(self.start_offset)  # a crash between deleting a prefix and this
        self._write_listeners: list[Callable[[int], None]] = []
        self._tail_listeners: list[TailListener] = []
        self._damage = DamageRegistry.load(directory)
        self._damage.forget_below(self.start_offset)
        self._damage.forget_from(self.end_offset)

    # ------------------------------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock: Clock | None = None,
        truncate_damaged: bool = False,
    ) -> Log:
        """Open (or create) the log in directory ``path``, running recovery. Blocking: may read and fsync.
        Damage in the middle raises :class:`~tidelog.storage.recovery_damage.DamagedLogError` unless
        ``truncate_damaged``."""
        directory = Path(path)
        config = LogConfig() if config is None else config
        discard_staging(directory)  # segment files a far-horizon catch-up was copying: never part of the log
        segments, report = recover(directory, config.index_interval_bytes, truncate_damaged=truncate_damaged)
        return cls(directory, config, SystemClock() if clock is None else clock, segments, report)

    @classmethod
    async def open_async(
        cls,
        path: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        clock: Clock | None = None,
        truncate_damaged: bool = False,
    ) -> Log:
        """:meth:`open` in a worker thread, keeping recovery's disk work off the event loop."""
        opener = functools.partial(cls.open, path, config, clock=clock, truncate_damaged=truncate_damaged)
        return await asyncio.get_running_loop().run_in_executor(None, opener)

    async def __aenter__(self) -> Log:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------------ state

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def recovery(self) -> RecoveryReport:
        """What recovery found when the log was opened."""
        return self._recovery

    @property
    def damage(self) -> DamageRegistry:
        """Offsets found damaged on disk (:mod:`tidelog.storage.damage`)."""
        return self._damage

    @property
    def flusher(self) -> Flusher:
        """The flush coordinator (read: ``fsync_rounds``, ``durable``, ``failed``; set: ``allow_inline``)."""
        return self._flusher

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def start_offset(self) -> int:
        """The first offset the log may hold (the base offset of its oldest segment)."""
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """The offset the next appended record gets (log end offset)."""
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        """The leader epoch of the newest batch (-1 while no epoch was ever recorded)."""
        return self._epochs.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset:
        """KIP-279: the largest epoch ≤ ``epoch`` this log knows and the offset where it ends (a follower
        truncates to it before fetching from a new leader)."""
        return self._epochs.end_offset_for_epoch(epoch, self.end_offset)

    def add_write_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(end_offset)`` right after each write reaches the file, before it is fsynced.

        Replica fetches wait on this rather than on the high watermark: followers copy a batch while the
        leader is still syncing it, so the leader's fsync and the followers' overlap instead of adding up.
        """
        self._write_listeners.append(listener)

    def remove_write_listener(self, listener: Callable[[int], None]) -> None:
        """Stop calling ``listener`` (a partition this broker stopped leading keeps its log open)."""
        if listener in self._write_listeners:
            self._write_listeners.remove(listener)

    def add_tail_listener(self, listener: TailListener) -> None:
        """Call ``listener(first_offset, end_offset, parts)`` with each write, before the write listeners and
        before the fsync: ``parts`` are the write's whole batches exactly as stored, in order (buffers, or a
        :class:`FileSlice` where the bytes were copied from another file in the kernel). They are valid during
        the call only. A leader answers its followers' tail fetches from them
        (:meth:`~tidelog.broker.partition.Partition.park_at_log_end`) instead of reading the file back a turn
        of the loop later. A listener must not raise. ``end_offset`` is the log end once the write is in.

        Usually called right after the write reaches the file. A write that overwrites zero-filled room
        (:mod:`~tidelog.storage.preallocation`: a single batch under flush ``always``) is announced just before
        its ``pwritev``, so the followers' copies start while the leader's write runs: paired runs, 1 KiB
        acks-ALL writes on 3 brokers sharing 2 cores, p50 28–47 µs lower. Such a write needs no new blocks, so
        it fails only on an I/O error, and then the followers may already hold its offsets: the log is
        poisoned (it refuses appends until reopened, as after a failed fsync) rather than give the offsets to
        other batches. The followers' next fetches are beyond its end, which suspends the partition
        (:mod:`tidelog.broker.safety`) until an operator confirms the head."""
        self._tail_listeners.append(listener)

    def remove_tail_listener(self, listener: TailListener) -> None:
        if listener in self._tail_listeners:
            self._tail_listeners.remove(listener)

    @property
    def segments(self) -> list[SegmentInfo]:
        last = len(self._segments) - 1
        return [s.info(active=i == last) for i, s in enumerate(self._segments)]

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self._directory} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        self._flusher.check()

    # ------------------------------------------------------------------------------------------ appending

    async def append(
        self,
        data: Buffer,
        leader_epoch: int,
        *,
        control: bool = False,
        expected_offset: int | None = None,
        max_batch_bytes: int | None = None,
        registers: bool = False,
        on_placed: Callable[[int], None] | None = None,
        source: FileSlice | None = None,
    ) -> AppendResult:
        """Append client batches, assigning offsets from the log end; return where they landed.

        With ``expected_offset``, only when the log ends exactly there (compare-and-append, Liftbridge's
        ``expectedOffset``): otherwise :class:`OffsetMismatchError` and nothing is stored. The comparison runs
        where offsets are assigned, under the lock and with no await before the write, so no other append,
        truncation or retention run can change the log end between the check and the write.

        Every batch must pass its CRC, hold at least one record with dense offset deltas, fit
        ``max_batch_bytes``, and be a control batch exactly when ``control`` is set (control batches are
        written by the broker, never accepted from clients as data). Any failure raises
        :class:`CorruptBatchError` or :class:`InvalidBatchError` and stores nothing.

        The payload is not copied: each batch is written as a freshly packed 16-byte head (base offset,
        length, leader epoch) followed by the rest of ``data``. Mutable input is copied once first, so what
        is written is what was validated.

        A transactional append (its single batch built by the broker) passes ``max_batch_bytes`` (its own
        size limit instead of the configured one), ``registers`` (a registers block is allowed: clients'
        batches may not carry one) and ``on_placed``, called with the base offset under the lock, once the
        offsets are taken and before the write, with no await in between: it may still refuse the append by
        raising, and what it records is ordered with every other append. ``source``: the same single batch
        in a file (the append's spool), copied from there in the kernel rather than written from ``data``.
        """
        if not 0 <= leader_epoch <= MAX_LEADER_EPOCH:
            raise ValueError(f"leader_epoch must be between 0 and {MAX_LEADER_EPOCH}, got {leader_epoch}")
        view = _frozen(data)
        headers = self._validate(
            view, leader=True, control=control, max_batch_bytes=max_batch_bytes, registers=registers
        )
        tails: list[Buffer | FileSlice] = []
        position = 0
        for header in headers:
            end = position + header.batch_length + LENGTH_FIELD_END
            tails.append(view[position + _HEAD.size : end])
            position = end
        if source is not None:
            if len(headers) != 1 or source.length != len(view):
                raise ValueError(f"a source file slice stands for one whole batch, not {len(headers)} batch(es)")
            tails = [source.skip(_HEAD.size)]
        pack = _HEAD.pack

        def place() -> tuple[list[Placed], _Slicer]:
            offset = self._segments[-1].next_offset
            if expected_offset is not None and offset != expected_offset:
                raise OffsetMismatchError(expected_offset, offset)
            if on_placed is not None:
                on_placed(offset)
            if leader_epoch > self._epochs.latest_epoch:  # a new leader's first append: rare, a small file write
                self._epochs.assign(leader_epoch, offset)
            placed = []
            parts: list[Buffer | FileSlice] = []
            for header, tail in zip(headers, tails, strict=True):
                length = header.batch_length
                parts.append(pack(offset, length, leader_epoch))
                parts.append(tail)
                following = offset + header.last_offset_delta + 1
                placed.append(Placed(offset, following, length + LENGTH_FIELD_END, header.max_timestamp))
                offset = following
            return placed, lambda i, j: parts[2 * i : 2 * j]

        return await self._append(len(view), place)

    async def append_as_follower(self, data: Buffer, on_durable: Callable[[int], None] | None = None) -> AppendResult:
        """Append batches that already carry their offsets and leader epochs (copied from a leader).

        The first batch must start at or after the log end and each batch after the previous one: offsets may
        skip forward (a compacted leader has gaps) but never overlap. Stored byte-for-byte. ``on_durable(end)``
        runs the moment the batches are durable per the flush policy, with the offset after the last one, from
        inside the fsync round (:meth:`Flusher.after_write`): a follower acknowledges from there.
        """
        view = _frozen(data)
        headers = self._validate(view, leader=False, control=False)
        starts = [0]
        for header in headers:
            starts.append(starts[-1] + header.size)

        def place() -> tuple[list[Placed], _Slicer]:
            expected = self._segments[-1].next_offset
            placed = []
            for header in headers:
                if header.base_offset < expected:
                    raise InvalidBatchError(
                        f"batch at offset {header.base_offset} overlaps what the log holds (next offset {expected})"
                    )
                placed.append(Placed(header.base_offset, header.next_offset, header.size, header.max_timestamp))
                expected = header.next_offset
            for header in headers:  # only once every batch is known to fit: nothing recorded for a refused append
                if header.leader_epoch > self._epochs.latest_epoch:
                    self._epochs.assign(header.leader_epoch, header.base_offset)
            return placed, lambda i, j: [view[starts[i] : starts[j]]]

        return await self._append(len(view), place, on_durable)

    def _validate(
        self,
        data: Buffer,
        *,
        leader: bool,
        control: bool,
        max_batch_bytes: int | None = None,
        registers: bool = False,
    ) -> list[BatchHeader]:
        """Check every batch (header and CRC, one pass, no record decoding); return their headers."""
        if not len(data):
            raise InvalidBatchError("an append needs at least one batch; got no bytes")
        limit = self._config.segment_max_bytes
        if leader:
            limit = min(limit, self._config.max_batch_bytes if max_batch_bytes is None else max_batch_bytes)
        headers = []
        for position, header in iter_batches(data):
            if header.size > limit:
                raise InvalidBatchError(f"batch at byte {position} is {header.size} bytes, above the limit of {limit}")
            if leader:
                if header.record_count == 0 or header.record_count != header.last_offset_delta + 1:
                    raise InvalidBatchError(
                        f"batch at byte {position} has {header.record_count} records for "
                        f"{header.last_offset_delta + 1} offsets; a client batch needs one record per offset"
                    )
                if header.attributes & REGISTERS_FLAG and not registers:
                    raise InvalidBatchError(
                        f"batch at byte {position} carries a registers block: only a transactional append sets "
                        "registers"
                    )
                if header.is_control != control:
                    kind = "a control" if header.is_control else "a data"
                    raise InvalidBatchError(
                        f"batch at byte {position} is {kind} batch in a {'control' if control else 'data'} append"
                    )
            headers.append(header)
        return headers

    async def _append(
        self,
        size: int,
        place: Callable[[], tuple[list[Placed], _Slicer]],
        on_durable: Callable[[int], None] | None = None,
    ) -> AppendResult:
        if self._lock.locked() or self._lock_queued:
            async with self._holding_lock():
                placed, seq = self._place_and_write(place)
        else:  # free and nobody queued: nothing can run before the write either (module docstring, "Ordering")
            placed, seq = self._place_and_write(place)
        if self._write_listeners:
            end = placed[-1].next_offset
            for listener in self._write_listeners:
                listener(end)
        then = None if on_durable is None else functools.partial(on_durable, placed[-1].next_offset)
        await self._flusher.after_write(seq, then)
        return AppendResult(
            placed[0].base_offset,
            placed[-1].next_offset - 1,
            len(placed),
            size,
            placed[0].max_timestamp if len(placed) == 1 else max(p.max_timestamp for p in placed),
        )

    def _place_and_write(self, place: Callable[[], tuple[list[Placed], _Slicer]]) -> tuple[list[Placed], int]:
        """Take the offsets and write, with no await in between: nothing interleaves. Returns the placement
        with the write's sequence."""
        self._check_writable()
        placed, parts = place()
        mark = full.WriteMark.of(self._segments)
        try:
            return placed, self._write_all(placed, parts)
        except BaseException as exc:  # a full disk: undone, the log stays healthy (tidelog.storage.disk_full)
            raise full.undo_write(self._segments, mark, placed[0].base_offset, self._flusher, exc) from exc

    @contextlib.asynccontextmanager
    async def _holding_lock(self) -> AsyncIterator[None]:
        """Hold the log's lock, counted as queued while waiting for it (see the append's fast path)."""
        self._lock_queued += 1
        try:
            await self._lock.acquire()
        finally:
            self._lock_queued -= 1
        try:
            yield
        finally:
            self._lock.release()

    def _write_all(self, placed: list[Placed], parts: _Slicer) -> int:
        """Write placed batches, rolling on age, size or offset range; return the last write's sequence.

        The common case is one ``pwritev`` into the active segment. A run that does not fit is split at batch
        boundaries, each part into a fresh segment, so a batch never straddles two segments.

        The tail listeners hear of the write after it, or just before it when it overwrites zero-filled room
        (:meth:`add_tail_listener` says why and what a failure then does).
        """
        now = self._clock.now_ns()
        if self._age_expired(now):
            self._roll_now()
        max_bytes = self._config.segment_max_bytes
        active = self._segments[-1]
        if len(placed) == 1 and (  # the usual append: one batch that fits
            active.size + placed[0].size <= max_bytes
            and placed[0].next_offset - 1 - active.base_offset <= MAX_RELATIVE_OFFSET
        ):
            early = bool(self._tail_listeners) and active.size + placed[0].size <= active.preallocation.allocated
            if early:
                self._tell_tail(placed, parts)
                try:
                    active.append(parts(0, 1), placed, now)
                except BaseException as exc:
                    self._flusher.poison(exc)  # the followers may hold these offsets now: never hand them out again
                    raise
            else:
                active.append(parts(0, 1), placed, now)
            seq = self._flusher.note_write(active, placed[0].size)
            if self._preallocate:
                self._reserve_room(active, placed[0].size)
            if not early:
                self._tell_tail(placed, parts)
            return seq
        seq = 0
        i = 0
        while i < len(placed):
            active = self._segments[-1]
            room = max_bytes - active.size
            j = i
            run = 0
            while j < len(placed):
                batch = placed[j]
                if batch.next_offset - 1 - active.base_offset > MAX_RELATIVE_OFFSET:
                    break
                if run + batch.size > room and not (j == i and active.size == 0):
                    break
                run += batch.size
                j += 1
            if j == i:  # the next batch does not fit here: start a segment at its offset range
                overflow = placed[i].next_offset - 1 - active.base_offset > MAX_RELATIVE_OFFSET
                self._roll_now(placed[i].base_offset if overflow else None)
                continue
            active.append(parts(i, j), placed[i:j], now)
            seq = self._flusher.note_write(active, run)
            i = j
        if self._preallocate:
            self._reserve_room(self._segments[-1], sum(batch.size for batch in placed))
        self._tell_tail(placed, parts)
        return seq

    def _tell_tail(self, placed: list[Placed], parts: _Slicer) -> None:
        if self._tail_listeners:
            written = parts(0, len(placed))
            for tail_listener in self._tail_listeners:
                tail_listener(placed[0].base_offset, placed[-1].next_offset, written)

    def _reserve_room(self, active: Segment, appended: int) -> None:
        """Zero-fill ahead of the active segment's end in the background once its room runs low, unless the log
        is being streamed into (:mod:`~tidelog.storage.preallocation`); pinned meanwhile, so a close waits for
        the fill's descriptor."""
        rate = self._append_rate
        rate.add(appended, self._clock.monotonic_ns())
        if rate.streaming:
            return
        reserve = active.preallocation
        target = reserve.wanted(active.size, self._config.preallocate_bytes, self._config.segment_max_bytes)
        if target:
            active.pin()
            reserve.start()
            self._flusher.run_detached(functools.partial(reserve.fill, active.fd, target), active.unpin)

    def _age_expired(self, now_ns: int) -> bool:
        active = self._segments[-1]
        first = active.first_append_ns
        return bool(active.size) and first is not None and now_ns - first >= self._config.segment_max_age_ns

    # ------------------------------------------------------------------------------------------ rolling

    async def roll(self) -> None:
        """Seal the active segment and start a new one (a no-op when the active segment is empty)."""
        async with self._holding_lock():
            self._check_writable()
            self._roll_now()

    def _roll_now(self, base_offset: int | None = None) -> None:
        """Seal the active segment and create the next one, without waiting for any disk work.

        The sealed segment is made durable (data, then index files) by a background task, after which the
        recovery point moves past it (when depends on the flush policy: :func:`_seal_delay_ms`). The new
        file's directory entry is fsynced by the next flush round, before any append into it is
        acknowledged under ``ALWAYS``.
        """
        old = self._segments[-1]
        if base_offset is None:
            if not old.size:
                return
            base_offset = old.next_offset
        # Created first: a full disk refuses the roll with nothing changed.
        new = full.create_segment(self._directory, base_offset, self._config.index_interval_bytes)
        if old.trim():  # its zero-filled room: the next round fsyncs the cut, before the new segment's acks
            self._flusher.note_write(old)
        old.seal_prepare()
        self._segments.append(new)
        self._flusher.note_directory(self._directory)
        due = self._clock.monotonic_ns() + self._seal_delay_ns
        self._sealing = asyncio.get_running_loop().create_task(self._seal(old, base_offset, due, self._sealing))

    async def _seal(
        self, segment: Segment, following_base: int, due_ns: int, previous: asyncio.Task[None] | None
    ) -> None:
        """Background: make a sealed segment durable, then advance the recovery point past it.

        Seals run one after another (each awaits the previous), so the recovery point only ever moves over
        segments that are all durable. The fsync waits until ``due_ns`` (on the log's clock) unless something
        needs it sooner (:meth:`_settle`): see ``_seal_delay_ns``. A failed fsync poisons the flusher: the log
        then refuses appends. A full disk does not (:mod:`tidelog.storage.disk_full`), and a roll that a refused
        write undid is not sealed.
        """
        if previous is not None:
            await asyncio.wait([previous])
        wait_ns = due_ns - self._clock.monotonic_ns()
        if wait_ns > 0 and not self._expedite.is_set():
            timer = asyncio.ensure_future(self._clock.sleep(wait_ns / 1e9))
            expedite = asyncio.ensure_future(self._expedite.wait())
            await asyncio.wait([timer, expedite], return_when=asyncio.FIRST_COMPLETED)
            timer.cancel()
            expedite.cancel()
        if self._flusher.failed is not None or not full.still_rolled(self._segments, segment, following_base):
            return
        segment.pin()
        try:
            await self._flusher.run_blocking(full.seal_files, segment)
            if (
                following_base > self._recovery_point
                and not segment.closed
                and await self._flusher.run_blocking(full.advance_recovery_point, segment, following_base)
            ):
                self._recovery_point = following_base
        except Exception as exc:
            self._flusher.poison(exc)
        finally:
            segment.unpin()

    async def _settle(self) -> None:
        """Finish background seals now (call with the lock held, before deleting or rewriting segments)."""
        if self._sealing is not None:
            self._expedite.set()
            await asyncio.wait([self._sealing])
            self._sealing = None
            self._expedite.clear()

    async def _exclusive(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` under the lock in a shielded task (it completes even if the caller is cancelled)."""

        async def locked() -> T:
            async with self._holding_lock():
                self._check_open()
                await self._settle()
                return await operation()

        return await asyncio.shield(locked())

    # ------------------------------------------------------------------------------------------ reading

    def _locate(self, start_offset: int, max_bytes: int, max_offset: int | None) -> tuple[Segment, Planned] | None:
        self._check_open()
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, got {max_bytes}")
        start, end = self.start_offset, self.end_offset
        if not start <= start_offset <= end:
            raise OffsetOutOfRangeError(start_offset, start, end)
        limit = end if max_offset is None else min(max_offset, end)
        if self._damage:
            start_offset, limit = self._damage.plan(start_offset, limit)
        if start_offset >= limit:
            return None
        first = bisect_right(self._segments, start_offset, key=lambda s: s.base_offset) - 1
        for segment in self._segments[max(0, first) :]:
            found = segment.find(start_offset)
            if found is None:
                continue  # nothing at or after the offset here (a compacted-away range): try the next segment
            plan = segment.plan(found[0], max_bytes, limit)
            return None if plan is None else (segment, plan)
        return None

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Whole batches from the one containing ``start_offset`` (or the next one after it).

        At least one batch even if it is larger than ``max_bytes``; then as many as fit. Only batches whose
        last offset is below ``max_offset`` (an exclusive bound such as the high watermark) are returned.
        Empty at the end. Raises :class:`OffsetOutOfRangeError` outside ``[start_offset, end_offset]`` and
        :class:`OffsetDamagedError` inside a damaged range; batches before one are served, never one that
        fails its CRC (finding one records its range).
        """

        def read() -> bytes:
            located = self._locate(start_offset, max_bytes, max_offset)
            if located is None:
                return b""
            segment, plan = located
            return segment.read(plan)

        return self._around_damage(read)

    def read_range(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> FileRange | None:
        """Like :meth:`read`, but a file range to ``os.sendfile`` from; None when there is nothing to read."""

        def read() -> FileRange | None:
            located = self._locate(start_offset, max_bytes, max_offset)
            if located is None:
                return None
            segment, plan = located
            try:
                segment.verify_range(plan)
            except CorruptSegmentError:
                segment.read(plan)  # checks the plan from its first batch on: names the damaged batch exactly
                raise
            return FileRange(
                os.dup(segment.fd),
                segment.path,
                plan.position,
                plan.end - plan.position,
                plan.first_offset,
                plan.next_offset,
            )

        return self._around_damage(read)

    def _around_damage(self, read: Callable[[], T]) -> T:
        """Run ``read``; when it finds damage, record the range and read again (now bounded by it)."""
        last: CorruptSegmentError | None = None
        for _ in range(_DAMAGE_ATTEMPTS):
            try:
                return read()
            except CorruptSegmentError as exc:
                self._damage.record(exc)
                last = exc
        assert last is not None
        raise last

    async def repair_damaged(self, damaged: DamagedRange, copy: bytes) -> None:
        """Overwrite ``damaged`` with a replica's byte-identical copy (its fetch answer from ``damaged.first``)
        and forget the range; :class:`RepairRefusedError` when the copy does not fit exactly (steps:
        :mod:`tidelog.storage.damage_repair`)."""

        async def run() -> None:
            patch = locate(self._segments, damaged, covering(copy, damaged))
            await self._flusher.run_blocking(write_patch, patch)
            patch.segment.read(patch.plan)  # read back: raises CorruptSegmentError unless every CRC passes now

        await self._exclusive(run)
        self._damage.repaired(damaged)

    def offset_for_timestamp(self, timestamp_ns: int) -> int | None:
        """The first offset whose record timestamp is ≥ ``timestamp_ns``; None if there is none. A damaged batch
        there answers its base offset (and is recorded): a read from it names the damaged range."""
        self._check_open()
        for segment in self._segments:
            found = segment.batch_for_timestamp(timestamp_ns)
            if found is None:
                continue
            position, header = found
            try:
                plan = Planned(position, position + header.size, header.base_offset, header.next_offset)
                data = segment.read(plan)
                records = decode_records(data, 0, header=check_batch(data))
            except CorruptSegmentError as exc:
                self._damage.record(exc)
                return header.base_offset
            except CorruptBatchError as exc:
                raise segment.corruption(position, header.base_offset, f"records: {exc}") from None
            for record in records:  # one batch, off the hot path
                if record.timestamp >= timestamp_ns:
                    return record.offset
            return header.base_offset
        return None

    # ------------------------------------------------------------------------------------------ removing

    async def truncate_to(self, offset: int) -> None:
        """Remove everything at or after ``offset``, deleting whole segments above it.

        Batches go whole, so the end offset becomes one past the last batch kept: ``offset`` when it is a
        batch boundary, lower when it falls inside a batch (or inside a range compaction emptied). That is
        also what a reopen computes, so the end offset never changes across a restart.
        """
        seq = await self._exclusive(lambda: self._truncate_locked(offset))
        if seq:
            await self._flusher.after_write(seq)

    async def _truncate_locked(self, offset: int) -> int:
        if offset >= self.end_offset:
            return 0
        if offset < self.start_offset:
            raise OffsetOutOfRangeError(offset, self.start_offset, self.end_offset)
        removed = False
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            segment = self._segments.pop()  # newest first: a crash midway leaves a shorter, contiguous log
            self._flusher.forget(segment)
            segment.delete()
            removed = True
        if removed:
            await self._flusher.sync_directory(self._directory)
        active = self._segments[-1]
        if active.base_offset < self._recovery_point:  # it takes appends again: no longer known durable
            await self._flusher.run_blocking(write_recovery_point, self._directory, active.base_offset)
            self._recovery_point = active.base_offset
        if active.base_offset >= offset:
            active.truncate_at(0, active.base_offset)  # only when it is the last segment left
        else:
            active.truncate_to(offset)
        active.sealed = False
        self._epochs.truncate_from_end(self.end_offset)
        self._damage.forget_from(self.end_offset)
        return self._flusher.note_write(active)

    async def delete_segments_before(self, offset: int) -> list[int]:
        """Delete the sealed segments that lie wholly below ``offset``; return their base offsets.

        The active segment is never deleted. The log's start offset becomes the oldest remaining base.
        """
        return await self._exclusive(lambda: self._delete_prefix_locked(offset))

    async def _delete_prefix_locked(self, offset: int) -> list[int]:
        deleted = []
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            segment = self._segments.pop(0)  # oldest first: a crash midway leaves a contiguous suffix
            self._flusher.forget(segment)
            segment.delete()
            deleted.append(segment.base_offset)
        if deleted:
            await self._flusher.sync_directory(self._directory)
            self._epochs.truncate_from_start(self.start_offset)
            self._damage.forget_below(self.start_offset)
        return deleted

    async def apply_retention(self, now_ns: int | None = None, *, max_offset: int | None = None) -> list[int]:
        """Delete the sealed segments the retention settings allow (:mod:`tidelog.storage.retention`)."""

        async def run() -> list[int]:
            now = self._clock.now_ns() if now_ns is None else now_ns
            count = deletable_prefix(self.segments, self._config, now, self.end_offset, max_offset)
            if not count:
                return []
            return await self._delete_prefix_locked(self._segments[count].base_offset)

        return await self._exclusive(run)

    async def compact(self, upto_offset: int, now_ns: int | None = None) -> CompactionResult | None:
        """Key-compact the sealed segments wholly below ``upto_offset`` (the high watermark).

        Runs :func:`~tidelog.storage.compaction.compact_segment_files` in a worker thread under the log's
        lock, then reopens the rewritten segments and rebuilds their indexes. Readers keep reading the old
        files (through their open descriptors) until the swap. None when no segment qualifies.
        """
        return await self._exclusive(lambda: self._compact_locked(upto_offset, now_ns))

    async def _compact_locked(self, upto_offset: int, now_ns: int | None) -> CompactionResult | None:
        segments = self._segments
        candidates = [s for s, following in itertools.pairwise(segments) if following.base_offset <= upto_offset]
        if not candidates:
            return None
        now = self._clock.now_ns() if now_ns is None else now_ns
        interval = self._config.index_interval_bytes
        # Index files go first: a crash after a rename below then finds no index, never a stale one.
        await self._flusher.run_blocking(_forget_index_files, candidates, self._directory)
        reopened: dict[int, Segment] = {}
        try:
            result = await self._flusher.run_blocking(
                functools.partial(
                    compact_segment_files,
                    [s.path for s in candidates],
                    upto_offset=upto_offset,
                    now_ns=now,
                    delete_retention_ns=self._config.delete_retention_ms * 1_000_000,
                )
            )
            rewritten = set(result.rewritten)
            for segment in candidates:
                if segment.path in rewritten:
                    fresh = await self._flusher.run_blocking(
                        _reopen_sealed, self._directory, segment.base_offset, interval
                    )
                    reopened[segment.base_offset] = fresh
        finally:
            unchanged = [s for s in candidates if s.base_offset not in reopened]
            if unchanged:
                await self._flusher.run_blocking(_persist_all, unchanged)
            for i, segment in enumerate(self._segments):
                fresh_segment = reopened.get(segment.base_offset)
                if fresh_segment is not None and segment in candidates:
                    self._segments[i] = fresh_segment
                    self._flusher.forget(segment)
                    segment.close()
        return result

    # ------------------------------------------------------------------------------------------ far-horizon catch-up

    def sealed_segment_range(self, base_offset: int, position: int, max_bytes: int) -> tuple[FileRange, int] | None:
        """Raw bytes of the *sealed* segment based at ``base_offset``, from ``position``, at most ``max_bytes``,
        and the segment's size: what a follower copying whole segment files downloads. None when no sealed
        segment has that base.

        Not CRC-checked here (the copier checks every batch of the whole file); the range's ``first_offset``
        and ``next_offset`` are the segment's.
        """
        self._check_open()
        segments = self._segments
        i = bisect_left(segments, base_offset, key=lambda s: s.base_offset)
        if i >= len(segments) - 1 or segments[i].base_offset != base_offset:
            return None  # unknown, deleted, or the active segment (which fetching copies)
        segment = segments[i]
        start = min(max(0, position), segment.size)
        length = min(max(0, max_bytes), segment.size - start)
        file = FileRange(os.dup(segment.fd), segment.path, start, length, segment.base_offset, segment.next_offset)
        return file, segment.size

    async def reset_to(self, offset: int) -> None:
        """Delete every segment and the epoch history; start empty at ``offset`` (a follower whose log ends
        below its leader's log start: nothing it holds can be extended). See
        :mod:`tidelog.storage.segment_install` for what a crash leaves."""
        if offset < 0:
            raise ValueError(f"offset must not be negative, got {offset}")
        await self._exclusive(lambda: self._reset_locked(offset))

    async def _reset_locked(self, offset: int) -> None:
        while self._segments:
            segment = self._segments.pop()  # newest first: a crash midway leaves a shorter prefix
            self._flusher.forget(segment)
            segment.delete()
        try:
            self._segments.append(Segment.create(self._directory, offset, self._config.index_interval_bytes))
            await self._flusher.sync_directory(self._directory)
            self._epochs.clear()
            self._damage.forget_from(0)
            await self._flusher.run_blocking(write_recovery_point, self._directory, offset)
            self._recovery_point = offset
        except BaseException as exc:
            self._flusher.poison(exc)  # the files and this object may disagree: reopen the log
            raise

    async def install_segments(self, staged: list[StagedSegment]) -> None:
        """Append whole segment files copied from the leader, checked by
        :func:`~tidelog.storage.segment_install.verify_staged`; the first must start at (or, after a
        compaction gap, past) the log end. Each is renamed into the directory, indexed, sealed, and its leader
        epochs recorded; a new empty active segment follows them. Steps and crash safety:
        :mod:`tidelog.storage.segment_install`."""
        await self._exclusive(lambda: self._install_locked(staged))

    async def _install_locked(self, staged: list[StagedSegment]) -> None:
        check_installable(staged, self.end_offset, self.latest_epoch)
        interval = self._config.index_interval_bytes
        active = self._segments[-1]
        empty = not active.size
        installed: list[Segment] = []
        try:
            for item in staged:  # epochs first: entries past the log end are dropped when a log opens
                for epoch, start in item.epochs:
                    if epoch > self._epochs.latest_epoch:
                        self._epochs.assign(epoch, start)
            if not empty:
                active.trim()  # seal_for_install fsyncs it
                active.seal_prepare()
                await self._flusher.run_blocking(seal_for_install, active)
            replaceable = active.path if empty else None
            try:
                await self._flusher.run_blocking(
                    move_into_place, self._directory, staged, interval, replaceable, installed
                )
            except BaseException as exc:
                # The directory holds a valid prefix of the installation (what a crash would leave) but this
                # object cannot tell how much is durable: keep the files readable, refuse appends until reopened.
                self._flusher.poison(exc)
                raise
            finally:
                if installed:
                    if empty:
                        self._segments.pop()
                        self._flusher.forget(active)
                        if installed[0].base_offset == active.base_offset:
                            active.close()  # its file was replaced by the first installed one
                        else:
                            active.delete()
                    self._segments.extend(installed)
                else:
                    active.sealed = False  # still the active segment
            self._segments.append(Segment.create(self._directory, installed[-1].next_offset, interval))
            following = self._segments[-1].base_offset
            await self._flusher.run_blocking(_durable_from, self._directory, following)
            self._recovery_point = following
        finally:
            self._epochs.truncate_from_end(self.end_offset)  # nothing recorded beyond what was installed

    # ------------------------------------------------------------------------------------------ flushing

    async def flush(self) -> None:
        """fsync everything appended so far, whatever the flush policy."""
        self._check_writable()
        await self._flusher.flush()

    async def close(self) -> None:
        """Flush, write indexes out, record a clean shutdown, and close every file. Idempotent."""
        if self._closed:
            return

        async def locked() -> None:
            async with self._holding_lock():
                if self._closed:
                    return
                self._closed = True
                try:
                    await self._settle()
                    await self._flusher.close()
                    await self._flusher.run_blocking(self._finish_close)
                finally:
                    for segment in self._segments:
                        segment.close()

        await asyncio.shield(locked())

    def _finish_close(self) -> None:
        """Blocking: persist every index, then the clean-shutdown marker (only after all else is durable; on a
        full disk neither, and the next open recovers: :func:`~tidelog.storage.disk_full.close_files`)."""
        last = self._segments[-1]
        if last.trim():
            last.sync()
        full.close_files(self._segments, self._directory)

    def __repr__(self) -> str:
        return f"Log({self._directory}, offsets {self.start_offset}..{self.end_offset}, {len(self._segments)} segments)"
