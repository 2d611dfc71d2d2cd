"""A FUSE passthrough filesystem that loses every byte not fsynced when the power goes, and fails I/O on demand
(issue 23, item 2, "disk": lost un-fsynced writes, ``EIO``, ``ENOSPC``).

Run as its own process over a *backing* directory (the disk) and a *mount point* (where a broker keeps its
data)::

    python -m tidelog.testing.lossy_fs BACKING MOUNTPOINT CONTROL_SOCKET

What a program on the mount point sees is an ordinary filesystem. Underneath:

- **Data is buffered per file until fsync.** A ``write`` or ``truncate`` does not touch the backing file: it is
  appended to the file's list of pending operations, which reads and ``stat`` replay over the backing bytes. An
  ``fsync``/``fdatasync`` of the file applies its pending operations to the backing file and fsyncs that. So the
  backing directory holds exactly what a disk would hold after a power cut: what was synced.
- **Metadata is durable at once.** ``create``, ``mkdir``, ``rename``, ``unlink`` go straight to the backing
  directory (a simplification, documented in ``docs/durability.md``: a real filesystem may also lose a create
  or a rename whose directory was not fsynced; here only file contents are lost).
- **Power loss** (the ``power-loss`` command): every pending operation of every file is dropped. Kill the
  program using the mount first (SIGKILL): without a writeback cache, every ``write`` it made has reached this
  process by the time it is gone. Its next start reads what was synced, plus a created file's zero length.
- **Faults until healed**: ``fail eio-write`` (every write fails with ``EIO``, nothing kept), ``fail eio-fsync``
  (every fsync fails with ``EIO``, and the file's pending data is then *doomed* as Linux does since 4.13: still
  readable, never written, and the *next* fsync succeeds: a program that retries and trusts it loses the data
  at the next power cut — "fsyncgate"), ``fail enospc`` (a write that would grow a file, or a create, fails
  with ``ENOSPC``; writes inside a file's current size still succeed, as into preallocated blocks).
  ``heal`` ends them.

Commands go over a Unix socket, one line each, answered with one line (``ok ...`` or ``error ...``):
``power-loss``, ``fail KIND``, ``heal``, ``status`` (pending bytes and counts of injected errors). The caller's
side is :class:`tidelog.testing.lossy_disk.LossyDisk`.

Attribute and entry caches are off (``attr_timeout=0``) and the kernel page cache is dropped at each open, so a
restarted program sees the backing state, not what the kernel remembers of the dropped writes.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mfusepy  # type: ignore[import-untyped]

from tidelog.testing.lossy_disk import FAULT_KINDS

__all__ = ["LossyOperations", "main"]


PENDING, DOOMED, APPLIED = "pending", "doomed", "applied"


@dataclass(slots=True)
class _Op:
    """A write (``data``) at ``where``, or a truncation to ``where`` (``data`` None)."""

    where: int
    data: bytes | None
    state: str = PENDING  # DOOMED: a failed fsync's, never written; APPLIED: written, kept to layer over DOOMED


@dataclass(slots=True)
class _Pending:
    """A file's writes and truncations not all on the backing file, in order, and its size as they leave it."""

    size: int
    ops: list[_Op] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes that a power loss would drop."""
        return sum(len(op.data) for op in self.ops if op.data is not None and op.state != APPLIED)


class LossyOperations(mfusepy.Operations):  # type: ignore[misc]
    """The filesystem (see the module docstring); thread-safe under one lock."""

    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = Path(backing)
        self._mutex = threading.RLock()
        self.pending: dict[str, _Pending] = {}
        self.faults: set[str] = set()
        self.injected: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)

    def _real(self, path: str) -> str:
        return str(self.backing / path.lstrip("/"))

    def _pending(self, path: str) -> _Pending:
        found = self.pending.get(path)
        if found is None:
            found = self.pending[path] = _Pending(os.stat(self._real(path)).st_size)
        return found

    # ---- control ----

    def command(self, line: str) -> str:
        words = line.split()
        with self._mutex:
            if words == ["power-loss"]:
                lost = sum(p.nbytes for p in self.pending.values())
                self.pending.clear()
                return f"ok dropped {lost} unsynced bytes"
            if len(words) == 2 and words[0] == "fail" and words[1] in FAULT_KINDS:
                self.faults.add(words[1])
                return f"ok failing {words[1]}"
            if words == ["heal"]:
                self.faults.clear()
                return "ok healed"
            if words == ["status"]:
                pending = sum(p.nbytes for p in self.pending.values())
                counts = " ".join(f"{kind}={count}" for kind, count in self.injected.items())
                return f"ok pending={pending} {counts}"
        return f"error unknown command {line.strip()!r}; known: power-loss, fail {{{','.join(FAULT_KINDS)}}}, heal"

    def _inject(self, kind: str) -> None:
        if kind in self.faults:
            self.injected[kind] += 1
            raise mfusepy.FuseOSError(errno.ENOSPC if kind == "enospc" else errno.EIO)

    # ---- metadata: straight to the backing directory ----

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            st = os.lstat(self._real(path))
            attrs = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            pending = self.pending.get(path)
            if pending is not None:
                attrs["st_size"] = pending.size
            return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            os.unlink(self._real(path))
            self.pending.pop(path, None)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            os.rename(self._real(old), self._real(new))
            self.pending.pop(new, None)
            moved = self.pending.pop(old, None)
            if moved is not None:
                self.pending[new] = moved
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag")
        found = {key: getattr(st, key) for key in keys}
        found.update(f_frsize=st.f_frsize, f_namemax=st.f_namemax)
        return found

    # ---- files: data buffered until fsync ----

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mutex:
            self._inject("enospc")
            fd = os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.close(fd)
            self.pending.pop(path, None)
        return 0

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            if flags & os.O_TRUNC:
                self.truncate(path, 0)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            fd = os.open(self._real(path), os.O_RDONLY)
            try:
                window = bytearray(os.pread(fd, size, offset))
            finally:
                os.close(fd)
            pending = self.pending.get(path)
            if pending is None:
                return bytes(window)
            window.extend(bytes(size - len(window)))
            for op in pending.ops:
                where, data = op.where, op.data
                if data is None:  # a truncation: what lies beyond reads as zeros if the file grows again
                    if where < offset + size:
                        start = max(where - offset, 0)
                        window[start:] = bytes(size - start)
                    continue
                start, end = max(where, offset), min(where + len(data), offset + size)
                if start < end:
                    window[start - offset : end - offset] = data[start - where : end - where]
            return bytes(window[: max(0, min(size, pending.size - offset))])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            self._inject("eio-write")
            pending = self._pending(path)
            if offset + len(data) > pending.size:
                self._inject("enospc")
            pending.ops.append(_Op(offset, bytes(data)))
            pending.size = max(pending.size, offset + len(data))
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._mutex:
            pending = self._pending(path)
            if length > pending.size:
                self._inject("enospc")
            pending.ops.append(_Op(length, None))
            pending.size = length
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        raise mfusepy.FuseOSError(errno.EOPNOTSUPP)  # storage falls back to writing zeros

    def flush(self, path: str, fh: int) -> int:
        return 0  # close() is no durability point

    def release(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            pending = self.pending.get(path)
            if "eio-fsync" in self.faults:
                self.injected["eio-fsync"] += 1
                for op in pending.ops if pending is not None else ():
                    if op.state == PENDING:  # Linux marks the pages clean: readable, never written
                        op.state = DOOMED
                raise mfusepy.FuseOSError(errno.EIO)
            if pending is None:
                return 0
            fd = os.open(self._real(path), os.O_WRONLY)
            try:
                for op in pending.ops:
                    if op.state != PENDING:
                        continue
                    if op.data is None:
                        os.ftruncate(fd, op.where)
                    else:
                        os.pwrite(fd, op.data, op.where)
                    op.state = APPLIED
                os.fsync(fd)
            finally:
                os.close(fd)
            if all(op.state == APPLIED for op in pending.ops):
                del self.pending[path]
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # metadata is durable at once (module docstring)


def _serve_control(ops: LossyOperations, socket_path: Path) -> None:
    """Answer commands, one line each, for as long as the process lives (a daemon thread)."""
    socket_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_path))
    server.listen(4)
    while True:
        connection, _ = server.accept()
        with connection, connection.makefile("rw") as stream:
            for line in stream:
                stream.write(ops.command(line) + "\n")
                stream.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m tidelog.testing.lossy_fs BACKING MOUNTPOINT CONTROL_SOCKET", file=sys.stderr)
        return 2
    backing, mountpoint, control = (Path(arg) for arg in argv)
    if not backing.is_dir() or not mountpoint.is_dir():
        print(f"both {backing} and {mountpoint} must be existing directories", file=sys.stderr)
        return 2
    ops = LossyOperations(backing)
    threading.Thread(target=_serve_control, args=(ops, control), daemon=True, name="lossy-fs-control").start()
    try:
        mfusepy.FUSE(
            ops,
            str(mountpoint),
            foreground=True,
            nothreads=False,
            attr_timeout=0,
            entry_timeout=0,
            negative_timeout=0,
            fsname="tidelog-lossy",
        )
    except RuntimeError as exc:  # libfuse's status: a failed mount, or the session ended by a signal
        print(f"lossy_fs: {mountpoint}: libfuse ended with status {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
