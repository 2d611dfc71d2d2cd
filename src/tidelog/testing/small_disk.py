"""A small real filesystem for full-disk tests: a tmpfs mounted on a directory, and ballast that fills it.

Mounting needs root (or ``CAP_SYS_ADMIN``); :func:`mount_small_disk` raises :class:`OSError` where that is
impossible, so a test can skip. Ballast is one file grown until the filesystem refuses a byte; freeing it gives
the space back at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

PAGE = 4096
"""tmpfs allocates whole pages."""


@contextlib.contextmanager
def mount_small_disk(path: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes on ``path`` (created if missing) for the block; unmount it after."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise OSError(errno.EPERM, f"cannot mount a tmpfs on {path}: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


class Ballast:
    """A file that takes up the free space of its filesystem, all or all but ``keep`` bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fill(self, keep: int = 0) -> None:
        """Grow the ballast until the disk is full, then give back ``keep`` bytes (rounded up to pages)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            chunk = bytes(64 * 1024)
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        break
                    chunk = chunk[: len(chunk) // 2]
            if keep:
                size = os.fstat(fd).st_size
                os.ftruncate(fd, max(0, size - (keep + PAGE - 1) // PAGE * PAGE))
        finally:
            os.close(fd)

    def free(self) -> None:
        self.path.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path.parent)
        return stat.f_bavail * stat.f_frsize
