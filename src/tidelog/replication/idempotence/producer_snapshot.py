"""Producer-state snapshots, and rebuilding a replica's producer state from a snapshot and its log.

Producer state (:mod:`tidelog.replication.idempotence.producer_state`) is derived from batch headers, so it can always
be rebuilt by scanning the log; a snapshot bounds that scan to the log after the snapshot's offset. A partition
directory holds a few, named by offset as Kafka names its ``.snapshot`` files::

    00000000000000004096.producer-snapshot

A snapshot is a checkpoint file (:mod:`tidelog.storage.checkpoint`: text, kind and version line, CRC32C,
replaced atomically, read strictly) of kind ``producer-state`` whose entries are rows of eight integers, the
first being the row's type::

    0  offset    0      0          0          0            0            0              the snapshot's offset, first
    1  pid       epoch  complete   0          0            0            0              a producer, then its batches
    2  pid       epoch  first_seq  last_seq   base_offset  last_offset  max_timestamp  one batch, oldest first
    3  pid       epoch  expired_at 0          0            0            0              an expired producer

``offset`` means: the state reflects every batch below it and none at or above it (the log end when it was
taken, with no append in flight). Any row that breaks the producer-state invariants makes the whole file
refused with :class:`~tidelog.storage.errors.CheckpointError`: a wrong state would acknowledge a retry with
offsets it never had, or write it twice. :func:`load_producer_state` then falls back to an older snapshot or a
full scan, which is slower but exact.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from tidelog.clock import Clock
from tidelog.protocol.records import BatchHeader, iter_batches
from tidelog.protocol.records.producers import MAX_PRODUCER_EPOCH, MAX_SEQUENCE, WINDOW
from tidelog.replication.idempotence.producer_state import (
    DEFAULT_PRODUCER_EXPIRY_MS,
    BatchMetadata,
    ExpiredProducer,
    ProducerEntry,
    ProducerStateTable,
)
from tidelog.storage.atomic import write_atomically
from tidelog.storage.checkpoint import decode_checkpoint, encode_checkpoint, read_bounded
from tidelog.storage.errors import CheckpointError, OffsetDamagedError

log = logging.getLogger(__name__)

KIND = "producer-state"
FIELDS = 8
SNAPSHOT_SUFFIX = ".producer-snapshot"
SCAN_CHUNK_BYTES = 1024 * 1024

_OFFSET, _PRODUCER, _BATCH, _EXPIRED = 0, 1, 2, 3
_NAME = re.compile(r"([0-9]{20})" + re.escape(SNAPSHOT_SUFFIX))


# ------------------------------------------------------------------------------------------------- format


def encode_snapshot(table: ProducerStateTable, offset: int) -> bytes:
    """The snapshot of ``table`` as of ``offset``. Synchronous: take it between appends, then write anywhere."""
    if offset < 0:
        raise ValueError(f"a snapshot offset cannot be negative: {offset}")
    rows: list[tuple[int, ...]] = [(_OFFSET, offset, 0, 0, 0, 0, 0, 0)]
    for pid, entry in sorted(table.entries().items()):
        if entry.last_offset >= offset:
            raise ValueError(
                f"producer {pid} has a batch at {entry.last_offset}, not below the snapshot offset {offset}"
            )
        rows.append((_PRODUCER, pid, entry.epoch, int(entry.complete), 0, 0, 0, 0))
        rows.extend(
            (_BATCH, pid, entry.epoch, b.first_sequence, b.last_sequence, b.base_offset, b.last_offset, b.max_timestamp)
            for b in entry.batches
        )
    for pid, tombstone in sorted(table.expired().items()):
        rows.append((_EXPIRED, pid, tombstone.epoch, tombstone.expired_at_ns, 0, 0, 0, 0))
    return encode_checkpoint(KIND, FIELDS, rows)


def decode_snapshot(
    data: bytes,
    *,
    path: str = "<producer snapshot>",
    clock: Clock | None = None,
    producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
) -> tuple[ProducerStateTable, int]:
    """The table and offset a snapshot holds; any fault raises :class:`CheckpointError` naming ``path``."""
    rows = decode_checkpoint(data, KIND, FIELDS, path=path)
    parser = _Parser(path)
    offset = parser.parse(rows)
    table = ProducerStateTable(
        clock=clock, producer_expiry_ms=producer_expiry_ms, entries=parser.entries, expired=parser.expired
    )
    return table, offset


class _Parser:
    """Checks rows against the invariants :class:`ProducerEntry` and the snapshot offset promise."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: list[ProducerEntry] = []
        self.expired: list[ExpiredProducer] = []
        self._seen: set[int] = set()

    def fail(self, reason: str) -> CheckpointError:
        return CheckpointError(self.path, reason)

    def parse(self, rows: Sequence[tuple[int, ...]]) -> int:
        if not rows or rows[0][0] != _OFFSET or any(rows[0][2:]):
            raise self.fail("the first row is not the snapshot offset")
        offset = rows[0][1]
        if offset < 0:
            raise self.fail(f"negative snapshot offset {offset}")
        current: tuple[int, int, bool, list[BatchMetadata]] | None = None
        for row in rows[1:]:
            tag, pid, epoch = row[:3]
            if tag == _BATCH:
                if current is None or current[0] != pid or current[1] != epoch:
                    raise self.fail(f"a batch row of producer {pid} epoch {epoch} outside its producer")
                current[3].append(self._batch(row, offset, current[3]))
                continue
            if current is not None:
                self._finish(*current)
                current = None
            if tag not in (_PRODUCER, _EXPIRED):
                raise self.fail(f"unknown row type {tag}")
            if pid < 0 or not 0 <= epoch <= MAX_PRODUCER_EPOCH:
                raise self.fail(f"producer {pid} epoch {epoch} out of range")
            if pid in self._seen:
                raise self.fail(f"producer {pid} appears twice")
            self._seen.add(pid)
            if tag == _PRODUCER:
                if row[3] not in (0, 1) or any(row[4:]):
                    raise self.fail(f"malformed producer row {row!r}")
                current = (pid, epoch, bool(row[3]), [])
            else:
                if any(row[4:]):
                    raise self.fail(f"malformed expired-producer row {row!r}")
                self.expired.append(ExpiredProducer(pid, epoch, row[3]))
        if current is not None:
            self._finish(*current)
        return offset

    def _batch(self, row: tuple[int, ...], offset: int, previous: list[BatchMetadata]) -> BatchMetadata:
        _, pid, _, first, last, base, last_offset, timestamp = row
        if not (0 <= first <= MAX_SEQUENCE and 0 <= last <= MAX_SEQUENCE):
            raise self.fail(f"producer {pid}: sequence out of range in {row!r}")
        if not 0 <= base <= last_offset < offset:
            raise self.fail(f"producer {pid}: batch offsets {base}..{last_offset} impossible below {offset}")
        if previous and base <= previous[-1].last_offset:
            raise self.fail(f"producer {pid}: batches out of offset order")
        return BatchMetadata(first, last, base, last_offset, timestamp)

    def _finish(self, pid: int, epoch: int, complete: bool, batches: list[BatchMetadata]) -> None:
        if not 1 <= len(batches) <= WINDOW:
            raise self.fail(f"producer {pid} has {len(batches)} batches, expected 1 to {WINDOW}")
        self.entries.append(ProducerEntry(pid, epoch, tuple(batches), complete))


