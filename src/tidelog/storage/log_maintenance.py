"""Maintenance: truncation, retention, compaction, repair of damaged bytes, reset, and install of copied segments.

Each runs under the log's lock in a *shielded* task (:meth:`~tidelog.storage.log_sealing.SealingLog._exclusive`),
with its disk work in a worker thread: if the caller is cancelled the operation still completes. Pending seals
are settled first, so nothing here deletes or rewrites a segment a background seal still holds. Deleting goes
newest first for a truncation and oldest first for retention, so a crash midway leaves a contiguous log.
Install of whole segment files copied from a leader (far-horizon catch-up): :mod:`tidelog.storage.segment_install`.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

from tidelog.storage.atomic import fsync_directory
from tidelog.storage.compaction import CompactionResult, compact_segment_files
from tidelog.storage.damage import DamagedRange
from tidelog.storage.damage_repair import covering, locate, write_patch
from tidelog.storage.errors import OffsetOutOfRangeError
from tidelog.storage.log_sealing import SealingLog
from tidelog.storage.recovery import write_recovery_point
from tidelog.storage.retention import deletable_prefix
from tidelog.storage.segment import Segment
from tidelog.storage.segment_install import StagedSegment, check_installable, move_into_place, seal_for_install


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


class MaintainedLog(SealingLog):
    """Truncate, delete a prefix, apply retention, compact, repair, reset, install."""

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
        self._flusher.cut_durable(self.end_offset)
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
        # Pinned until the swap: a descriptor released meanwhile would reopen the rewritten file by its name.
        for segment in candidates:
            segment.pin()
        reopened: dict[int, Segment] = {}
        try:
            # Index files go first: a crash after a rename below then finds no index, never a stale one.
            await self._flusher.run_blocking(_forget_index_files, candidates, self._directory)
            result = await self._flusher.run_blocking(
                functools.partial(
                    compact_segment_files,
                    [s.path for s in candidates],
                    upto_offset=upto_offset,
                    now_ns=now,
                    delete_retention_ns=self._config.delete_retention_ms * 1_000_000,
                    min_lag_ns=self._config.compact_min_lag_ms * 1_000_000,
                    workers=self._config.compact_workers,
                    keyring=self.keyring,
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
            for segment in candidates:
                segment.unpin()  # a replaced one closes here
        return result

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
            self._flusher.cut_durable(offset, exact=True)
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
        active.pin()  # its file may be replaced under its name: never released and reopened meanwhile
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
            active.unpin()
            self._epochs.truncate_from_end(self.end_offset)  # nothing recorded beyond what was installed
