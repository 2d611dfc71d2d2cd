"""Followers fetch every partition they follow from one leader broker over one connection (fetch sessions).

Three real brokers (a LocalCluster) and one stream of 30 partitions with replication factor 3: each broker
follows 20 partitions from two leaders. The broker-to-broker TCP connections, counted from ``/proc`` for each
broker's PID towards the other brokers' wire ports, stay at a small constant (one fetch session per leader,
plus the control links), where one connection per followed partition made 20 per broker. A write to every
partition is replicated (acks ALL with three in-sync replicas), and a follower killed and restarted catches
up until every partition has three in-sync replicas again.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.helpers import BOUND
from tidelog.client.admin import Admin
from tidelog.client.cluster import Cluster
from tidelog.client.producer import Producer
from tidelog.local.cluster import LocalCluster
from tidelog.protocol.messages import Acks

pytestmark = pytest.mark.slow

PARTITIONS = 30
MAX_PEER_CONNECTIONS = 6  # per broker: two fetch sessions, its links to the controller and peers, slack
SETTINGS = {
    "shutdown_timeout_ms": "5000",
    "broker_lease_ttl_ms": "2000",
    "replica_lag_time_max_ms": "3000",
}


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connections_to(pid: int, ports: set[int]) -> int:
    """Established TCP connections that ``pid`` holds towards any of ``ports`` (its outgoing ones)."""
    inodes = _socket_inodes(pid)
    wanted = {f"{port:04X}" for port in ports}
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and fields[2].rsplit(":", 1)[1] in wanted and fields[9] in inodes:
                count += 1
    return count


def peer_connections(cluster: LocalCluster) -> dict[str, int]:
    """Per broker: its connections to the other brokers' wire ports."""
    out = {}
    for broker in cluster.brokers:
        assert broker.pid is not None
        others = {b.wire_port for b in cluster.brokers if b is not broker}
        out[broker.id] = connections_to(broker.pid, others)
    return out


async def all_in_sync(cluster: LocalCluster, stream: str) -> bool:
    for i in range(PARTITIONS):
        record = await cluster.partition_record(stream, i)
        if record is None or len(record.isr) != 3 or not record.leader:
            return False
    return True


async def test_followers_share_one_connection_per_leader_and_catch_up_after_a_restart(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path, 3, settings=SETTINGS) as cluster:
        client = Cluster(cluster.bootstrap())
        producer = Producer(cluster=client, acks=Acks.ALL, linger_ms=0, idempotent=False)
        await producer.start()
        try:
            await Admin(cluster=client).create_stream("wide", partitions=PARTITIONS, replication_factor=3)
            await cluster.wait_until(lambda: all_in_sync(cluster, "wide"), BOUND, "30 partitions, 3 in sync each")

            async def write_all(round_: int) -> None:
                async def write(i: int) -> None:
                    async def written() -> bool:
                        try:
                            await (await producer.send("wide", b"r%d" % round_, partition=i))
                        except Exception:
                            client.forget("wide")  # a new leader after the kill: ask again
                            raise
                        return True

                    await cluster.wait_until(written, BOUND, f"an acknowledged write to wide/{i}")

                await asyncio.gather(*(write(i) for i in range(PARTITIONS)))

            await write_all(0)  # acks ALL with three in sync: on every replica
            counts = peer_connections(cluster)
            assert all(0 < n <= MAX_PEER_CONNECTIONS for n in counts.values()), counts

            victim = cluster.brokers[2].id
            await cluster.kill(victim)
            await write_all(1)  # the survivors take over what it led, and commit without it
            await cluster.restart(victim)
            await cluster.wait_until(lambda: all_in_sync(cluster, "wide"), BOUND * 2, "the restarted broker in sync")
            counts = peer_connections(cluster)
            assert all(n <= MAX_PEER_CONNECTIONS for n in counts.values()), counts  # a broker leading all follows none
        finally:
            await producer.close()
            await client.close()
