"""Where a running broker can be reached, written to its data directory so the CLI finds it without flags.

A broker started with ``tidelog serve`` (``make run``) runs its embedded etcd on a port chosen at random, which
the CLI cannot guess. So the broker writes ``<data_dir>/endpoints.json`` once it serves — its gRPC and wire
addresses, its NATS URLs, etcd endpoints and namespace, and its PID — and removes the file when it stops cleanly.
A broker that dies without removing it (SIGKILL, a crash) leaves a stale file: readers check that the PID it
names is still alive, and ignore the file otherwise.

The file is written atomically (a temporary file, fsynced, then renamed over), so a reader sees the old file or
the new one, never half of one. :func:`read_endpoints` is what the CLI calls; explicit flags and environment
variables still win over anything found here (see :mod:`tidelog.cli.common`).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tidelog.launch.process import pid_alive

__all__ = ["DEFAULT_DATA_DIR", "ENDPOINTS_FILE", "Endpoints", "read_endpoints", "remove_endpoints", "write_endpoints"]

ENDPOINTS_FILE = "endpoints.json"
DEFAULT_DATA_DIR = Path("./tidelog-data")
"""The data directory ``tidelog serve`` uses when none is given (``BrokerConfig.data_dir``'s default)."""


@dataclass(frozen=True)
class Endpoints:
    """How to reach one running broker and the NATS and etcd it uses."""

    broker_id: str
    pid: int
    grpc: str  # host:port of the Liftbridge gRPC API
    wire: str  # host:port of the tidelog wire protocol
    nats: list[str] = field(default_factory=list)  # nats://host:port
    etcd: list[str] = field(default_factory=list)  # http://host:port
    namespace: str = ""  # the cluster's namespace in etcd ("": not recorded, the default)

    @property
    def alive(self) -> bool:
        """Whether the broker that wrote this still runs (a stale file names a dead PID)."""
        return pid_alive(self.pid)


def write_endpoints(data_dir: Path, endpoints: Endpoints) -> Path:
    """Write ``<data_dir>/endpoints.json`` atomically; its path."""
    path = data_dir / ENDPOINTS_FILE
    temporary = path.with_name(f".{ENDPOINTS_FILE}.{os.getpid()}.tmp")
    data = json.dumps(asdict(endpoints), indent=2).encode() + b"\n"
    try:
        with temporary.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return path


def remove_endpoints(data_dir: Path, pid: int | None = None) -> None:
    """Remove ``<data_dir>/endpoints.json`` if it is ours (written by ``pid``, default this process)."""
    path = data_dir / ENDPOINTS_FILE
    found = _load(path)
    if found is not None and found.pid == (os.getpid() if pid is None else pid):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def read_endpoints(data_dir: Path) -> Endpoints | None:
    """The endpoints of the broker running on ``data_dir``; ``None`` if there is no file, it cannot be read, or
    the broker that wrote it is gone."""
    found = _load(data_dir / ENDPOINTS_FILE)
    if found is None or not found.alive:
        return None
    return found


def _load(path: Path) -> Endpoints | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return Endpoints(
            broker_id=str(raw["broker_id"]),
            pid=int(raw["pid"]),
            grpc=str(raw["grpc"]),
            wire=str(raw["wire"]),
            nats=[str(url) for url in raw.get("nats", [])],
            etcd=[str(url) for url in raw.get("etcd", [])],
            namespace=str(raw.get("namespace", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
