"""Installing whole segment files copied from a leader (far-horizon catch-up), and resetting a log.

A follower too far behind its leader copies the leader's *sealed* segment files instead of fetching their
batches (:mod:`tidelog.replication.follower.catch_up`). It downloads them into a staging directory inside the
partition directory (:data:`STAGING_DIR`), checks them with :func:`verify_staged` and hands the result to
:meth:`Log.install_segments`, which runs :func:`install_files` under its lock, in a worker thread.

What installing does, and why in this order (a crash may stop it anywhere)::

    1. leader epochs of the new batches  → leader-epoch-checkpoint   (entries past the log end are dropped at open)
    2. the active segment: non-empty → fdatasync + index files (it becomes sealed); empty → replaced or deleted
    3. per file, in offset order: rename staging → {base}.log, fsync the directory   (one segment at a time)
    4. per file: index files rebuilt from its batch headers and fsynced
    5. a new empty active segment at the last file's next offset, fsync the directory
    6. the recovery point moves to it (everything below is durable)

- Step 3 fsyncs the directory after *each* rename, so a crash never keeps a later segment without an earlier
  one: the log is always a contiguous, prefix-consistent copy of the leader's. A renamed file's bytes were
  fsynced in staging before the rename.
- Until step 6 the installed segments lie at or above the recovery point, so recovery CRC-checks them and
  rebuilds their indexes whatever step 4 got to; a missing active segment is no problem either (the last
  installed file simply becomes the active one).
- Epochs go first for the same reason batches do in an append: the epoch cache already drops entries that
  start at or past the log end when a log opens, so early entries are harmless, late ones would be lost.
- The staging directory is removed whenever a log opens (:func:`discard_staging`): whatever a crash left there
  was never part of the log.

:meth:`Log.reset_to` (a follower whose log ends below the leader's start) deletes every segment, newest first,
then creates an empty one at the new start and clears the epoch cache: a crash midway leaves a shorter prefix
of the old log, or an empty log, and an empty log is as consistent a prefix as any.

The log runs these steps under its lock and keeps its list of segments on the event loop thread: the worker
thread only touches files and segments that readers cannot see yet.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.protocol.records.errors import CorruptBatchError, InvalidBatchError
from tidelog.storage.atomic import fsync_directory
from tidelog.storage.segment import Segment
from tidelog.storage.segment_state import LOG_SUFFIX, MAX_RELATIVE_OFFSET, segment_name

STAGING_DIR = "catch-up.tmp"
"""Where copied segment files wait, inside the partition directory; never part of the log."""


@dataclass(frozen=True, slots=True)
class StagedSegment:
    """A downloaded segment file that :func:`verify_staged` read whole: every batch passed its CRC, offsets
    increase from ``base_offset`` and the last batch ends exactly at the end of the file.

    ``epochs`` are ``(leader epoch, first offset)`` wherever the leader epoch of its batches changes, in order:
    what the epoch cache must learn when the file is installed."""

    path: Path
    base_offset: int
    next_offset: int
    size: int
    epochs: tuple[tuple[int, int], ...]


def staging_directory(log_directory: Path) -> Path:
    return log_directory / STAGING_DIR


def discard_staging(log_directory: Path) -> None:
    """Remove a staging directory a crash or a failed catch-up left behind (blocking)."""
    staging = staging_directory(log_directory)
    if staging.exists():
        shutil.rmtree(staging)


def verify_staged(path: Path, base_offset: int) -> StagedSegment:
    """Check a downloaded segment file batch by batch (headers and CRCs, no record decoding); blocking.

    Raises :class:`CorruptBatchError` for a torn or damaged batch and :class:`InvalidBatchError` for batches
    that cannot belong to a segment based at ``base_offset`` (offsets going back, or out of its range).
    """
    directory = path.parent
    if path.name != segment_name(base_offset) + LOG_SUFFIX:
        raise InvalidBatchError(f"{path.name} is not the file of a segment based at {base_offset}")
    segment = Segment.open(directory, base_offset, 1 << 30)  # a reader only: its indexes are never written
    segment.pin()  # a worker thread reads it: its descriptor is not released meanwhile (open_files)
    try:
        size = segment.size
        expected = base_offset
        epochs: list[tuple[int, int]] = []
        end = 0
        for position, header in segment.scan(0, size, verify=True):
            if header.base_offset < expected or header.last_offset - base_offset > MAX_RELATIVE_OFFSET:
                raise InvalidBatchError(
                    f"{path.name}: batch at byte {position} holds offset {header.base_offset}, expected {expected}+"
                )
            if not epochs or header.leader_epoch != epochs[-1][0]:
                if epochs and header.leader_epoch < epochs[-1][0]:
                    raise InvalidBatchError(f"{path.name}: leader epoch goes back at offset {header.base_offset}")
                epochs.append((header.leader_epoch, header.base_offset))
            expected = header.next_offset
            end = position + header.size
        if end != size:  # scan raises on a torn batch; this is only a belt for an empty file
            raise CorruptBatchError(f"{path.name}: {size - end} bytes after the last batch", position=end)
        if not epochs:
            raise InvalidBatchError(f"{path.name}: a sealed segment with no batch")
    finally:
        segment.unpin()
        segment.close()
    return StagedSegment(path, base_offset, expected, size, tuple(epochs))


def check_installable(staged: Sequence[StagedSegment], log_end: int, latest_epoch: int) -> None:
    """Refuse files that do not extend the log: each must start at or after the end of what precedes it.

    Equality is the rule; a gap is accepted as :meth:`Log.append_as_follower` accepts one (a leader's
    compaction can leave offsets with no batch between two segments), an overlap never.
    """
    if not staged:
        raise InvalidBatchError("nothing to install")
    end, epoch = log_end, latest_epoch
    for item in staged:
        if item.base_offset < end:
            raise InvalidBatchError(f"segment {item.base_offset} overlaps what the log holds (next offset {end})")
        if item.epochs[0][0] < epoch:
            raise InvalidBatchError(
                f"segment {item.base_offset} starts in leader epoch {item.epochs[0][0]}, older than {epoch}"
            )
        end, epoch = item.next_offset, item.epochs[-1][0]


def seal_for_install(active: Segment) -> None:
    """Step 2 for a non-empty active segment (blocking): its data and index files durable, as a roll's seal."""
    active.sync()
    active.persist_indexes()


