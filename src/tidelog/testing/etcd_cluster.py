"""A real three-member etcd cluster on loopback, for tests of etcd failover.

::

    async with EtcdCluster(tmp_path) as etcd:
        broker = Broker(BrokerConfig(..., etcd_endpoints=tuple(etcd.endpoints)))
        await etcd.kill(0)                       # SIGKILL one member by PID; the other two keep quorum

Every member is a :class:`~tidelog.launch.process.ManagedProcess` on free ports, ready once its ``/health``
answers healthy (which needs a quorum, so all of them start together), and stopped by its PID on the way out.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType

from tidelog.broker.embedded import find_binary
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import http_probe
from tidelog.launch.process import ManagedProcess

HOST = "127.0.0.1"


class EtcdCluster:
    """``size`` etcd members forming one cluster under ``root``; ``endpoints`` are their client URLs in order."""

    def __init__(self, root: Path, size: int = 3, *, ready_within: float = 60.0) -> None:
        self._root = Path(root)
        self._ready_within = ready_within
        ports = free_ports(2 * size, HOST)
        self.client_ports, peer_ports = ports[:size], ports[size:]
        cluster = ",".join(f"m{i}=http://{HOST}:{peer_ports[i]}" for i in range(size))
        binary = find_binary("etcd")
        self.members: list[ManagedProcess] = []
        for i in range(size):
            argv = [
                str(binary), "--name", f"m{i}", "--data-dir", str(self._root / f"m{i}"),
                "--listen-client-urls", f"http://{HOST}:{self.client_ports[i]}",
                "--advertise-client-urls", f"http://{HOST}:{self.client_ports[i]}",
                "--listen-peer-urls", f"http://{HOST}:{peer_ports[i]}",
                "--initial-advertise-peer-urls", f"http://{HOST}:{peer_ports[i]}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "tidelog-test",
            ]  # fmt: skip
            self.members.append(ManagedProcess(argv, log_path=self._root / f"m{i}.log", name=f"etcd m{i}"))

    @property
    def endpoints(self) -> list[str]:
        return [f"http://{HOST}:{port}" for port in self.client_ports]

    async def start(self) -> None:
        """Start every member at once (none is healthy before a quorum exists) and wait until each is."""
        probes = [http_probe(f"{url}/health", body_contains=b'"health":"true"') for url in self.endpoints]
        try:
            await asyncio.gather(
                *(m.start(p, ready_within=self._ready_within) for m, p in zip(self.members, probes, strict=True))
            )
        except BaseException:
            await self.stop()
            raise

    async def kill(self, index: int) -> None:
        """SIGKILL member ``index`` (a crash) and wait for it to exit."""
        await self.members[index].kill()

    async def stop(self) -> None:
        for member in self.members:
            await member.stop(grace=5)

    async def __aenter__(self) -> EtcdCluster:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()
