"""Checkpoint files: small, versioned, checksummed text files of integers, replaced atomically.

A partition directory holds two: ``hw-checkpoint`` (the high watermark, :class:`HighWatermarkCheckpoint`) and
``leader-epoch-checkpoint`` (epoch → start offset, :mod:`tidelog.storage.epoch_cache`). Both share one format,
text so an operator can read it with ``cat``::

    tidelog high-watermark 1        kind and format version
    1                               number of entries
    4096                            one line per entry: the kind's fixed number of integers, space-separated
    crc32c 1a2b3c4d                 CRC32C of every byte above, as 8 lowercase hex digits

Why the kind and the checksum: the files are written atomically (:mod:`tidelog.storage.atomic`), so a torn
write cannot happen, but a file copied into the wrong place, edited by hand or damaged on disk can, and a wrong
high watermark or epoch history silently loses or exposes data. Reading is therefore strict — exact kind and
version, canonical integers, the right number of lines, a matching CRC, nothing after — and any fault raises
:class:`~tidelog.storage.errors.CheckpointError` instead of returning a guess.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import BinaryIO

import crc32c

from tidelog.storage.atomic import write_atomically
from tidelog.storage.errors import CheckpointError

FORMAT_VERSION = 1
HW_CHECKPOINT_FILE = "hw-checkpoint"
MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024  # far above any real checkpoint; bounds what a garbage file costs to read

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INTEGER = re.compile(rb"0|-?[1-9][0-9]{0,18}")  # canonical, as str(int) writes it: no "+", "-0" or leading zeros
_CRC_LINE = re.compile(rb"crc32c ([0-9a-f]{8})\n")
_MAGIC = b"tidelog"
_KIND = re.compile(r"[a-z][a-z0-9-]*")  # one word: the header line is split on spaces


def seal(body: bytes) -> bytes:
    """``body`` (ending in a newline) followed by its ``crc32c`` line: the framing every checkpoint file shares."""
    return body + f"crc32c {crc32c.crc32c(body):08x}\n".encode()


def unseal(data: bytes, path: str) -> bytes:
    """The body of a :func:`seal`-ed file, its checksum verified; any fault raises ``CheckpointError``."""
    body_end = data.rfind(b"crc32c ")
    if body_end <= 0 or data[body_end - 1 : body_end] != b"\n":
        raise CheckpointError(path, "no checksum line")
    crc_match = _CRC_LINE.fullmatch(data, body_end)
    if crc_match is None:
        raise CheckpointError(path, "malformed checksum line")
    body = data[:body_end]
    if int(crc_match.group(1), 16) != crc32c.crc32c(body):
        raise CheckpointError(path, "checksum mismatch")
    return body


def encode_checkpoint(kind: str, fields: int, entries: Iterable[Sequence[int]]) -> bytes:
    """Encode ``entries`` (each ``fields`` integers) as a checkpoint of ``kind``."""
    if _KIND.fullmatch(kind) is None:
        raise ValueError(f"a checkpoint kind is one lowercase word: {kind!r}")
    lines = []
    for entry in entries:
        if len(entry) != fields:
            raise ValueError(f"a {kind} entry has {fields} fields, not {len(entry)}: {entry!r}")
        for value in entry:
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise ValueError(f"{value} does not fit a checkpoint field (int64)")
        lines.append(" ".join(str(int(value)) for value in entry).encode() + b"\n")
    return seal(f"{_MAGIC.decode()} {kind} {FORMAT_VERSION}\n{len(lines)}\n".encode() + b"".join(lines))


def decode_checkpoint(data: bytes, kind: str, fields: int, *, path: str = "<checkpoint>") -> list[tuple[int, ...]]:
    """Decode a checkpoint of ``kind`` with ``fields`` integers per entry; any fault raises ``CheckpointError``."""
    lines = unseal(data, path).split(b"\n")[:-1]  # the body ends with a newline (unseal checks it)
    if len(lines) < 2:
        raise CheckpointError(path, "missing header lines")
    header = lines[0].split(b" ")
    if len(header) != 3 or header[0] != _MAGIC:
        raise CheckpointError(path, "not a tidelog checkpoint")
    if header[1] != kind.encode():
        raise CheckpointError(path, f"a {header[1].decode(errors='replace')!r} checkpoint, expected {kind!r}")
    if header[2] != str(FORMAT_VERSION).encode():
        raise CheckpointError(path, f"unsupported format version {header[2].decode(errors='replace')!r}")
    count = _parse_int(lines[1], path)
    if count != len(lines) - 2:
        raise CheckpointError(path, f"{len(lines) - 2} entries where the header says {count}")
    entries = []
    for line in lines[2:]:
        parts = line.split(b" ")
        if len(parts) != fields:
            raise CheckpointError(path, f"an entry of {len(parts)} fields, expected {fields}")
        entries.append(tuple(_parse_int(part, path) for part in parts))
    return entries


def _parse_int(text: bytes, path: str) -> int:
    if _INTEGER.fullmatch(text) is None:
        raise CheckpointError(path, f"not an integer: {text[:32]!r}")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise CheckpointError(path, f"integer out of range: {value}")
    return value


def read_checkpoint_bytes(path: Path) -> bytes | None:
    """A checkpoint file's bytes, or ``None`` when it does not exist; one larger than
    :data:`MAX_CHECKPOINT_BYTES` is refused without being read whole."""
    try:
        with open(path, "rb") as file:
            return read_bounded(file, str(path))
    except FileNotFoundError:
        return None


def read_bounded(file: BinaryIO, path: str) -> bytes:
    """The whole of an open checkpoint file, refused when larger than :data:`MAX_CHECKPOINT_BYTES`.

    Reads what the file holds, not the bound: ``read(n)`` reserves ``n`` bytes before reading, so asking for the
    bound cost every read of a 40-byte checkpoint a 16 MiB allocation (found by the fuzz target ``checkpoints``).
    """
    size = os.fstat(file.fileno()).st_size
    data = file.read(min(size, MAX_CHECKPOINT_BYTES) + 1)
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(path, f"larger than {MAX_CHECKPOINT_BYTES} bytes")
    return data


class CheckpointFile:
    """One checkpoint file of a given kind, each entry ``fields`` integers wide.

    Stateless apart from its identity: every :meth:`read` goes to disk and every :meth:`write` replaces the
    whole file atomically. Writes to one file must not run concurrently (the owner serializes them).
    """

    __slots__ = ("fields", "kind", "path")

    def __init__(self, path: Path, kind: str, fields: int) -> None:
        self.path = path
        self.kind = kind
        self.fields = fields

    def read(self) -> list[tuple[int, ...]] | None:
        """The entries, or ``None`` when the file does not exist."""
        data = read_checkpoint_bytes(self.path)
        if data is None:
            return None
        return decode_checkpoint(data, self.kind, self.fields, path=str(self.path))

    def write(self, entries: Iterable[Sequence[int]]) -> None:
        """Replace the file with ``entries``; durable when this returns."""
        write_atomically(self.path, encode_checkpoint(self.kind, self.fields, entries))

    def __repr__(self) -> str:
        return f"CheckpointFile({str(self.path)!r}, kind={self.kind!r})"


class HighWatermarkCheckpoint:
    """The partition's high watermark as last checkpointed (file ``hw-checkpoint``).

    The high watermark only moves forward while a replica runs, but it is checkpointed lazily, so after a
    restart the stored value may be behind the true one (never ahead: it is written only after it was known
    committed). A replica starts from it and learns the rest from the leader.
    """

    __slots__ = ("_file",)

    KIND = "high-watermark"

    def __init__(self, path: Path) -> None:
        self._file = CheckpointFile(path, self.KIND, 1)

    @property
    def path(self) -> Path:
        return self._file.path

    def read(self, default: int = 0) -> int:
        """The stored high watermark, or ``default`` when no checkpoint was ever written."""
        entries = self._file.read()
        if entries is None:
            return default
        if len(entries) != 1:
            raise CheckpointError(str(self.path), f"{len(entries)} entries, expected exactly one")
        (hw,) = entries[0]
        if hw < 0:
            raise CheckpointError(str(self.path), f"negative high watermark {hw}")
        return hw

    def write(self, hw: int) -> None:
        """Store ``hw`` durably (fsynced and renamed into place before this returns)."""
        if hw < 0:
            raise ValueError(f"a high watermark cannot be negative: {hw}")
        self._file.write([(hw,)])

    def __repr__(self) -> str:
        return f"HighWatermarkCheckpoint({str(self.path)!r})"
