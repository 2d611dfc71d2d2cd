"""The source's ``readFrom`` option: tasks spread over in-sync followers on the driver, ``nearest`` picking a
replica on the task's host, and a Spark batch scan of a three-broker cluster served by the followers, every row
read once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("pyspark")

from tests.helpers import BOUND, LONG_BOUND
from tests.ui.helpers import scrape
from tidelog.client import Admin, LoopThread, Producer
from tidelog.local.cluster import LocalCluster
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.messages import BrokerInfo, PartitionInfo, StreamInfo
from tidelog.spark.options import SourceOptionError, parse_options
from tidelog.spark.planning import OffsetRange
from tidelog.spark.replicas import assign, is_local, nearest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def partition(pid: int, leader: str | None, isr: tuple[str, ...]) -> PartitionInfo:
    return PartitionInfo(pid, leader, ("a", "b", "c"), isr, 1, 100, 100)


def streams(*partitions: PartitionInfo) -> dict[str, StreamInfo]:
    return {"s": StreamInfo("s", "s", tuple(partitions))}


def tasks(pid: int, count: int) -> list[OffsetRange]:
    return [OffsetRange("s", pid, 10 * i, 10 * i + 10, f"s.{pid}") for i in range(count)]


def test_read_from_is_checked() -> None:
    assert parse_options({"streams": "s"}).read_from == "leader"
    assert parse_options({"streams": "s", "READFROM": " Replica "}).read_from == "replica"
    assert parse_options({"streams": "s", "readFrom": "nearest"}).read_from == "nearest"
    with pytest.raises(SourceOptionError, match=r"'readFrom': expected leader, replica or nearest, got 'any'"):
        parse_options({"streams": "s", "readFrom": "any"})


def test_replica_spreads_tasks_over_the_in_sync_followers() -> None:
    info = streams(partition(0, "a", ("a", "b", "c")), partition(1, "b", ("b", "c")), partition(2, "c", ("c",)))
    planned = assign([*tasks(0, 4), *tasks(1, 2), *tasks(2, 2)], info, "replica")
    by_partition = {p: [t.replica for t in planned if t.partition == p] for p in (0, 1, 2)}
    assert by_partition[0] == ["b", "c", "b", "c"]  # ties go in the ISR's order
    assert by_partition[1] == ["c", "c"]  # its only in-sync follower
    assert by_partition[2] == [None, None]  # no in-sync follower: the leader
    assert [(t.start, t.end) for t in planned] == [(t.start, t.end) for t in [*tasks(0, 4), *tasks(1, 2), *tasks(2, 2)]]
    assert assign(tasks(0, 2), info, "leader") == tasks(0, 2)
    assert [t.replica for t in assign(tasks(0, 1), streams(partition(0, None, ("a", "b"))), "nearest")] == [None]


class FakeCluster:
    """What :func:`nearest` asks of a cluster: a partition's ISR and the brokers' hosts."""

    def __init__(self, info: PartitionInfo, hosts: dict[str, str]) -> None:
        self.info = info
        self.hosts = hosts

    async def partition(self, stream: str, partition: int, *, refresh: bool = False) -> PartitionInfo:
        return self.info

    def broker(self, broker_id: str) -> BrokerInfo:
        if broker_id not in self.hosts:
            raise UnavailableError(f"broker {broker_id!r} is not in the cluster metadata")
        return BrokerInfo(broker_id, self.hosts[broker_id], 9293)


def test_nearest_prefers_a_replica_on_this_host() -> None:
    far = "198.51.100.7"  # TEST-NET-2: never this machine
    assert is_local("127.0.0.1") and is_local("localhost") and not is_local(far)
    task = OffsetRange("s", 0, 0, 10, "s.0", replica="b")
    info = partition(0, "a", ("a", "b", "c"))

    def pick(hosts: dict[str, str]) -> str | None:
        cluster: Any = FakeCluster(info, hosts)
        return asyncio.run(nearest(cluster, task))

    assert pick({"a": "127.0.0.1", "b": "127.0.0.1", "c": "127.0.0.1"}) == "b"  # all local: the plan's follower
    assert pick({"a": far, "b": far, "c": "127.0.0.1"}) == "c"  # the one follower here
    assert pick({"a": "127.0.0.1", "b": far, "c": far}) is None  # only the leader is here
    assert pick({"a": far, "b": far, "c": far}) == "b"  # none here: as readFrom=replica
    assert pick({"a": far, "c": far}) == "b"  # a broker missing from the metadata is not a candidate


# -- a Spark batch scan of a three-broker cluster --------------------------------------------------------------

ROWS = 240
SETTINGS = {"replica_lag_time_max_ms": "30000"}  # the ISR stays whole under a loaded machine


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopThread, LocalCluster]]:
    runner = LoopThread("spark-replicas-cluster")
    cluster = LocalCluster(tmp_path_factory.mktemp("spark-replicas"), 3, settings=SETTINGS)
    try:
        runner.run(cluster.start(), timeout=LONG_BOUND * 2)
        yield runner, cluster
    finally:
        runner.run(cluster.stop(), timeout=LONG_BOUND)
        runner.close()


async def fill(cluster: LocalCluster, stream: str) -> None:
    """``stream``: two partitions, each on all three brokers, holding ROWS records, every replica caught up."""
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream(stream, partitions=2, replication_factor=3)

        async def isr_full() -> bool:
            info = await admin.describe_stream(stream)
            return all(len(p.isr) == 3 and p.leader for p in info.partitions)

        await cluster.wait_until(isr_full, LONG_BOUND, f"{stream}: three in-sync replicas per partition")
    async with Producer(cluster.bootstrap()) as producer:
        await asyncio.gather(*(producer.send_and_wait(stream, b"r%03d" % i, partition=i % 2) for i in range(ROWS)))


async def records_out(cluster: LocalCluster, stream: str) -> dict[str, float]:
    """Records the brokers' replicas of ``stream`` served to consumers' fetches, by role."""
    out = {"leader": 0.0, "follower": 0.0}
    for broker in cluster.brokers:
        samples = await scrape(broker.http_url)
        for labels, value in samples.get("tidelog_partition_records_out_total", {}).items():
            found = dict(labels)
            if found.get("stream") == stream:
                out[found["role"]] += value
    return out


@pytest.mark.slow
def test_a_batch_scan_reads_every_row_once_from_the_followers(
    three: tuple[LoopThread, LocalCluster], spark: SparkSession, tmp_path: Path
) -> None:
    runner, cluster = three
    stream = "replicated"
    runner.run(fill(cluster, stream), timeout=LONG_BOUND)

    async def followers_caught_up() -> bool:
        served = await records_out(cluster, stream)  # nothing read yet; and every follower at the HW
        hws: dict[str, set[float]] = {}
        for broker in cluster.brokers:
            samples = await scrape(broker.http_url)
            for labels, value in samples.get("tidelog_partition_high_watermark", {}).items():
                found = dict(labels)
                if found.get("stream") == stream:
                    hws.setdefault(found["partition"], set()).add(value)
        return served == {"leader": 0, "follower": 0} and all(v == {ROWS / 2} for v in hws.values()) and len(hws) == 2

    runner.run(
        cluster.wait_until(followers_caught_up, BOUND, "every follower at the high watermark"), timeout=BOUND * 2
    )
    frame = (
        spark.read.format("tidelog")
        .option("brokers", ",".join(cluster.bootstrap()))
        .option("streams", stream)
        .option("readFrom", "replica")
        .option("maxOffsetsPerSplit", "40")  # three tasks per partition, spread over its two followers
        .load()
    )
    values = sorted(bytes(row.value) for row in frame.select("value").collect())
    assert values == sorted(b"r%03d" % i for i in range(ROWS))  # every row, once
    served = runner.run(records_out(cluster, stream), timeout=BOUND)
    # The followers served the whole scan (a fetch may send past its task's end: counted here, not read).
    assert served["leader"] == 0 and served["follower"] >= ROWS
