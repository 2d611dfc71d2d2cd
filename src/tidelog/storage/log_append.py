"""Appending: validating client batches, placing them at the log end, and writing them.

:meth:`AppendingLog.append` takes one or more whole batches exactly as a client sent them. It validates each
batch once (header sanity and CRC; per-batch work, records are never decoded) and assigns offsets by giving
each batch a freshly packed 16-byte head (base offset, length, leader epoch: the CRC does not cover them).
The run is written with one ``pwritev`` of those heads interleaved with the rest of the client's buffer, so
the payload is never copied in Python. Batches that do not fit the active segment roll it; the split falls on
batch boundaries. Then the append waits for the flush policy (:mod:`tidelog.storage.flush`).
:meth:`AppendingLog.append_as_follower` writes batches that already carry offsets (replication) byte for byte.

Each write is told to the log's write observers (:mod:`tidelog.storage.write_observer`); zero-filled room ahead
of the active segment is kept under flush ``always`` (:mod:`tidelog.storage.preallocation`); a write refused by
a full disk is undone (:mod:`tidelog.storage.disk_full`).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass

from tidelog.protocol.records import LEADER_EPOCH_POS, LENGTH_FIELD_END, REGISTERS_FLAG, BatchHeader, iter_batches
from tidelog.protocol.records.errors import InvalidBatchError
from tidelog.storage import disk_full as full
from tidelog.storage.errors import OffsetMismatchError
from tidelog.storage.file_writes import Buffer, FileSlice
from tidelog.storage.log_sealing import SealingLog
from tidelog.storage.segment import Segment
from tidelog.storage.segment_state import MAX_RELATIVE_OFFSET, Placed
from tidelog.storage.write_observer import WriteObserver

MAX_LEADER_EPOCH = 2**31 - 1
_HEAD = struct.Struct(">qii")  # the first 16 header bytes: base offset, batch length, leader epoch
_Slicer = Callable[[int, int], list[Buffer | FileSlice]]  # (first batch, end batch) -> what writes them
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


class AppendingLog(SealingLog):
    """Append (as a leader or a follower) and tell the write observers."""

    def add_write_observer(self, observer: WriteObserver) -> None:
        """Tell ``observer`` of every write from now on (:mod:`tidelog.storage.write_observer`)."""
        self._observers.append(observer)
        self._sort_observers()

    def remove_write_observer(self, observer: WriteObserver) -> None:
        """Stop telling ``observer`` (a partition this broker stopped leading keeps its log open)."""
        if observer in self._observers:
            self._observers.remove(observer)
            self._sort_observers()

    def _sort_observers(self) -> None:
        self._early_observers = [o for o in self._observers if o.before_write]
        self._late_observers = [o for o in self._observers if not o.before_write]

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
        inside the fsync round (:meth:`Flusher.after_write`): a follower acknowledges from there. An I/O error
        (writing the batches or the epoch checkpoint) poisons the log, as a failed fsync does.
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

        try:
            return await self._append(len(view), place, on_durable)
        except OSError as exc:  # an I/O error (not a full disk): refuse appends until the broker reopens the log
            if not full.is_disk_full(exc):  # (tidelog.broker.partitions.failed_logs), as a leader's does
                self._flusher.poison(exc)
            raise

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
        else:  # free and nobody queued: nothing can run before the write either (log_state, "Ordering")
            placed, seq = self._place_and_write(place)
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

    def _write_all(self, placed: list[Placed], parts: _Slicer) -> int:
        """Write placed batches, rolling on age, size or offset range; return the last write's sequence.

        The common case is one ``pwritev`` into the active segment. A run that does not fit is split at batch
        boundaries, each part into a fresh segment, so a batch never straddles two segments.

        The write observers hear of the write after it, or, those that ask, just before it when it overwrites
        zero-filled room (:mod:`tidelog.storage.write_observer` says why and what a failure then does).
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
            early = bool(self._early_observers) and active.size + placed[0].size <= active.preallocation.allocated
            if early:
                self._tell(self._early_observers, placed, parts)
                try:
                    active.append(parts(0, 1), placed, now)
                except BaseException as exc:
                    self._flusher.poison(exc)  # an observer may have passed these offsets on: never reuse them
                    raise
            else:
                active.append(parts(0, 1), placed, now)
            seq = self._flusher.note_write(active, placed[0].size)
            if self._preallocate:
                self._reserve_room(active, placed[0].size)
            self._tell(self._late_observers if early else self._observers, placed, parts)
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
        self._tell(self._observers, placed, parts)
        return seq

    @staticmethod
    def _tell(observers: list[WriteObserver], placed: list[Placed], parts: _Slicer) -> None:
        if observers:
            written = parts(0, len(placed))
            for observer in observers:
                observer.on_write(placed[0].base_offset, placed[-1].next_offset, written)

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
