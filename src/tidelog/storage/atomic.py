"""Replace a file so that a crash leaves either the old contents or the new, never a mix.

Every checkpoint and every compacted segment is written this way:

1. write the new contents to a sibling file (``{name}{suffix}``) in the *same directory*, so the final
   rename never crosses a file system and is atomic;
2. flush and ``fsync`` it, so the data is on disk before any name points at it (otherwise a crash after the
   rename could leave the target name on an empty or partial file);
3. ``os.replace`` it over the target;
4. ``fsync`` the directory, so the rename itself is durable and a crash cannot bring the old name back after
   the caller was told the write happened.

A crash before step 3 leaves the target untouched and a stray sibling. The sibling has a fixed name, so the
next write of the same target truncates and reuses it; code that owns a directory may also delete strays at
start-up (compaction does, see :func:`tidelog.storage.compaction.remove_leftovers`). One writer per target at a
time: the sibling name is not unique, and callers (a checkpoint, or the log under its lock) serialize writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

TEMP_SUFFIX = ".tmp"


def fsync_directory(directory: Path) -> None:
    """Make renames, creations and deletions inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_writer(path: Path, *, suffix: str = TEMP_SUFFIX) -> Iterator[BinaryIO]:
    """Yield a binary file whose contents replace ``path`` atomically when the block exits normally.

    If the block raises, the sibling file is deleted and ``path`` is left as it was. Streaming writers (segment
    compaction) write through the yielded file; :func:`write_atomically` is the one-shot form.
    """
    temp = path.with_name(path.name + suffix)
    file = open(temp, "wb")  # noqa: SIM115 - closed on every path below, before the rename
    try:
        yield file
        file.flush()
        os.fsync(file.fileno())
    except BaseException:
        file.close()
        temp.unlink(missing_ok=True)
        raise
    file.close()
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: after a crash the file holds either its old contents or ``data``."""
    with atomic_writer(path) as file:
        file.write(data)
