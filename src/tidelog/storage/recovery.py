"""Opening a partition directory: decide what can be trusted, rescan what cannot, cut a torn tail.

Two small files (checkpoint format, written atomically) say how much can be trusted:

- ``recovery-point``: an offset below which every segment is durable, data and index files included. When a
  roll seals a segment, a background task fsyncs it (the appender does not wait: a synchronous fsync of a
  128 MiB segment would stall appends under the ``never`` policy; that policy even lets the kernel's own
  write-back go first, see ``log._seal_delay_ms``) and then advances the recovery point to the next
  segment's base (Kafka's recovery point). Truncation that reopens an older segment lowers it first.
- ``clean-shutdown``: the last segment's base offset and size, written by ``Log.close`` after everything
  was fsynced. Read and removed at open (the removal made durable before the log writes anything), so a
  later crash is never mistaken for a clean stop. It spares a clean restart a read of the active segment.

What recovery does, in order:

1. Take the clean-shutdown marker; read the recovery point (missing or damaged: 0, which is always safe).
2. Remove leftovers: ``*.cleaned`` (a compaction that did not reach its rename: the original is intact),
   ``*.index.tmp`` / ``*.timeindex.tmp`` (an index rewrite that did not finish), and index files whose
   ``.log`` is gone (a deletion that stopped half-way). Other files (checkpoints) are left alone.
3. Trusted segments — all of them after a clean shutdown, else those below the recovery point except the
   last: load their index files after sanity checks (entries increasing, positions inside the file, the last
   entry naming the batch found there) and read only the headers after the last indexed batch. An index that
   fails is rebuilt by scanning the segment with CRCs. A bad batch in a trusted segment is **not** cut: its
   bytes stay and reads that reach it raise ``CorruptSegmentError`` naming the offsets.
4. The others (the last segment, and any at or above the recovery point), in offset order: every batch is read
   and CRC-checked. At the first batch that is torn, fails its CRC or goes back in offsets, recovery looks at
   what follows (:func:`~tidelog.storage.recovery_damage.find_damage`):

   - nothing valid: a **torn tail**. That segment is cut there (and fdatasynced) and every later segment
     deleted: what a crash can tear is data nobody was promised, and the log must stay a clean prefix.
   - only bytes after a segment's last batch are bad and the next segment goes on at the next offset (a lost
     write at a roll): nothing is missing, those bytes are trimmed (logged), the later segments kept.
   - CRC-valid batches at higher offsets: **damage in the middle** (bit rot, a bad sector; not a crash). The
     batches after it were most likely acknowledged, so recovery does not cut by itself: it raises
     :class:`~tidelog.storage.recovery_damage.DamagedLogError` naming the damaged offsets and what follows, and
     leaves every file as it was. Only when the caller allows it (``truncate_damaged``: an operator's word,
     or a replica that will fetch the range again) is the log cut there like a torn tail.

   Every cut is logged (WARNING, with the directory, segment, byte position and offsets) and counted on the
   report. The scanned segments are then fsynced and the recovery point moved up to the last segment.
   Zeros after the last segment's final batch are room written ahead of appends
   (:mod:`~tidelog.storage.preallocation`): trimmed, and counted apart from cuts.

After a process crash (SIGKILL) the page cache still holds everything, so nothing is cut; cuts happen after a
power loss or kernel crash, or when the disk damaged data that was never fsynced.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.atomic import fsync_directory, write_atomically
from tidelog.storage.checkpoint import decode_checkpoint, encode_checkpoint
from tidelog.storage.compaction import CLEANED_SUFFIX
from tidelog.storage.errors import CheckpointError
from tidelog.storage.index import TMP_SUFFIX, DamagedIndexError
from tidelog.storage.recovery_damage import DamagedLogError, RecoveryDamage, find_damage
from tidelog.storage.segment import Segment
from tidelog.storage.segment_state import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX

log = logging.getLogger(__name__)

ZERO_CHECK_CHUNK = 1024 * 1024
MARKER_FILE = "clean-shutdown"
RECOVERY_POINT_FILE = "recovery-point"


@dataclass(slots=True)
class RecoveryReport:
    """What opening the directory found and did (for logs, metrics and tests)."""

    clean_shutdown: bool = False
    recovery_point: int = 0
    """After recovery: every segment below this offset is durable."""
    scanned: list[int] = field(default_factory=list)
    """Base offsets of segments whose batches were all read and CRC-checked."""
    rebuilt_indexes: list[int] = field(default_factory=list)
    truncated_bytes: int = 0
    """Bytes cut from the tail of the log (not counting deleted segments or zeros written ahead)."""
    preallocated_bytes: int = 0
    """Zeros written ahead of the last segment's end (:mod:`~tidelog.storage.preallocation`), trimmed: not a cut."""
    truncated_at: tuple[int, int] | None = None
    """(segment base offset, position) where the log was cut."""
    deleted_segments: list[int] = field(default_factory=list)
    """Segments after a cut, deleted."""
    corrupt_segments: list[int] = field(default_factory=list)
    """Trusted segments holding a bad batch (kept; reads report it)."""
    removed_files: list[str] = field(default_factory=list)
    cuts: int = 0
    """How many times recovery cut the log (0 or 1 per open: a torn tail, or damage it was allowed to cut)."""
    cut_from_offset: int | None = None
    """The first offset cut: the log's end offset after the cut."""
    trimmed_bad_tails: list[int] = field(default_factory=list)
    """Segments (not the last) whose bad bytes after their last batch were cut, the next one starting at their
    next offset: no offset lost, so not counted as a cut."""
    damage: RecoveryDamage | None = None
    """Damage in the middle that recovery was allowed to cut (the intact batches after it went with it)."""


