"""Where a transactional append's records wait while the client streams them: memory, then an unnamed file.

An append is all or nothing and may be larger than the broker should hold in memory (issue 5: "appends are not
buffered whole in broker memory"). The spool keeps the first :data:`MEMORY_BYTES` in memory — most appends are
small, and a CAS append should not touch a file — and moves to a file past that. The file is created in the
broker's data directory and unlinked at once, so a crash, a dropped connection or an abort leaves nothing to
clean up: the space goes back when the descriptor closes.

Each chunk is checked as it arrives, as a produced batch is (:func:`~tidelog.protocol.records.check.check_records`:
whole, decodable records with offset deltas running on from the previous chunk, none above
``max_message_bytes``; timestamps not negative nor further ahead than ``max_timestamp_ahead_ms``, and the
batch's largest timestamp taken from the records themselves, not the client's word), and its CRC folded into a
running CRC of the record section. At
commit, :meth:`AppendSpool.seal` frames the records as one batch: the header (record count, last offset delta,
largest timestamp, the registers block when the append sets registers) is written in front of the records, and
its CRC is the header's combined with the running one (:mod:`tidelog.storage.crc_combine`), so the records are
never read back. A file-backed batch is returned as a read-only memory map: the log writes it to the segment
with ``pwritev`` straight from the page cache.

Why one batch per append: a batch is already the unit that is all or nothing everywhere — a torn write is cut
by recovery, replication and fetches move whole batches, and a consumer decodes it or nothing. So an append
needs no commit marker, and no reader, follower or recovery rule of its own. The price is that a replica or
consumer receives a large append in one response (bounded by ``max_append_bytes``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

import crc32c

from tidelog.clock import Clock, SystemClock
from tidelog.protocol.labels import MAX_REGISTER_BYTES
from tidelog.protocol.records import (
    CRC_FIELD,
    CRC_POS,
    CRC_START,
    HEADER_SIZE,
    REGISTERS_FLAG,
    REGISTERS_LENGTH,
    TRANSACTIONAL_FLAG,
    check_records,
    pack_header,
    registers_prefix,
)
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.batch_check import ProduceLimits, check_timestamps
from tidelog.storage.crc_combine import crc32c_combine
from tidelog.storage.file_writes import FileSlice

MEMORY_BYTES = 1024 * 1024
"""Record bytes an append keeps in memory before it moves them to a file."""
SMALL_BYTES = 64 * 1024
"""Up to this size a sealed batch's CRC is computed afresh rather than combined (see :meth:`AppendSpool.seal`)."""

# Reserved in front of a file's records: room for the header and the largest registers block.
_ROOM = HEADER_SIZE + REGISTERS_LENGTH.size + MAX_REGISTER_BYTES


class Declared(NamedTuple):
    """What a client says about a chunk it sends: its record count, CRC32C, and the largest record timestamp
    of the append so far (not relied on: the spool takes the largest from the records)."""

    records: int
    crc: int
    max_timestamp: int


class AppendTooLargeError(ValueError):
    """The append's records exceed its size limit."""


