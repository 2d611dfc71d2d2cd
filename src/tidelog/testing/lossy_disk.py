"""The caller's side of :mod:`tidelog.testing.lossy_fs`: mount a lossy filesystem where a broker keeps its data,
cut its power, make its writes or fsyncs fail.

::

    async with LossyDisk(backing=root / "disk", mountpoint=handle.data_dir) as disk:
        ...                                  # start the broker on handle.data_dir
        await cluster.kill(handle.id)        # the node's power goes: the process first,
        await disk.power_loss()              # then every byte it wrote and did not fsync
        await disk.fail("eio-fsync")         # fsyncs fail with EIO until disk.heal()

The filesystem runs as a child process (stopped by its PID: SIGTERM unmounts it), ready once the mount point is
a mount. Needs ``/dev/fuse``, ``fusermount3`` (Debian's ``fuse3``, ``make system-deps``) and the ``mfusepy``
package (the ``dev`` extra); :func:`lossy_disk_available` says why not when one is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path
from types import TracebackType

from tidelog.launch.process import ManagedProcess

__all__ = ["FAULT_KINDS", "LossyDisk", "LossyDiskError", "lossy_disk_available"]

FAULT_KINDS = ("eio-write", "eio-fsync", "enospc")
"""What :meth:`LossyDisk.fail` can inject (:mod:`tidelog.testing.lossy_fs` says what each does)."""
MOUNT_WITHIN = 20.0
COMMAND_TIMEOUT = 10.0


class LossyDiskError(RuntimeError):
    """The filesystem refused a command, or could not be mounted."""


def lossy_disk_available() -> str | None:
    """None when this machine can mount a lossy filesystem; otherwise why not."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (FUSE is not available here)"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount3 is not installed (Debian's fuse3: make system-deps)"
    if importlib.util.find_spec("mfusepy") is None:
        return "the Python package mfusepy is not installed (the dev extra)"
    return None


def _listed_mount(path: Path) -> bool:
    """Whether ``path`` is in the mount table (a dead FUSE daemon's mount is, though ``stat`` on it fails)."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


class LossyDisk:
    """A :mod:`~tidelog.testing.lossy_fs` filesystem over ``backing``, mounted at ``mountpoint``."""

    def __init__(self, backing: Path, mountpoint: Path, *, name: str = "lossy-fs") -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.control = self.backing.parent / f".{self.backing.name}.control"
        argv = [sys.executable, "-m", "tidelog.testing.lossy_fs", str(self.backing), str(self.mountpoint)]
        self.process = ManagedProcess(
            [*argv, str(self.control)], log_path=self.backing.parent / f"{self.backing.name}.log", name=name
        )

    async def start(self) -> None:
        reason = lossy_disk_available()
        if reason is not None:
            raise LossyDiskError(f"cannot mount a lossy filesystem: {reason}")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)

        def is_mounted() -> bool:
            return os.path.ismount(self.mountpoint) and self.control.exists()

        async def mounted() -> bool:
            return await asyncio.to_thread(is_mounted)

        await self.process.start(mounted, ready_within=MOUNT_WITHIN)

    async def stop(self) -> None:
        """Unmount (SIGTERM to the filesystem's process, by PID; a lazy ``fusermount3 -u -z`` if a killed one
        left its mount behind); idempotent."""
        await self.process.stop(grace=10)
        if await asyncio.to_thread(_listed_mount, self.mountpoint):
            program = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
            unmount = await asyncio.create_subprocess_exec(program, "-u", "-z", str(self.mountpoint))
            await asyncio.wait_for(unmount.wait(), COMMAND_TIMEOUT)

    async def __aenter__(self) -> LossyDisk:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()

    # ---- faults ----

    async def power_loss(self) -> int:
        """Drop every byte not fsynced; returns how many. Kill the program using the disk first."""
        answer = await self.command("power-loss")
        return int(answer.split()[2])

    async def fail(self, kind: str) -> None:
        """Fail every ``kind`` (``eio-write``, ``eio-fsync``, ``enospc``) until :meth:`heal`."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown disk fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        await self.command(f"fail {kind}")

    async def heal(self) -> None:
        await self.command("heal")

    async def status(self) -> dict[str, int]:
        """Bytes pending (not fsynced) and the count of each error injected so far."""
        answer = await self.command("status")
        return {key: int(value) for key, value in (word.split("=") for word in answer.split()[1:])}

    async def command(self, line: str) -> str:
        answer = await asyncio.wait_for(asyncio.to_thread(self._command, line), COMMAND_TIMEOUT)
        if not answer.startswith("ok"):
            raise LossyDiskError(f"{self.mountpoint}: {answer}")
        return answer

    def _command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(COMMAND_TIMEOUT)
            connection.connect(str(self.control))
            with connection.makefile("rw") as stream:
                stream.write(line + "\n")
                stream.flush()
                return stream.readline().strip()