# ----------------------------------------------------------------------------------------------- marker files


def write_clean_marker(directory: Path, last_base: int, last_size: int) -> None:
    """Record a clean shutdown (blocking; atomic and durable). Call only after every file is fsynced."""
    write_atomically(directory / MARKER_FILE, encode_checkpoint(MARKER_FILE, 2, [(last_base, last_size)]))


def write_recovery_point(directory: Path, offset: int) -> None:
    """Record that every segment below ``offset`` is durable (blocking; atomic and durable)."""
    write_atomically(directory / RECOVERY_POINT_FILE, encode_checkpoint(RECOVERY_POINT_FILE, 1, [(offset,)]))


def _read_entry(path: Path, fields: int) -> tuple[int, ...] | None:
    try:
        entries = decode_checkpoint(path.read_bytes(), path.name, fields, path=str(path))
    except (FileNotFoundError, CheckpointError):
        return None
    return entries[0] if len(entries) == 1 else None


def _take_clean_marker(directory: Path) -> tuple[int, ...] | None:
    """Read the marker, then remove it; a missing or damaged marker counts as no clean shutdown."""
    path = directory / MARKER_FILE
    entry = _read_entry(path, 2)
    path.unlink(missing_ok=True)
    return entry


def _read_recovery_point(directory: Path) -> int:
    entry = _read_entry(directory / RECOVERY_POINT_FILE, 1)
    return 0 if entry is None else max(0, entry[0])


# ----------------------------------------------------------------------------------------------- recovery


def _base_of(name: str, suffix: str) -> int | None:
    stem = name[: -len(suffix)]
    return int(stem) if name.endswith(suffix) and len(stem) == 20 and stem.isdigit() else None


def _remove_leftovers(directory: Path, bases: set[int], report: RecoveryReport) -> None:
    for entry in os.scandir(directory):
        name = entry.name
        stray = name.endswith((CLEANED_SUFFIX, INDEX_SUFFIX + TMP_SUFFIX, TIMEINDEX_SUFFIX + TMP_SUFFIX))
        if not stray:
            for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                base = _base_of(name, suffix)
                if base is not None and base not in bases:
                    stray = True
        if stray and entry.is_file():
            os.unlink(entry.path)
            report.removed_files.append(name)


def _load_trusted(segment: Segment, report: RecoveryReport) -> None:
    """Trust a durable segment's indexes if they pass their checks, else rebuild them from its batches."""
    try:
        segment.load_indexes()
    except DamagedIndexError:
        result = segment.rebuild(verify=True, keep_tail=True)
        report.rebuilt_indexes.append(segment.base_offset)
        report.scanned.append(segment.base_offset)
        if result.error is not None:
            report.corrupt_segments.append(segment.base_offset)
        segment.persist_indexes()
        return
    if segment.corrupt_from is not None:
        report.corrupt_segments.append(segment.base_offset)


def _scan(segments: list[Segment], i: int, report: RecoveryReport, *, truncate_damaged: bool) -> bool:
    """CRC-check every batch of untrusted ``segments[i]``; cut it at the first bad one. True if it was cut.

    Zeros after the last batch of the *last* segment are room written ahead of appends, not damage: they are
    trimmed without a cut. Any other segment was trimmed, durably, before anything was acknowledged in the
    next one, so a zero tail there is what a lost write left and is cut like any other bad tail. A bad batch
    with intact batches after it raises :class:`DamagedLogError` unless ``truncate_damaged``.
    """
    segment = segments[i]
    file_size = segment.size
    result = segment.rebuild(verify=True, keep_tail=False)
    report.scanned.append(segment.base_offset)
    report.rebuilt_indexes.append(segment.base_offset)
    segment.corrupt_from = None
    if result.end == file_size:
        return False
    last = i == len(segments) - 1
    if last and _all_zeros(segment.fd, result.end, file_size):
        segment.cut_file(result.end)
        report.preallocated_bytes += file_size - result.end
        return False
    damage = find_damage(segments, i, result.end, str(result.error))
    if damage is not None and damage.bad_tail_only and damage.next_good_segment != segment.base_offset:
        segment.cut_file(result.end)  # nothing lost: the next segment goes on at the next offset
        report.trimmed_bad_tails.append(segment.base_offset)
        log.warning("recovery of %s trimmed %s", segment.path.parent, damage.describe())
        return False
    if damage is not None and not truncate_damaged:
        raise DamagedLogError(str(segment.path.parent), damage)
    segment.cut_file(result.end)
    report.truncated_bytes += file_size - result.end
    report.truncated_at = (segment.base_offset, result.end)
    report.cut_from_offset = segment.next_offset
    report.damage = damage
    report.cuts += 1
    return True