def move_into_place(
    directory: Path,
    staged: Sequence[StagedSegment],
    index_interval_bytes: int,
    replaceable: Path | None,
    installed: list[Segment],
) -> None:
    """Steps 3 and 4 (blocking): rename each file into ``directory`` and build its indexes.

    ``replaceable`` is the path of an *empty* active segment, which a file of the same name may replace in one
    rename (after a reset the log is an empty segment at exactly the first file's base). Each opened segment is
    appended to ``installed`` as soon as its file is in place, so a caller that sees an exception still knows
    which files became part of the directory: they form a valid prefix, exactly what a crash would leave.
    """
    for item in staged:
        target = directory / (segment_name(item.base_offset) + LOG_SUFFIX)
        if target != replaceable and target.exists():
            raise InvalidBatchError(f"{target.name} already exists in {directory}")
        os.replace(item.path, target)
        installed.append(Segment.open(directory, item.base_offset, index_interval_bytes))
        fsync_directory(directory)  # before the next rename: a crash never keeps a later file without this one
        segment = installed[-1]
        result = segment.rebuild(verify=False, keep_tail=False)
        if result.error is not None or result.end != item.size or segment.next_offset != item.next_offset:
            raise CorruptBatchError(f"{target.name} changed after it was verified", position=result.end)
        segment.persist_indexes()
        segment.sealed = True
    fsync_directory(directory)  # the index files' names
