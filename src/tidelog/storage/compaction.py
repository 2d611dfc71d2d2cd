"""Key compaction of sealed segment files: keep the newest record per key, below the high watermark only.

Compaction works on files, not on a live log: the caller (the log, under its lock) passes the paths of sealed
``{base_offset:020d}.log`` segments in offset order and the high watermark as ``upto_offset``. Two passes:

1. :func:`build_offset_map` reads every record below ``upto_offset`` and maps each key to its newest offset;
2. :func:`compact_segment_files` rewrites each segment keeping, of every batch that lies wholly below
   ``upto_offset``, the records that survive:

   - a keyed record survives if it is the newest for its key (a key is any bytes, ``b""`` included);
   - a keyless record always survives (there is nothing that could supersede it);
   - a tombstone (value ``None``) that is the newest for its key survives until its timestamp is older than
     ``now_ns - delete_retention_ns``, so consumers that are behind still see the delete before it vanishes;
   - any record whose timestamp is at or after ``now_ns - min_lag_ns`` survives (Kafka's compaction lag): a
     consumer lagging by less than that sees every record, superseded or not. Older records may still be
     superseded by such a young one.

An encrypted partition's batches (:mod:`tidelog.storage.encryption`) are opened with the log's ``keyring`` to be
read, and the survivors of a rewritten batch are sealed again under the key that sealed the original (a new
nonce): record keys are never on disk in clear, not even for compaction. Without the keyring, compaction of a
log holding encrypted batches raises :class:`~tidelog.storage.errors.KeyUnavailableError` before writing.

With ``workers`` above 1 the second pass rewrites that many segments at the same time, each in a thread of its
own (the offset map is only read by then): file reads and writes, decompression and CRCs release the GIL.

What is never touched: a batch with any offset at or above ``upto_offset`` (uncommitted data may still be
truncated by a new leader, so it must neither be removed nor allowed to supersede committed records: records at
or above ``upto_offset`` are left out of the offset map too), and control batches, copied as they are. The
committed records of a batch that straddles ``upto_offset`` are in the map and stay where they are, so they may
supersede older records. Offsets never change: a batch keeps its base offset and last offset delta
(:func:`~tidelog.protocol.records.rebuild_batch`), so a compacted log has gaps but no renumbering, and a batch with
no survivors is dropped whole (a segment may end up empty; the log decides what to do with it).

Crash safety: a segment is rewritten into ``{name}.cleaned``, fsynced, renamed over the original and the
directory fsynced (:mod:`tidelog.storage.atomic`); until the rename the original is intact, after it the new
file is complete. A ``.cleaned`` left by a crash is never read as a segment (it does not end in ``.log``);
start-up recovery deletes strays (:func:`remove_leftovers` does it for any directory), and a later compaction
of the same segment truncates and reuses the name anyway. A segment whose content would not change is not
written at all. A rewritten segment's ``.index`` and ``.timeindex`` no longer match its byte positions: the
caller rebuilds them for every path in :attr:`CompactionResult.rewritten`, and removes them before compacting
so that a crash after a rename leaves a missing index (rebuilt at start-up), never a stale one.

Every input batch is CRC-checked (and its records decoded when it is a candidate); the first fault raises
:class:`~tidelog.storage.errors.CorruptSegmentError` naming the file and offsets, and because the offset map
pass reads every file first, a corrupt input stops compaction before any file is rewritten. Memory: one batch
at a time, plus the offset map (one entry per distinct key below ``upto_offset``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tidelog.protocol.records import (
    ENCRYPTED_FLAG,
    HEADER_SIZE,
    LENGTH_FIELD_END,
    PREFIX,
    REGISTERS_FLAG,
    BatchHeader,
    Record,
    check_batch,
    decode_records,
    parse_header,
    rebuild_batch,
)
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.atomic import atomic_writer, fsync_directory
from tidelog.storage.encryption import KEY_ID, Keyring, open_batch, seal_batch
from tidelog.storage.errors import CorruptSegmentError, KeyUnavailableError

CLEANED_SUFFIX = ".cleaned"
_READ_BUFFER = 1024 * 1024
_COPY_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction did. Byte counts cover every segment passed in, rewritten or not."""

    segments_rewritten: int
    records_removed: int
    bytes_before: int
    bytes_after: int
    rewritten: tuple[Path, ...] = ()  # segments whose bytes changed: their indexes must be rebuilt


