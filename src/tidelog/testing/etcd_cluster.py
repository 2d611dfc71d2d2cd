"""A real three-member etcd cluster on loopback, for tests of etcd failover.

::

    async with EtcdCluster(tmp_path) as etcd:
        broker = Broker(BrokerConfig(..., etcd_endpoints=tuple(etcd.endpoints)))
        await etcd.kill(0)                       # SIGKILL one member by PID; the other two keep quorum

Every member is a :class:`~tidelog.launch.process.ManagedProcess` on free ports, ready once its ``/health``
answers healthy (which needs a quorum, so all of them start together), and stopped by its PID on the way out.
With ``hosts`` (:class:`~tidelog.testing.netlab.Host`, one per member) each member runs in a network namespace
of its own at its host's address, so that the nemesis can cut it off; :meth:`kill`, :meth:`pause`,
:meth:`resume` and :meth:`restart` are the process faults of one member.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from tidelog.broker.embedded import find_binary
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import ReadinessProbe, http_probe
from tidelog.launch.process import ManagedProcess
from tidelog.testing.netlab import Host

HOST = "127.0.0.1"


class EtcdCluster:
    """``size`` etcd members forming one cluster under ``root``; ``endpoints`` are their client URLs in order."""

    def __init__(
        self, root: Path, size: int = 3, *, ready_within: float = 60.0, hosts: Sequence[Host] | None = None
    ) -> None:
        if hosts is not None and len(hosts) != size:
            raise ValueError(f"{size} etcd members need {size} hosts, got {len(hosts)}")
        self._root = Path(root)
        self._ready_within = ready_within
        self.hosts = [HOST] * size if hosts is None else [host.address for host in hosts]
        ports = free_ports(2 * size, HOST)
        self.client_ports, peer_ports = ports[:size], ports[size:]
        cluster = ",".join(f"m{i}=http://{self.hosts[i]}:{peer_ports[i]}" for i in range(size))
        binary = find_binary("etcd")
        self.members: list[ManagedProcess] = []
        for i in range(size):
            address = self.hosts[i]
            argv = [
                str(binary), "--name", f"m{i}", "--data-dir", str(self._root / f"m{i}"),
                "--listen-client-urls", f"http://{address}:{self.client_ports[i]}",
                "--advertise-client-urls", f"http://{address}:{self.client_ports[i]}",
                "--listen-peer-urls", f"http://{address}:{peer_ports[i]}",
                "--initial-advertise-peer-urls", f"http://{address}:{peer_ports[i]}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", "tidelog-test",
            ]  # fmt: skip
            if hosts is not None:
                argv = hosts[i].command(argv)
            self.members.append(ManagedProcess(argv, log_path=self._root / f"m{i}.log", name=f"etcd m{i}"))
        self.paused: set[int] = set()

    @property
    def endpoints(self) -> list[str]:
        return [f"http://{host}:{port}" for host, port in zip(self.hosts, self.client_ports, strict=True)]

    def _probe(self, index: int) -> ReadinessProbe:
        return http_probe(f"{self.endpoints[index]}/health", body_contains=b'"health":"true"')

    async def start(self) -> None:
        """Start every member at once (none is healthy before a quorum exists) and wait until each is."""
        probes = [self._probe(index) for index in range(len(self.members))]
        try:
            await asyncio.gather(
                *(m.start(p, ready_within=self._ready_within) for m, p in zip(self.members, probes, strict=True))
            )
        except BaseException:
            await self.stop()
            raise

    async def kill(self, index: int) -> None:
        """SIGKILL member ``index`` (a crash) and wait for it to exit."""
        self.paused.discard(index)
        await self.members[index].kill()

    async def restart(self, index: int) -> None:
        """Start a killed member again on its data; returns once it answers healthy (back in the quorum)."""
        await self.members[index].start(self._probe(index), ready_within=self._ready_within)

    def pause(self, index: int) -> None:
        """SIGSTOP member ``index``: it keeps its sockets but answers nothing (a hung VM, a long GC pause)."""
        self.members[index].signal(signal.SIGSTOP)
        self.paused.add(index)

    def resume(self, index: int) -> None:
        """SIGCONT a paused member."""
        self.members[index].signal(signal.SIGCONT)
        self.paused.discard(index)

    async def heal(self) -> None:
        """Every member running again: paused ones resumed, killed ones restarted."""
        for index in sorted(self.paused):
            self.resume(index)
        for index, member in enumerate(self.members):
            if not member.running:
                await self.restart(index)

    async def stop(self) -> None:
        for index in sorted(self.paused):
            if self.members[index].running:
                self.resume(index)
        for member in self.members:
            await member.stop(grace=5)

    async def __aenter__(self) -> EtcdCluster:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.stop()
