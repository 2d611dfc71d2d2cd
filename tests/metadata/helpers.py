"""The controller harness its tests share: controllers of several brokers over one real etcd (a fresh key prefix
per test), an observer of the metadata they write, and partition records made short (:func:`part`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
import pytest
import pytest_asyncio

from tests.helpers import LONG_BOUND
from tidelog.broker.embedded import EmbeddedEtcd
from tidelog.metadata.controller import Controller
from tidelog.metadata.controller_election import ControllerElection
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import BrokerRecord, Keys, PartitionRecord, StreamConfig, StreamRecord, encode
from tidelog.metadata.snapshot import MetadataSnapshot

from .pausable_proxy import PausableProxy

TTL = 2  # the controller election's lease, seconds


@dataclass
class Node:
    """One broker's controller machinery."""

    id: str
    client: Any
    mirror: MetadataMirror
    election: ControllerElection
    controller: Controller

    async def active(self) -> Controller:
        return await self.controller.wait_for(lambda c: c.active, LONG_BOUND)


class Cluster:
    """Simulated brokers and controller nodes of one test, under the test's own prefix."""

    def __init__(self, etcd: EmbeddedEtcd, keys: Keys) -> None:
        self.etcd = etcd
        self.keys = keys
        self.admin: Any = None
        self.observer: MetadataMirror | None = None
        self.leases: dict[str, Any] = {}
        self.nodes: list[Node] = []
        self._clients: list[Any] = []
        self._proxies: list[PausableProxy] = []

    async def start(self) -> None:
        self.admin = await self.client()
        self.observer = MetadataMirror(self.admin, self.keys)
        await self.observer.start()

    async def client(self, proxy: PausableProxy | None = None) -> Any:
        client = aetcd.Client(host=self.etcd.host, port=proxy.port if proxy else self.etcd.client_port, timeout=10)
        await client.connect()
        self._clients.append(client)
        return client

    async def proxy(self) -> PausableProxy:
        proxy = PausableProxy(self.etcd.host, self.etcd.client_port)
        await proxy.start()
        self._proxies.append(proxy)
        return proxy

    # ---- simulated brokers ----

    async def up(self, broker_id: str, *, wire_port: int = 1, started_ns: int = 0, rack: str = "") -> BrokerRecord:
        """Register ``broker_id`` under a fresh lease of the test's."""
        record = BrokerRecord(broker_id, "127.0.0.1", 1, wire_port, started_ns, rack)
        lease = await self.admin.lease(60)
        self.leases[broker_id] = lease
        await self.admin.put(self.keys.broker(broker_id), encode(record), lease=lease)
        await self.wait(lambda s: s.brokers.get(broker_id) == record)
        return record

    async def kill(self, broker_id: str) -> None:
        await self.leases.pop(broker_id).revoke()

    async def stream(self, name: str, *parts: PartitionRecord, unclean: bool | None = None) -> None:
        """Write a stream and its partitions directly (the controller under test did not place them)."""
        rf = max(len(p.replicas) for p in parts)
        record = StreamRecord(name, name, "", len(parts), rf, 0, StreamConfig(unclean_leader_election=unclean))
        await self.admin.put(self.keys.stream(name), encode(record))
        for p in parts:
            await self.admin.put(self.keys.partition(p.stream, p.id), encode(p))
        await self.wait(lambda s: len(s.partitions_of(name)) == len(parts))

    # ---- controller nodes ----

    async def node(self, node_id: str, *, proxy: PausableProxy | None = None, **options: Any) -> Node:
        client = await self.client(proxy)
        mirror = MetadataMirror(client, self.keys)
        options.setdefault("balance_interval", 3600.0)  # tests that balance say so
        controller = Controller(node_id, client, self.keys, mirror, **options)  # wired as the broker does
        election = ControllerElection(
            client,
            self.keys,
            node_id,
            ttl_seconds=TTL,
            on_elected=controller.on_elected,
            on_deposed=controller.on_deposed,
            retry_seconds=0.1,
        )
        controller.attach(election)
        await mirror.start()
        await election.start()
        node = Node(node_id, client, mirror, election, controller)
        self.nodes.append(node)
        return node

    # ---- observing ----

    async def wait(self, predicate: Callable[[MetadataSnapshot], bool]) -> MetadataSnapshot:
        assert self.observer is not None
        return await self.observer.wait_for(predicate, LONG_BOUND)

    async def partition_becomes(
        self, stream: str, pid: int, check: Callable[[PartitionRecord], bool]
    ) -> PartitionRecord:
        snap = await self.wait(lambda s: (p := s.partition(stream, pid)) is not None and check(p))
        found = snap.partition(stream, pid)
        assert found is not None
        return found

    def partition(self, stream: str, pid: int = 0) -> PartitionRecord:
        assert self.observer is not None
        found = self.observer.snapshot.partition(stream, pid)
        assert found is not None
        return found

    async def close(self) -> None:
        for proxy in self._proxies:
            proxy.resume()
        async with asyncio.timeout(LONG_BOUND):
            for node in self.nodes:
                await node.election.stop()
                await node.controller.stop()
                await node.mirror.stop()
            if self.observer is not None:
                await self.observer.stop()
            for lease in self.leases.values():
                await lease.revoke()
        for proxy in self._proxies:
            await proxy.stop()
        for client in self._clients:
            await client.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def etcd(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EmbeddedEtcd]:
    async with EmbeddedEtcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def cluster(etcd: EmbeddedEtcd, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    keys = Keys("/c/" + re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name).strip("-"))
    cluster = Cluster(etcd, keys)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.close()


def part(
    stream: str, replicas: Sequence[str], leader: str, isr: Sequence[str], epoch: int = 0, pid: int = 0
) -> PartitionRecord:
    """A partition written compactly: ``part("s", "abc", "a", "ab", 3)`` (or with lists of longer ids)."""
    return PartitionRecord(stream, pid, tuple(replicas), leader, tuple(isr), epoch)