def build_offset_map(paths: Sequence[Path], upto_offset: int, keyring: Keyring | None = None) -> dict[bytes, int]:
    """Map each key to the newest offset it has below ``upto_offset`` in the segments at ``paths``.

    Control batches carry no keyed data and are skipped. Raises ``CorruptSegmentError`` at the first batch
    that fails its CRC or does not decode.
    """
    newest: dict[bytes, int] = {}
    for path in paths:
        for _position, header, data in _read_batches(path):
            if header.is_control or header.base_offset >= upto_offset:
                continue
            for record in _decode(path, header, data, keyring):
                if (
                    record.key is not None
                    and record.offset < upto_offset
                    and record.offset > newest.get(record.key, -1)
                ):
                    newest[record.key] = record.offset
    return newest


def compact_segment_files(
    paths: Sequence[Path],
    *,
    upto_offset: int,
    now_ns: int,
    delete_retention_ns: int,
    min_lag_ns: int = 0,
    workers: int = 1,
    keyring: Keyring | None = None,
) -> CompactionResult:
    """Compact the sealed segments at ``paths`` (in offset order) in place; see the module docstring.

    ``upto_offset`` is the high watermark: nothing at or above it is touched. ``now_ns`` comes from the
    caller's clock, so tests decide which tombstones have expired and which records are still young.
    """
    offset_map = build_offset_map(paths, upto_offset, keyring)
    horizons = _Horizons(now_ns - delete_retention_ns, now_ns - min_lag_ns if min_lag_ns else None, keyring)
    sizes = [path.stat().st_size for path in paths]
    if workers > 1 and len(paths) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(paths)), thread_name_prefix="compact") as pool:
            outcomes = list(pool.map(lambda p: _compact_file(p, offset_map, upto_offset, horizons), paths))
    else:
        outcomes = [_compact_file(path, offset_map, upto_offset, horizons) for path in paths]
    rewritten: list[Path] = []
    removed = before = after = 0
    for path, size, outcome in zip(paths, sizes, outcomes, strict=True):
        before += size
        if outcome is None:
            after += size
            continue
        records_removed, new_size = outcome
        removed += records_removed
        after += new_size
        rewritten.append(path)
    return CompactionResult(len(rewritten), removed, before, after, tuple(rewritten))


def remove_leftovers(directory: Path) -> list[Path]:
    """Delete ``*.cleaned`` files that a crash left in ``directory``; return what was deleted.

    Safe at any time no compaction is running in the directory: a ``.cleaned`` file is only ever a copy being
    built, and the segment it was meant to replace is still complete under its own name.
    """
    removed = sorted(p for p in directory.iterdir() if p.name.endswith(CLEANED_SUFFIX) and p.is_file())
    for path in removed:
        path.unlink(missing_ok=True)
    if removed:
        fsync_directory(directory)
    return removed


# --------------------------------------------------------------------------------------------- one segment


@dataclass(frozen=True, slots=True)
class _Horizons:
    """Timestamps that decide survival: tombstones at or after ``tombstone`` stay, and every record at or after
    ``young`` stays (``None``: no compaction lag)."""

    tombstone: int
    young: int | None
    keyring: Keyring | None  # opens and seals again an encrypted log's batches


def _compact_file(
    path: Path, offset_map: dict[bytes, int], upto_offset: int, horizons: _Horizons
) -> tuple[int, int] | None:
    """Rewrite one segment if any record goes; return ``(records removed, new size)``, or ``None`` if unchanged.

    The ``.cleaned`` file is opened only at the first batch that changes: the bytes before it are copied from
    the original then, so an unchanged segment costs a read and no write.
    """
    removed = 0
    written = 0
    out: BinaryIO | None = None
    with ExitStack() as stack:
        for position, header, data in _read_batches(path):
            replacement = data
            if _eligible(header, upto_offset):
                records = _decode(path, header, data, horizons.keyring)
                survivors = [r for r in records if _survives(r, offset_map, horizons)]
                if len(survivors) < len(records):
                    removed += len(records) - len(survivors)
                    replacement = _rebuild(header, data, survivors, horizons.keyring) if survivors else b""
            if out is None:
                if replacement is data:
                    written += len(data)
                    continue
                out = stack.enter_context(atomic_writer(path, suffix=CLEANED_SUFFIX))
                _copy_prefix(path, position, out)
            out.write(replacement)
            written += len(replacement)
        if out is None:
            return None
    return removed, written


def _eligible(header: BatchHeader, upto_offset: int) -> bool:
    """Whether compaction may look inside this batch: a data batch wholly below the high watermark, carrying
    no registers (those batches stay whole: they are where a partition's registers are recovered from)."""
    return not header.is_control and not header.attributes & REGISTERS_FLAG and header.last_offset < upto_offset