class AppendSpool:
    """The records of one transactional append, validated and checksummed as they arrive."""

    __slots__ = (
        "_chunks",
        "_clock",
        "_closed",
        "_count",
        "_crc",
        "_directory",
        "_fd",
        "_first_timestamp",
        "_limits",
        "_map",
        "_max_bytes",
        "_max_delta",
        "_sealed_at",
        "_size",
    )

    def __init__(
        self,
        directory: Path,
        first_timestamp: int,
        max_bytes: int,
        limits: ProduceLimits,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: what a chunk's timestamps are checked against (a :class:`~tidelog.clock.SystemClock` when
        not given)."""
        self._directory = directory
        self._clock: Clock = clock or SystemClock()
        self._limits = limits
        self._first_timestamp = first_timestamp
        self._max_bytes = max_bytes
        self._chunks: list[bytes] = []
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._count = 0
        self._size = 0
        self._crc = 0
        self._max_delta = 0
        self._sealed_at = -1
        self._closed = False

    @property
    def count(self) -> int:
        """Records received so far."""
        return self._count

    @property
    def size(self) -> int:
        """Record bytes received so far."""
        return self._size

    @property
    def in_file(self) -> bool:
        return self._fd >= 0

    def add(self, chunk: memoryview, declared: Declared | None = None) -> None:
        """Take one chunk of whole records (synchronously: chunks are added in the order they arrive).

        With ``declared`` (the client's count and CRC) the chunk must match them too. Raises
        :class:`~tidelog.protocol.records.errors.CorruptBatchError` for records that do not decode,
        :class:`~tidelog.protocol.records.errors.InvalidBatchError` for timestamps out of bounds (its subclass
        ``RecordTooLargeError`` for a record above ``max_message_bytes``), and :class:`AppendTooLargeError` past
        the append's limit; whatever the failure, nothing of the chunk is kept.
        """
        if self._closed:
            raise RuntimeError("the append spool was discarded")
        if self._size + len(chunk) > self._max_bytes:
            raise AppendTooLargeError(
                f"the append's records reach {self._size + len(chunk)} bytes, above max_append_bytes "
                f"({self._max_bytes})"
            )
        if declared is None:
            running = crc32c.crc32c(chunk, self._crc)
        else:
            crc = crc32c.crc32c(chunk)
            if crc != declared.crc:
                raise CorruptBatchError(f"chunk CRC32C is {crc:#010x}, the client declared {declared.crc:#010x}")
            # The running CRC of the records: extended in C (a second pass over a hot chunk) rather than
            # combined in Python, whose fixed cost is a compare-and-set append's whole budget (docs/performance.md).
            running = crc if not self._size else crc32c.crc32c(chunk, self._crc)
        checked = check_records(chunk, self._count, self._limits.max_message_bytes)
        if declared is not None and checked.records != declared.records:
            raise CorruptBatchError(f"chunk holds {checked.records} records, the client declared {declared.records}")
        max_delta = max(self._max_delta, checked.max_timestamp_delta)
        first = self._first_timestamp
        check_timestamps(first, first + max_delta, checked, self._limits, self._clock.now_ns(), "append")
        records = checked.records
        if self._fd < 0 and self._size + len(chunk) > MEMORY_BYTES:
            self._to_file()
        if self._fd >= 0:
            _pwrite_all(self._fd, chunk, _ROOM + self._size)
        else:
            self._chunks.append(bytes(chunk))
        self._crc = running
        self._count += records
        self._max_delta = max_delta
        self._size += len(chunk)

    def _to_file(self) -> None:
        fd, name = tempfile.mkstemp(prefix=".append-", suffix=".spool", dir=self._directory)
        os.unlink(name)  # anonymous from now on: nothing survives the descriptor
        self._fd = fd
        position = _ROOM
        for chunk in self._chunks:
            _pwrite_all(fd, chunk, position)
            position += len(chunk)
        self._chunks = []

    def seal(self, *, registers: bytes | None) -> memoryview:
        """The append as one complete batch (offsets and leader epoch to be assigned by the log).

        ``registers``: the encoded label set the partition will have after this append, carried in the batch's
        registers block; None to leave the registers as they are. Only valid with at least one record.
        """
        if not self._count:
            raise ValueError("an append with no records has no batch")
        block = b"" if registers is None else registers_prefix(registers)
        header = pack_header(
            len(block) + self._size,
            base_offset=0,
            leader_epoch=0,
            attributes=TRANSACTIONAL_FLAG | (REGISTERS_FLAG if registers is not None else 0),
            last_offset_delta=self._count - 1,
            first_timestamp=self._first_timestamp,
            max_timestamp=self._first_timestamp + self._max_delta,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            record_count=self._count,
        )
        head_crc = crc32c.crc32c(block, crc32c.crc32c(memoryview(header)[CRC_START:]))
        if self._fd < 0 and self._size <= SMALL_BYTES:  # cheaper to checksum again than to combine
            crc = head_crc
            for chunk in self._chunks:
                crc = crc32c.crc32c(chunk, crc)
        else:
            crc = crc32c_combine(head_crc, self._crc, self._size)
        CRC_FIELD.pack_into(header, CRC_POS, crc)
        front = bytes(header) + block
        if self._fd < 0:
            return memoryview(b"".join((front, *self._chunks)))
        start = _ROOM - len(front)
        _pwrite_all(self._fd, front, start)
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self._fd, _ROOM + self._size, access=mmap.ACCESS_READ)
        self._sealed_at = start
        return memoryview(self._map)[start:]

    def file_slice(self) -> FileSlice | None:
        """Where the sealed batch lies in the spool file, for the log to copy it in the kernel (None when the
        append stayed in memory). The memory map of :meth:`seal` is for checking it; copying from a map is
        several times slower (see :class:`~tidelog.storage.file_writes.FileSlice`)."""
        if self._fd < 0 or self._sealed_at < 0:
            return None
        return FileSlice(self._fd, self._sealed_at, _ROOM + self._size - self._sealed_at)

    def discard(self) -> None:
        """Release memory and file. Views from :meth:`seal` must be released first (the log does not keep
        them past its append); one still held keeps the mapping alive until it is collected."""
        if self._closed:
            return
        self._closed = True
        self._chunks = []
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view is still exported: it closes when collected
                self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        where = "file" if self._fd >= 0 else "memory"
        return f"AppendSpool(records={self._count}, bytes={self._size}, in {where})"


def _pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written