def _all_zeros(fd: int, start: int, end: int) -> bool:
    """Whether bytes ``[start, end)`` of the file are all zeros (read in 1 MiB steps)."""
    while start < end:
        chunk = os.pread(fd, min(ZERO_CHECK_CHUNK, end - start), start)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        start += len(chunk)
    return True


def recover(
    directory: Path, index_interval_bytes: int, *, truncate_damaged: bool = False
) -> tuple[list[Segment], RecoveryReport]:
    """Open every segment of ``directory`` (created if missing) in offset order, repairing as described above.

    Blocking: reads, truncates and fsyncs. Always returns at least one segment; the last one is active.
    Raises :class:`DamagedLogError` for damage in the middle unless ``truncate_damaged`` (then nothing was
    changed but the clean-shutdown marker, removed, and leftovers).
    """
    report = RecoveryReport()
    directory.mkdir(parents=True, exist_ok=True)
    marker = _take_clean_marker(directory)
    recovery_point = _read_recovery_point(directory)
    bases = sorted(b for b in (_base_of(name, LOG_SUFFIX) for name in os.listdir(directory)) if b is not None)
    _remove_leftovers(directory, set(bases), report)
    segments: list[Segment] = []
    try:
        if not bases:
            segments.append(Segment.create(directory, 0, index_interval_bytes))
        else:
            segments.extend(Segment.open(directory, base, index_interval_bytes) for base in bases)
            last = segments[-1]
            report.clean_shutdown = marker == (last.base_offset, last.size)
            _recover_segments(segments, recovery_point, report, truncate_damaged=truncate_damaged)
        report.recovery_point = segments[-1].base_offset
        if report.recovery_point != recovery_point:
            write_recovery_point(directory, report.recovery_point)
        fsync_directory(directory)
        _log_cut(directory, report)
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return segments, report


def _recover_segments(
    segments: list[Segment], recovery_point: int, report: RecoveryReport, *, truncate_damaged: bool
) -> None:
    scanned: list[Segment] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if report.clean_shutdown or (segment.base_offset < recovery_point and not last):
            _load_trusted(segment, report)
        else:
            scanned.append(segment)
            if _scan(segments, i, report, truncate_damaged=truncate_damaged) and not last:
                for later in reversed(segments[i + 1 :]):  # newest first, as truncation does
                    later.delete()
                    report.deleted_segments.insert(0, later.base_offset)
                del segments[i + 1 :]
                break
        if segment.corrupt_from is not None and not last:
            segment.next_offset = max(segment.next_offset, segments[i + 1].base_offset)
    for segment in segments[:-1]:
        segment.sealed = True
    for segment in scanned:  # what was scanned is durable from here on, so the recovery point can move up
        segment.sync()
        if segment is not segments[-1]:
            segment.persist_indexes()


def batch_epochs(segments: list[Segment]) -> Iterator[tuple[int, int]]:
    """Leader epoch and base offset of every readable batch, in offset order (to rebuild the epoch cache).

    Headers only, no CRC check; a segment's scan stops at its first unreadable batch (damage stays reported by
    reads, and the epochs after it are found again in later batches of that epoch or the next)."""
    for segment in segments:
        end = segment.size if segment.corrupt_from is None else segment.corrupt_from
        try:
            for _, header in segment.scan(0, end, verify=False):
                yield header.leader_epoch, header.base_offset
        except CorruptBatchError:
            continue


def _log_cut(directory: Path, report: RecoveryReport) -> None:
    """Say what recovery cut, with offsets: never silently."""
    if report.truncated_at is None:
        return
    base, position = report.truncated_at
    deleted = f"; deleted the later segment(s) starting at {report.deleted_segments}" if report.deleted_segments else ""
    if report.damage is not None:
        log.warning(
            "recovery of %s cut damaged data as allowed (recovery_truncate_damaged or a replica to fetch it from): "
            "%s; the log now ends at offset %d (%d byte(s) cut from segment %d at byte %d%s)",
            directory,
            report.damage.describe(),
            report.cut_from_offset,
            report.truncated_bytes,
            base,
            position,
            deleted,
        )
        return
    log.warning(
        "recovery of %s cut a torn tail (a crash in the middle of a write; nothing valid after it): %d byte(s) "
        "from segment %d at byte %d, the log now ends at offset %d%s",
        directory,
        report.truncated_bytes,
        base,
        position,
        report.cut_from_offset,
        deleted,
    )
