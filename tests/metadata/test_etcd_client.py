"""The broker's etcd client fails over between the endpoints it is given (it used to dial the first one only, so a
broker whose first etcd member died lost its metadata although the etcd cluster was healthy)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import BOUND
from tidelog.broker.embedded import find_binary
from tidelog.launch.ports import free_ports
from tidelog.launch.probes import http_probe
from tidelog.launch.process import ManagedProcess
from tidelog.metadata.etcd_client import EtcdEndpointError, etcd_target, open_etcd

HOST = "127.0.0.1"


def test_one_endpoint_is_dialled_as_given() -> None:
    assert etcd_target([("etcd.example", 2379)]) == ("etcd.example", 2379)


def test_several_endpoints_become_one_target_listing_each_in_order() -> None:
    host, port = etcd_target([("127.0.0.1", 2379), ("127.0.0.2", 12379), ("127.0.0.3", 22379)])
    assert f"{host}:{port}" == "ipv4:127.0.0.1:2379,127.0.0.2:12379,127.0.0.3:22379"
    host, port = etcd_target([("::1", 2379), ("::2", 2380)])
    assert f"{host}:{port}" == "ipv6:[::1]:2379,[::2]:2380"
    host, port = etcd_target([("localhost", 2379), ("127.0.0.2", 2380)])
    assert f"{host}:{port}" == "ipv4:127.0.0.1:2379,127.0.0.2:2380"


def test_endpoints_that_cannot_share_a_target_are_refused() -> None:
    with pytest.raises(EtcdEndpointError, match="mix IPv4 and IPv6"):
        etcd_target([("127.0.0.1", 2379), ("::1", 2379)])
    with pytest.raises(EtcdEndpointError, match="does not resolve"):
        etcd_target([("127.0.0.1", 2379), ("no-such-host.invalid", 2379)])


@contextlib.asynccontextmanager
async def three_members(root: Path) -> AsyncIterator[list[tuple[ManagedProcess, int]]]:
    """A real three-member etcd cluster on loopback: (process, client port) per member."""
    binary = find_binary("etcd")
    ports = free_ports(6, HOST)
    clients, peers = ports[:3], ports[3:]
    cluster = ",".join(f"m{i}=http://{HOST}:{peers[i]}" for i in range(3))
    members = []
    for i in range(3):
        argv = [
            str(binary), "--name", f"m{i}", "--data-dir", str(root / f"m{i}"),
            "--listen-client-urls", f"http://{HOST}:{clients[i]}",
            "--advertise-client-urls", f"http://{HOST}:{clients[i]}",
            "--listen-peer-urls", f"http://{HOST}:{peers[i]}",
            "--initial-advertise-peer-urls", f"http://{HOST}:{peers[i]}",
            "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "failover",
        ]  # fmt: skip
        members.append((ManagedProcess(argv, log_path=root / f"m{i}.log", name=f"etcd m{i}"), clients[i]))
    try:
        probes = [http_probe(f"http://{HOST}:{port}/health", body_contains=b'"health":"true"') for _, port in members]
        await asyncio.gather(
            *(p.start(probe, ready_within=BOUND) for (p, _), probe in zip(members, probes, strict=True))
        )
        yield members
    finally:
        for process, _ in members:
            await process.stop(grace=5)


async def test_the_client_carries_on_when_its_first_endpoint_dies(tmp_path: Path) -> None:
    async with three_members(tmp_path) as members:
        client = open_etcd([(HOST, port) for _, port in members], timeout=5)
        await client.connect()
        try:
            await client.put(b"k", b"before")
            await members[0][0].kill()  # the member the client is connected to
            deadline = asyncio.get_running_loop().time() + BOUND
            while True:
                try:
                    await client.put(b"k", b"after")
                    break
                except Exception:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            found = await client.get(b"k")
            assert found is not None and found.value == b"after"
        finally:
            await client.close()
