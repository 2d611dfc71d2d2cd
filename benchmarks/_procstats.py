"""What a set of server processes costs, read from ``/proc``: resident memory, open descriptors, CPU time, and the
TCP connections between them.

A server is counted with its descendants (tidelog's broker with the NATS server and etcd it embeds; a nats-server
has none), so each side is charged for everything it runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["connections_between", "cpu_seconds", "descendants", "open_fds", "rss_mb"]

_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_ESTABLISHED = "01"


def descendants(pids: Iterable[int]) -> list[int]:
    """``pids`` and every live process below them."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    pending = [pid for pid in pids if (_PROC / str(pid)).exists()]
    while pending:
        pid = pending.pop()
        out.append(pid)
        pending.extend(children.get(pid, []))
    return out


def rss_mb(pids: Iterable[int]) -> float:
    """Resident memory of ``pids`` together, MiB."""
    total = 0
    for pid in pids:
        try:
            total += int((_PROC / str(pid) / "statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError):
            continue
    return total / (1 << 20)


def open_fds(pids: Iterable[int]) -> int:
    """File descriptors open in ``pids`` together."""
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(_PROC / str(pid) / "fd"))
        except OSError:
            continue
    return total


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU time of ``pids`` so far, seconds (threads included)."""
    ticks = 0
    for pid in pids:
        try:
            fields = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICKS


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    fd_dir = _PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connections_between(pids: Iterable[int], ports: Iterable[int]) -> int:
    """Established TCP connections opened by ``pids`` to any of ``ports`` (IPv4 and IPv6, this namespace)."""
    inodes: set[str] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    wanted = {f"{port:04X}" for port in ports}
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = fields[2].rsplit(":", 1)[1]
            if fields[3] == _ESTABLISHED and remote_port in wanted and fields[9] in inodes:
                count += 1
    return count
