"""A full disk refuses writes; it never takes the log down.

Two kinds of failure look alike (an ``OSError``) but call for opposite answers:

- **Unknown durability: poison.** A failed ``fsync`` may have dropped dirty pages the kernel will never write
  again (fsyncgate), whatever its errno (``ENOSPC`` included: delayed allocation reports it there). The flusher
  then stays failed and the log refuses appends until it is reopened and rescanned (:mod:`tidelog.storage.flush`).
- **A refused write: undo.** A ``pwritev`` or ``copy_file_range`` that fails (``ENOSPC``/``EDQUOT``: the
  filesystem could not allocate blocks), or a roll that cannot create its segment, has changed nothing below
  the log's committed end, and nothing of it was acknowledged or handed out yet. The log undoes it — the file
  is cut back to its last whole batch (shrinking never needs space), segments created for it are deleted, the
  segment it rolled is active again — and raises; a full disk raises
  :class:`~tidelog.storage.errors.DiskFullError`, and the next write succeeds as soon as space is freed.
  Recovery would cut such a partial write too: it is a torn, unacknowledged tail.

A write into zero-filled room (:mod:`~tidelog.storage.preallocation`) is announced to the followers before its
``pwritev``; it needs no new blocks, so it fails only on an I/O error, and then the followers may already hold
its offsets: that failure poisons (:mod:`~tidelog.storage.write_observer`). So does an undo that
fails itself.

A sealed segment's index files and the recovery point are derived data: a full disk while the background seal
writes them is logged and the seal goes on (recovery rebuilds or extends a short index and scans from an older
recovery point). The seal's ``fsync`` of the segment's data still poisons when it fails. Closing a log on a full
disk likewise writes no clean-shutdown marker and says so: the next open recovers, as after a crash.
"""

from __future__ import annotations

import errno
import logging
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from tidelog.storage.errors import DiskFullError
from tidelog.storage.flush import Flusher
from tidelog.storage.recovery import write_clean_marker, write_recovery_point
from tidelog.storage.segment import Segment

log = logging.getLogger(__name__)

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the filesystem has no room (no space left, or the quota is used up)."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def disk_full(exc: OSError, what: str) -> DiskFullError:
    """The error a caller sees for a write refused on a full disk."""
    return DiskFullError(
        f"the disk is full: {what} was refused and nothing of it kept ({exc.strerror or exc}); "
        "writes resume once space is freed"
    )


@dataclass(frozen=True, slots=True)
class WriteMark:
    """Where the log's segments stood before a write: enough to undo it."""

    segments: int
    """How many segments the log had."""
    size: int
    """The committed size of the segment that was active."""

    @classmethod
    def of(cls, segments: list[Segment]) -> WriteMark:
        return cls(len(segments), segments[-1].size)


def undo_write(
    segments: list[Segment], mark: WriteMark, first_offset: int, flusher: Flusher, error: BaseException
) -> BaseException:
    """A write that began at ``mark`` (its first batch at ``first_offset``) failed with ``error``: return what
    to raise. A failed write or roll is undone (module docstring) and its error returned, a full disk's as a
    DiskFullError; if the undo fails, the flusher is poisoned. Synchronous: nothing else runs in between."""
    if flusher.failed is not None or not isinstance(error, OSError | DiskFullError):
        return error  # already poisoned (a write into zero-filled room), or not a failed write at all
    try:
        while len(segments) > mark.segments:  # created for this write (rolls): never acknowledged, never sealed
            created = segments.pop()
            flusher.forget(created)
            created.delete()  # the directory is dirty already: the next round fsyncs the removal
        active = segments[-1]
        active.sealed = False  # a roll of this write had sealed it; its pending seal skips it (still_rolled)
        if active.size > mark.size:
            active.truncate_at(mark.size, first_offset)
        else:
            active.cut_file(active.size)  # a partial pwritev past the committed size
    except Exception as exc:
        log.error("%s: could not undo a write refused on a full disk: %s", segments[-1].directory, exc)
        flusher.poison(exc)
        return error
    if isinstance(error, OSError) and is_disk_full(error):
        return disk_full(error, "the write")
    return error


def create_segment(directory: Path, base_offset: int, index_interval_bytes: int) -> Segment:
    """:meth:`Segment.create`, refused with a DiskFullError when the disk is full (a roll makes it first)."""
    try:
        return Segment.create(directory, base_offset, index_interval_bytes)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(exc, f"a new segment at offset {base_offset}") from exc
        raise


def still_rolled(segments: list[Segment], segment: Segment, following_base: int) -> bool:
    """Whether ``segment`` is still sealed, followed by a segment based at ``following_base``: a background seal
    whose roll was undone (:func:`undo_write`), or redone at another offset since, has nothing to do."""
    i = bisect_left(segments, segment.base_offset, key=lambda s: s.base_offset)
    return (
        i + 1 < len(segments)
        and segments[i] is segment
        and segment.sealed
        and segments[i + 1].base_offset == following_base
    )


def seal_files(segment: Segment) -> None:
    """Blocking: make a sealed segment durable (the data's fsync raises; its index files on a full disk are
    logged and left short: derived data, :meth:`Segment.persist_indexes` rewrites them whole next time)."""
    segment.sync()
    try:
        segment.persist_indexes()
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        log.warning("%s: index files not written, the disk is full (rebuilt if needed): %s", segment.path, exc)


def advance_recovery_point(segment: Segment, offset: int) -> bool:
    """Blocking: move the recovery point to ``offset``; False (logged) when the disk is full: it stays where it
    was, which only makes a crash recovery scan more."""
    try:
        write_recovery_point(segment.directory, offset)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        log.warning("%s: recovery point not moved to %d, the disk is full: %s", segment.directory, offset, exc)
        return False
    return True


def close_files(segments: list[Segment], directory: Path) -> None:
    """Blocking, at a log's close (its data already fsynced): persist every index, then the clean-shutdown
    marker. On a full disk the marker is not written (logged): the close completes, and the next open scans."""
    try:
        for segment in segments:
            segment.persist_indexes()
        last = segments[-1]
        write_clean_marker(directory, last.base_offset, last.size)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        log.warning(
            "%s: closed without a clean-shutdown marker, the disk is full (the next open recovers): %s", directory, exc
        )
