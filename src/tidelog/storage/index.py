"""Sparse indexes of a segment: offset → file position, and timestamp → offset.

Both are *sparse*: an entry is added only about every ``index_interval_bytes`` of log, so a lookup lands on
the nearest entry at or before the target and the segment then scans at most that many bytes of batch
headers. Entries are fixed-size, big-endian like the rest of the on-disk format::

    {base:020d}.index       relative_offset u32 | position u32          (8 bytes; relative to the base offset)
    {base:020d}.timeindex   timestamp i64 (ns)  | relative_offset u32   (12 bytes)

An offset-index entry names the *base offset* of the batch that starts at ``position``. A time-index entry
``(t, r)`` says "the largest timestamp among the batches up to here is ``t``, first reached in the batch
whose base offset is ``r``": timestamps in a log need not be monotonic, the running maximum is.

The whole index lives in memory (two arrays; a 128 MiB segment at the default interval needs ~32 k entries)
and is searched with :mod:`bisect`. The files are only a cache that spares a scan of the log at start-up:
new entries are written out when the segment is sealed or the log closes, a rebuilt index is written to a
temporary name and renamed into place, and anything that fails the checks in :meth:`_SparseIndex.load`
is reported as :class:`DamagedIndexError` so the segment rebuilds it from its batches.
"""

from __future__ import annotations

import array
import contextlib
import os
import struct
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from pathlib import Path

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
MAX_RELATIVE_OFFSET = 2**32 - 1
TMP_SUFFIX = ".tmp"


class DamagedIndexError(Exception):
    """An index file is missing or fails its sanity checks; the caller rebuilds it from the log."""


def _decode_pairs_u32(data: bytes) -> tuple[array.array[int], array.array[int]]:
    flat = array.array("I")
    flat.frombytes(data)
    if flat.itemsize != 4:  # pragma: no cover - no platform we run on
        raise RuntimeError("array('I') is not 32-bit here")
    if sys.byteorder == "little":
        flat.byteswap()
    return flat[0::2], flat[1::2]


def _decode_time(data: bytes) -> tuple[array.array[int], array.array[int]]:
    keys: array.array[int] = array.array("q")
    values: array.array[int] = array.array("I")
    for ts, rel in TIME_ENTRY.iter_unpack(data):
        keys.append(ts)
        values.append(rel)
    return keys, values