# ------------------------------------------------------------------------------------------------- files


def write_snapshot(path: Path, table: ProducerStateTable, offset: int) -> None:
    """Replace ``path`` with the snapshot of ``table`` as of ``offset``; durable when this returns."""
    write_atomically(path, encode_snapshot(table, offset))


def read_snapshot(
    path: Path, *, clock: Clock | None = None, producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS
) -> tuple[ProducerStateTable, int]:
    """The table and offset stored at ``path``. :class:`CheckpointError` when damaged; ``FileNotFoundError``."""
    with open(path, "rb") as file:
        data = read_bounded(file, str(path))
    return decode_snapshot(data, path=str(path), clock=clock, producer_expiry_ms=producer_expiry_ms)


class ProducerSnapshots:
    """The snapshot files of one partition directory. One writer at a time (the partition serializes)."""

    __slots__ = ("directory",)

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, offset: int) -> Path:
        return self.directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"

    def offsets(self) -> list[int]:
        """The offsets of the snapshots present, ascending."""
        found = (_NAME.fullmatch(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m is not None)

    def write(self, table: ProducerStateTable, offset: int) -> Path:
        path = self.path_for(offset)
        write_snapshot(path, table, offset)
        return path

    def latest(
        self,
        at_or_below: int | None = None,
        *,
        clock: Clock | None = None,
        producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
    ) -> tuple[ProducerStateTable, int] | None:
        """The newest readable snapshot at or below ``at_or_below``; a damaged one is logged and skipped."""
        for offset in reversed(self.offsets()):
            if at_or_below is not None and offset > at_or_below:
                continue
            path = self.path_for(offset)
            try:
                table, stored = read_snapshot(path, clock=clock, producer_expiry_ms=producer_expiry_ms)
            except (CheckpointError, OSError) as exc:
                log.warning("skipping producer snapshot: %s", exc)
                continue
            if stored != offset:
                log.warning("skipping producer snapshot %s: it holds offset %d", path, stored)
                continue
            return table, offset
        return None

    def delete_above(self, offset: int) -> list[int]:
        """Delete snapshots above ``offset`` (they describe a log tail that was truncated away)."""
        return self._delete([o for o in self.offsets() if o > offset])

    def retain(self, count: int) -> list[int]:
        """Keep the newest ``count`` snapshots, delete the rest; return the offsets deleted."""
        offsets = self.offsets()
        return self._delete(offsets[:-count] if count > 0 else offsets)

    def _delete(self, offsets: list[int]) -> list[int]:
        for offset in offsets:
            self.path_for(offset).unlink(missing_ok=True)
        return offsets


# ------------------------------------------------------------------------------------------------- the log


class ReadableLog(Protocol):
    """What the scan needs of :class:`tidelog.storage.log.Log` (its public read API)."""

    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None) -> bytes: ...


