"""Writing a list of byte parts at a file position: buffers with ``pwritev``, slices of other files with
``copy_file_range``.

A segment appends batches this way (typically each batch's rewritten 16-byte head and the rest of the client's
buffer, so the payload is never copied in Python), and the replication layer is told of writes in the same
parts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

Buffer = bytes | bytearray | memoryview
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class FileSlice:
    """Bytes to write that are already in another file: a transactional append's spool (see
    :mod:`tidelog.broker.appends.spool`). Written with ``copy_file_range``, an in-kernel copy between page-cache
    pages: writing a 64 MiB append from a memory map of its spool took ~180 ms here (a page fault per source
    page), copying it ~25 ms."""

    __slots__ = ("fd", "length", "offset")

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd = fd
        self.offset = offset
        self.length = length

    def skip(self, count: int) -> FileSlice:
        """The same slice without its first ``count`` bytes."""
        return FileSlice(self.fd, self.offset + count, self.length - count)

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileSlice(fd={self.fd}, offset={self.offset}, length={self.length})"


def write_at(fd: int, parts: Sequence[Buffer | FileSlice], position: int) -> None:
    """Write ``parts`` at ``position``, by the quickest means for what they are."""
    if parts and isinstance(parts[-1], FileSlice):  # a transactional append, from its spool
        write_parts(fd, parts, position)
    else:
        pwritev_all(fd, parts, position)  # type: ignore[arg-type]  # only buffers here


def write_parts(fd: int, parts: Sequence[Buffer | FileSlice], position: int) -> None:
    """Write ``parts`` at ``position``: runs of buffers with ``pwritev``, file slices with ``copy_file_range``."""
    run: list[Buffer] = []
    for part in parts:
        if isinstance(part, FileSlice):
            if run:
                pwritev_all(fd, run, position)
                position += sum(map(len, run))
                run = []
            _copy_all(part, fd, position)
            position += part.length
        else:
            run.append(part)
    if run:
        pwritev_all(fd, run, position)


def _copy_all(source: FileSlice, fd: int, position: int) -> None:
    offset, left = source.offset, source.length
    while left:
        copied = os.copy_file_range(source.fd, fd, left, offset, position)
        if copied <= 0:
            raise OSError(f"copy_file_range stopped with {left} bytes left to copy")
        offset += copied
        position += copied
        left -= copied


def pwritev_all(fd: int, parts: Sequence[Buffer], position: int) -> None:
    """Write every byte of ``parts`` at ``position`` with as few ``pwritev`` calls as the kernel allows."""
    if len(parts) <= IOV_MAX:
        written = os.pwritev(fd, parts, position)
        if written == sum(map(len, parts)):  # the usual outcome: everything in one call
            return
        parts = _consume(list(parts), written)
        position += written
    pending = list(parts)
    while pending:
        written = os.pwritev(fd, pending[:IOV_MAX], position)
        position += written
        pending = _consume(pending, written)


def _consume(parts: list[Buffer], written: int) -> list[Buffer]:
    """What is left of ``parts`` after ``written`` bytes of them went out."""
    while parts and written >= len(parts[0]):
        written -= len(parts.pop(0))
    if written:
        parts[0] = memoryview(parts[0])[written:]
    return parts