def _survives(record: Record, offset_map: dict[bytes, int], horizons: _Horizons) -> bool:
    if record.key is None:
        return True
    if horizons.young is not None and record.timestamp >= horizons.young:
        return True  # younger than the compaction lag
    if offset_map.get(record.key, record.offset) > record.offset:
        return False  # superseded by a newer record with the same key
    return record.value is not None or record.timestamp >= horizons.tombstone


def _copy_prefix(path: Path, length: int, out: BinaryIO) -> None:
    """Copy the first ``length`` bytes of ``path`` (batches that stay as they are) to ``out``."""
    with open(path, "rb") as source:
        remaining = length
        while remaining:
            chunk = source.read(min(_COPY_CHUNK, remaining))
            if not chunk:
                raise CorruptSegmentError(str(path), -1, -1, "segment shrank while being compacted")
            out.write(chunk)
            remaining -= len(chunk)


# --------------------------------------------------------------------------------------------- reading


def _read_batches(path: Path) -> Iterator[tuple[int, BatchHeader, bytes]]:
    """Yield ``(position, header, bytes)`` for each batch of a segment, CRC-checked, one batch in memory.

    A batch whose length runs past the end of the file, fails its CRC or starts below the offset where the
    previous one ended raises ``CorruptSegmentError``: the file is sealed, so there is no torn tail to forgive.
    """
    expected = _base_offset_of(path)
    with open(path, "rb", buffering=_READ_BUFFER) as file:
        size = os.fstat(file.fileno()).st_size
        position = 0
        while position < size:
            prefix = file.read(PREFIX.size)
            total = PREFIX.unpack(prefix)[1] + LENGTH_FIELD_END if len(prefix) == PREFIX.size else -1
            if not HEADER_SIZE <= total <= size - position:
                raise _corrupt(path, expected, prefix, f"batch at byte {position} has an impossible length")
            data = prefix + file.read(total - PREFIX.size)
            try:
                header = check_batch(data)
            except CorruptBatchError as exc:
                detail = str(exc).removesuffix(" (at byte 0)")  # a position within ``data``: misleading here
                raise _corrupt(path, expected, data, f"batch at byte {position}: {detail}") from exc
            if expected is not None and header.base_offset < expected:
                raise _corrupt(path, expected, data, f"batch at byte {position} goes back to {header.base_offset}")
            yield position, header, data
            position += total
            expected = header.next_offset


def _rebuild(header: BatchHeader, data: bytes, survivors: list[Record], keyring: Keyring | None) -> bytes:
    """The batch with only ``survivors``, sealed again under its own key when it was sealed."""
    if not header.attributes & ENCRYPTED_FLAG:
        return rebuild_batch(header, survivors)
    assert keyring is not None  # it was opened to find the survivors
    plain = open_batch(data, 0, header, keyring)
    rebuilt = rebuild_batch(parse_header(plain), survivors)
    (key_id,) = KEY_ID.unpack_from(data, HEADER_SIZE)
    return seal_batch(rebuilt, 0, parse_header(rebuilt), keyring, key_id)


def _decode(path: Path, header: BatchHeader, data: bytes, keyring: Keyring | None) -> list[Record]:
    if header.attributes & ENCRYPTED_FLAG:
        try:
            data = open_batch(data, 0, header, keyring)
        except KeyUnavailableError as exc:
            raise KeyUnavailableError(f"{path}: cannot compact: {exc}") from None
        header = parse_header(data)
    try:
        return decode_records(data, 0, header=header)
    except CorruptBatchError as exc:
        # The CRC matched, so the producer wrote these bytes: a batch that does not decode is refused, not
        # compacted around, since its records cannot be proven superseded.
        raise CorruptSegmentError(str(path), header.base_offset, header.last_offset, f"records: {exc}") from exc


def _corrupt(path: Path, expected: int | None, data: bytes, reason: str) -> CorruptSegmentError:
    """Name the offsets that cannot be trusted: from where the last good batch ended to what this one claims."""
    first = expected
    last = None
    try:
        claimed = parse_header(data)
    except CorruptBatchError:
        pass
    else:
        first = claimed.base_offset if first is None else first
        last = claimed.last_offset
    first = -1 if first is None else first
    last = first if last is None or last < first else last
    return CorruptSegmentError(str(path), first, last, reason)


def _base_offset_of(path: Path) -> int | None:
    """The base offset in a ``{base_offset:020d}.log`` name, or ``None`` for another name."""
    stem = path.name.removesuffix(".log")
    return int(stem) if stem != path.name and stem.isascii() and stem.isdigit() else None