def iter_log_headers(
    log_: ReadableLog, start: int, stop: int | None = None, *, chunk_bytes: int = SCAN_CHUNK_BYTES
) -> Iterator[BatchHeader]:
    """The headers of the stored batches from the one holding ``start`` to those wholly below ``stop``.

    Records are not decoded; :meth:`Log.read` checks each batch's CRC. Offsets below the log start are skipped
    (retention removed them), and so are ranges damaged on disk (logged: the producers that wrote there may be
    told OUT_OF_ORDER_SEQUENCE and re-initialize; a partition that cannot load its producers would not open).
    Synchronous: consume it without awaiting, or the log may change underneath.
    """
    position = max(start, log_.start_offset)
    while position < (log_.end_offset if stop is None else min(stop, log_.end_offset)):
        try:
            data = log_.read(position, chunk_bytes, stop)
        except OffsetDamagedError as exc:
            log.warning("the producer state skips damaged offsets %d..%d", exc.first, exc.last)
            position = exc.next_offset
            continue
        if not data:
            return
        for _, header in iter_batches(data, verify=False):
            if header.next_offset > start:
                yield header
            position = header.next_offset


def load_producer_state(
    log_: ReadableLog,
    snapshots: ProducerSnapshots | None,
    *,
    clock: Clock | None = None,
    producer_expiry_ms: int = DEFAULT_PRODUCER_EXPIRY_MS,
) -> ProducerStateTable:
    """The producer state of ``log_`` as it is now: the newest usable snapshot, then the log after it.

    Used at start-up and after a truncation that :meth:`ProducerStateTable.truncate_to` could not follow
    exactly. Snapshots above the log end are deleted first: they describe batches the log no longer holds, and
    would be wrong once the log grows past them again. Expired producers are dropped at the end.
    """
    end = log_.end_offset
    loaded = None
    if snapshots is not None:
        snapshots.delete_above(end)
        loaded = snapshots.latest(end, clock=clock, producer_expiry_ms=producer_expiry_ms)
    if loaded is None:
        table, start = ProducerStateTable(clock=clock, producer_expiry_ms=producer_expiry_ms), log_.start_offset
    else:
        table, start = loaded
    table.rebuild(iter_log_headers(log_, start, end))
    table.remove_expired()
    return table


__all__ = [
    "FIELDS",
    "KIND",
    "SNAPSHOT_SUFFIX",
    "ProducerSnapshots",
    "ReadableLog",
    "decode_snapshot",
    "encode_snapshot",
    "iter_log_headers",
    "load_producer_state",
    "read_snapshot",
    "write_snapshot",
]