class _SparseIndex:
    """Sorted (key, value) entries held in memory and mirrored to a file.

    ``keys`` is what lookups search; ``values`` is what they return. Entries ``[0, _on_disk)`` are in the
    file; later ones are pending until :meth:`write_pending`.
    """

    __slots__ = ("_on_disk", "base_offset", "keys", "path", "values")

    ENTRY: struct.Struct
    KEY_CODE: str
    VALUE_CODE: str
    _decode: Callable[[bytes], tuple[array.array[int], array.array[int]]]

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.keys: array.array[int] = array.array(self.KEY_CODE)
        self.values: array.array[int] = array.array(self.VALUE_CODE)
        self._on_disk = 0

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def _read(cls, path: Path, base_offset: int) -> _SparseIndex:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise DamagedIndexError(f"{path.name}: missing") from None
        if len(data) % cls.ENTRY.size:
            raise DamagedIndexError(f"{path.name}: {len(data)} bytes is not a whole number of entries")
        index = cls(path, base_offset)
        index.keys, index.values = cls._decode(data)
        index._on_disk = len(index.keys)
        return index

    def entry(self, i: int) -> tuple[int, int]:
        return self.keys[i], self.values[i]

    def _add(self, key: int, value: int) -> None:
        self.keys.append(key)
        self.values.append(value)

    def _truncate_entries(self, keep: int) -> None:
        """Keep the first ``keep`` entries, in memory and in the file."""
        if keep >= len(self.keys):
            return
        del self.keys[keep:]
        del self.values[keep:]
        if self._on_disk > keep:
            self._on_disk = keep
            try:
                os.truncate(self.path, keep * self.ENTRY.size)
            except FileNotFoundError:
                self._on_disk = 0

    def _encode(self, start: int) -> bytes:
        pack = self.ENTRY.pack
        return b"".join(pack(self.keys[i], self.values[i]) for i in range(start, len(self.keys)))

    def write_pending(self, *, fsync: bool = False) -> None:
        """Append entries not yet in the file, fsynced if asked (a no-op when there are none and the file
        exists: what is in it was fsynced when it was written)."""
        if self._on_disk == len(self.keys) and self.path.exists():
            return
        flags = os.O_WRONLY | os.O_CREAT
        fd = os.open(self.path, flags, 0o644)
        try:
            size = os.fstat(fd).st_size
            expected = self._on_disk * self.ENTRY.size
            if size != expected:  # the file is not what we last wrote: rewrite it whole
                os.ftruncate(fd, 0)
                self._on_disk = 0
            _pwrite_all(fd, self._encode(self._on_disk), self._on_disk * self.ENTRY.size)
            self._on_disk = len(self.keys)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def write_atomic(self) -> None:
        """Replace the file with every entry: written to a temporary name, fsynced, renamed into place.

        Used after a rebuild, so a crash can never leave a half-written index that looks valid. The caller
        fsyncs the directory.
        """
        tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, self._encode(0), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._on_disk = len(self.keys)

    def delete(self) -> None:
        for path in (self.path, self.path.with_name(self.path.name + TMP_SUFFIX)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class OffsetIndex(_SparseIndex):
    """Relative offset → position of the batch starting there. Keys and positions strictly increase."""

    __slots__ = ()
    ENTRY = OFFSET_ENTRY
    KEY_CODE = "I"
    VALUE_CODE = "I"
    _decode = staticmethod(_decode_pairs_u32)

    @classmethod
    def load(cls, path: Path, base_offset: int, segment_size: int) -> OffsetIndex:
        """Read and check the file: both columns strictly increasing, positions inside the segment."""
        index = cls._read(path, base_offset)
        assert isinstance(index, OffsetIndex)
        keys, positions = index.keys, index.values
        for i in range(1, len(keys)):
            if keys[i] <= keys[i - 1] or positions[i] <= positions[i - 1]:
                raise DamagedIndexError(f"{path.name}: entry {i} does not increase")
        if positions and positions[-1] >= segment_size:
            raise DamagedIndexError(f"{path.name}: position {positions[-1]} is past the segment's {segment_size}")
        return index

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self.keys and (rel <= self.keys[-1] or position <= self.values[-1]):
            raise ValueError(f"index entry ({offset}, {position}) does not follow the last one")
        self._add(rel, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """The (offset, position) of the last entry at or before ``offset``; (base, 0) when there is none."""
        i = bisect_right(self.keys, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self.keys[i], self.values[i]

    def last(self) -> tuple[int, int]:
        if not self.keys:
            return self.base_offset, 0
        return self.base_offset + self.keys[-1], self.values[-1]

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of batches starting at or after ``offset``."""
        self._truncate_entries(bisect_left(self.keys, max(0, offset - self.base_offset)))


class TimeIndex(_SparseIndex):
    """Running-maximum timestamp → relative offset of the batch that first reached it."""

    __slots__ = ()
    ENTRY = TIME_ENTRY
    KEY_CODE = "q"
    VALUE_CODE = "I"
    _decode = staticmethod(_decode_time)

    @classmethod
    def load(cls, path: Path, base_offset: int) -> TimeIndex:
        """Read and check the file: timestamps strictly increasing, offsets not decreasing."""
        index = cls._read(path, base_offset)
        assert isinstance(index, TimeIndex)
        stamps, rels = index.keys, index.values
        for i in range(1, len(stamps)):
            if stamps[i] <= stamps[i - 1] or rels[i] < rels[i - 1]:
                raise DamagedIndexError(f"{path.name}: entry {i} does not increase")
        return index

    def maybe_append(self, max_timestamp: int, offset: int) -> None:
        """Record a new running maximum (ignored unless it is larger than the last one recorded)."""
        if self.keys and max_timestamp <= self.keys[-1]:
            return
        self._add(max_timestamp, offset - self.base_offset)

    def last_timestamp(self) -> int | None:
        return self.keys[-1] if self.keys else None

    def lookup(self, timestamp: int) -> int:
        """An offset from which a forward scan finds the first batch whose max timestamp is ≥ ``timestamp``.

        Every batch before the entry preceding the first entry ≥ ``timestamp`` has a smaller timestamp, so the
        scan may start at that entry's batch (or at the segment's base when there is none).
        """
        i = bisect_left(self.keys, timestamp) - 1
        if i < 0:
            return self.base_offset
        return self.base_offset + self.values[i]

    def truncate_to(self, offset: int) -> None:
        """Drop entries naming batches at or after ``offset`` (earlier maxima stay true)."""
        self._truncate_entries(bisect_left(self.values, max(0, offset - self.base_offset)))


def _pwrite_all(fd: int, data: bytes, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written
