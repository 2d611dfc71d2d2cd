"""The broker's etcd client fails over between the endpoints it is given (it used to dial the first one only, so a
broker whose first etcd member died lost its metadata although the etcd cluster was healthy)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.helpers import BOUND
from tidelog.metadata.etcd_client import EtcdEndpointError, etcd_target, open_etcd
from tidelog.testing.etcd_cluster import EtcdCluster

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


async def test_the_client_carries_on_when_its_first_endpoint_dies(tmp_path: Path) -> None:
    async with EtcdCluster(tmp_path) as etcd:
        client = open_etcd([(HOST, port) for port in etcd.client_ports], timeout=5)
        await client.connect()
        try:
            await client.put(b"k", b"before")
            await etcd.kill(0)  # the member the client is connected to
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
