"""Fail to safety, end to end: two real brokers (in process, sharing one etcd and one NATS), a leader whose disk
lost committed records, appends refused while reads go on and the follower keeps its copy, then ``reset-head``
through the client and through the ``tidelog`` command, and appends resuming.

The loss is made as a disk makes it: with both brokers stopped, the leader's segment files are cut in the middle
(recovery then keeps the whole batches before the cut), while its high-watermark checkpoint still says six
records were committed. The follower was stopped first, so the leader comes back as the only ISR member and is
elected again, cleanly, by the book: only the checkpoint tells that its log lost records.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.broker.helpers import until
from tests.helpers import BOUND
from tidelog.broker.config import BrokerConfig
from tidelog.broker.embedded import EmbeddedEtcd, EmbeddedNats
from tidelog.client.admin import Admin
from tidelog.local.serve_process import TIDELOG, clean_env
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import (
    InvalidArgumentError,
    PartitionSuspendedError,
    UnknownPartitionError,
    UnknownStreamError,
)
from tidelog.protocol.messages import Acks, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse
from tidelog.protocol.records import NewRecord, build_batch, decode_records, iter_batches
from tidelog.replication.follower.fetcher import FetcherState
from tidelog.server import Broker
from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE, HighWatermarkCheckpoint
from tidelog.storage.recovery import MARKER_FILE

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

STREAM = "safety"
RECORDS = 6


class Backplane:
    """One etcd and one NATS for the test's brokers, which start and stop in process (by broker id)."""

    def __init__(self, root: Path, etcd: EmbeddedEtcd, nats: EmbeddedNats) -> None:
        self.root = root
        self.etcd = etcd
        self.nats = nats
        self.brokers: dict[str, Broker] = {}

    async def start(self, broker_id: str) -> Broker:
        config = BrokerConfig(
            id=broker_id,
            data_dir=self.root / broker_id,
            port=0,
            wire_port=0,
            http_port=0,
            nats_servers=(self.nats.url,),
            etcd_endpoints=tuple(self.etcd.endpoints),
            broker_lease_ttl_ms=2000,
            replica_lag_time_max_ms=3000,
            leader_balance_interval_ms=3_600_000,  # no preferred-leader moves in the middle of the story
        )
        broker = Broker(config)
        await broker.start()
        self.brokers[broker_id] = broker
        return broker

    async def stop(self, broker_id: str) -> None:
        await self.brokers.pop(broker_id).stop()

    def wire(self, broker_id: str) -> str:
        wire = self.brokers[broker_id].wire
        assert wire is not None
        return f"127.0.0.1:{wire.port}"

    def leader(self, partition: int) -> str:
        """The wire address of the partition's leader, as the first running broker's metadata says."""
        mirror = next(iter(self.brokers.values())).mirror
        assert mirror is not None
        record = mirror.snapshot.partition(STREAM, partition)
        assert record is not None and record.leader in self.brokers
        return self.wire(record.leader)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backplane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Backplane]:
    root = tmp_path_factory.mktemp("safety")
    async with EmbeddedEtcd(root / "etcd") as etcd, EmbeddedNats(root / "nats") as nats:
        plane = Backplane(root, etcd, nats)
        try:
            yield plane
        finally:
            for broker_id in list(plane.brokers):
                await plane.stop(broker_id)


def batch(value: bytes) -> bytes:
    return build_batch([NewRecord(value=value)], timestamp=time.time_ns())


async def produce(address: str, partition: int, value: bytes) -> int:
    host, port = address.rsplit(":", 1)
    connection = await Connection.open(host, int(port))
    try:
        response = await connection.request(ProduceRequest(STREAM, partition, Acks.ALL), batch(value), timeout=BOUND)
    finally:
        await connection.close()
    assert isinstance(response.header, ProduceResponse)
    return response.header.base_offset


async def read(address: str, partition: int) -> list[bytes]:
    host, port = address.rsplit(":", 1)
    connection = await Connection.open(host, int(port))
    try:
        response = await connection.request(FetchRequest(STREAM, partition, 0, max_wait_ms=0), timeout=BOUND)
    finally:
        await connection.close()
    assert isinstance(response.header, FetchResponse) and response.header.error is None
    payload = response.payload
    return [r.value or b"" for p, h in iter_batches(payload) for r in decode_records(payload[p : p + h.size])]


def lose_the_tail(partition_dir: Path) -> None:
    """What a damaged disk leaves: the segment cut mid-way, no index, no clean-shutdown marker."""
    (partition_dir / MARKER_FILE).unlink(missing_ok=True)
    for index in [*partition_dir.glob("*.index"), *partition_dir.glob("*.timeindex")]:
        index.unlink()
    (segment,) = partition_dir.glob("*.log")
    with segment.open("r+b") as file:
        file.truncate(segment.stat().st_size // 2)


async def tidelog(*args: str, answer: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run one ``tidelog`` command off the event loop, as a user types it (and answers its question)."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TIDELOG), *args],
            input=answer,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(COLUMNS="200"),
        )

    return await asyncio.to_thread(run)


async def test_a_leader_that_lost_committed_records_suspends_until_reset_head(backplane: Backplane) -> None:
    b0, b1 = await backplane.start("b0"), await backplane.start("b1")
    async with Admin(backplane.wire("b0")) as admin:
        await admin.create_stream(STREAM, partitions=2, replication_factor=2)
    assert b0.mirror is not None and b1.mirror is not None
    await b0.mirror.wait_for(lambda s: all(len(p.isr) == 2 for p in s.partitions_of(STREAM)), BOUND)
    for partition in (0, 1):
        for i in range(RECORDS):
            assert await produce(backplane.leader(partition), partition, b"p%d-%d" % (partition, i)) == i

    # The follower of both partitions stops first (and leaves their ISRs); the other then leads both alone.
    snapshot = b0.mirror.snapshot
    leader_ids = {p.leader for p in snapshot.partitions_of(STREAM)}
    assert leader_ids == {"b0", "b1"}  # one partition each, as placed
    await backplane.stop("b0")
    await b1.mirror.wait_for(lambda s: all(p.leader == "b1" for p in s.partitions_of(STREAM)), BOUND)
    await backplane.stop("b1")

    dirs = sorted((backplane.root / "b1" / "streams").glob(f"{STREAM}@*/*"))
    assert len(dirs) == 2
    for partition_dir in dirs:
        assert HighWatermarkCheckpoint(partition_dir / HW_CHECKPOINT_FILE).read(0) == RECORDS
        lose_the_tail(partition_dir)

    b1 = await backplane.start("b1")  # the only ISR member: elected again, and finds its log short
    assert b1.mirror is not None and b1.manager is not None
    await b1.mirror.wait_for(lambda s: all(p.suspended for p in s.partitions_of(STREAM)), BOUND)
    kept = {}
    for partition in (0, 1):
        led = b1.manager.local(STREAM, partition)
        assert led is not None
        kept[partition] = led.log_end
        assert 0 < led.log_end < RECORDS
        assert f"below its checkpointed high watermark {RECORDS}" in led.record.suspended

    b0 = await backplane.start("b0")  # follows b1 again, and keeps its full copy
    assert b0.manager is not None
    for partition in (0, 1):
        follower = b0.manager.follower(STREAM, partition)
        assert follower is not None and follower.fetcher is not None
        await asyncio.wait_for(follower.fetcher.wait_for_state(FetcherState.BACKING_OFF), BOUND)
        assert "suspended" in (follower.fetcher.status().last_error or "")
        assert follower.log.end_offset == RECORDS  # not cut to the leader's end

    # Appends are refused; reads of what is committed go on.
    with pytest.raises(PartitionSuspendedError, match=f"reset-head {STREAM} 0"):
        await produce(backplane.wire("b1"), 0, b"refused")
    assert await read(backplane.wire("b1"), 0) == [b"p0-%d" % i for i in range(kept[0])]
    async with Admin(backplane.wire("b0")) as admin:
        described = await admin.describe_stream(STREAM)
    assert all("checkpointed high watermark" in p.suspended for p in described.partitions)
    status = await tidelog("cluster", "status", "--etcd-endpoints", backplane.etcd.endpoints[0])
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines() if line.split()[:1] == [STREAM]]
    assert len(rows) == 2 and all(row[-1] == "suspended" for row in rows), status.stdout
    assert f"{STREAM}/0 suspended (appends refused): leader b1" in status.stdout
    shown = await tidelog("stream", "describe", STREAM, "--brokers", backplane.wire("b0"))
    assert shown.returncode == 0 and "partition 1 suspended" in shown.stdout, shown.stdout
    assert f"tidelog partition reset-head {STREAM} 1" in shown.stdout

    # reset-head through the client, asking the broker that is not the controller (forwarded).
    async with Admin(backplane.wire("b0")) as admin:
        with pytest.raises(UnknownStreamError):
            await admin.reset_head("nope", 0)
        with pytest.raises(UnknownPartitionError):
            await admin.reset_head(STREAM, 2)
        with pytest.raises(InvalidArgumentError, match="below the high watermark"):
            await admin.reset_head(STREAM, 0, offset=kept[0] - 1)
        confirmed = await admin.reset_head(STREAM, 0)
    assert (confirmed.leader, confirmed.head, confirmed.log_end) == ("b1", kept[0], kept[0])
    assert "checkpointed high watermark" in confirmed.cleared
    assert await produce(backplane.wire("b1"), 0, b"resumed") == kept[0]
    follower = b0.manager.follower(STREAM, 0)
    assert follower is not None
    await until(lambda: follower.log.end_offset == kept[0] + 1, "the follower to cut its log and copy the leader's")
    assert follower.log.read(0, 1 << 20) == b1.manager.local(STREAM, 0).log.read(0, 1 << 20)  # type: ignore[union-attr]
    # Cut below what it knew committed, on the operator's word: that is no evidence once it leads.
    await b1.mirror.wait_for(lambda s: "b0" in s.partition(STREAM, 0).isr, BOUND)  # type: ignore[union-attr]

    # reset-head through the command line: a head beyond the log end is refused, then the log end is confirmed.
    beyond = await tidelog(
        "partition", "reset-head", STREAM, "1", "--offset", "99", "--yes", "-b", backplane.wire("b0")
    )
    assert beyond.returncode == 1 and "records cannot be invented" in beyond.stderr, beyond.stderr
    asked = await tidelog("partition", "reset-head", STREAM, "1", "--brokers", backplane.wire("b0"), answer="n\n")
    assert asked.returncode == 1 and "Aborted" in asked.stderr, asked.stderr
    assert "safety/1 is suspended" in asked.stdout and f"Confirm offset {kept[1]} as the head of" in asked.stdout
    with pytest.raises(PartitionSuspendedError):
        await produce(backplane.wire("b1"), 1, b"still refused")
    done = await tidelog("partition", "reset-head", STREAM, "1", "--yes", "--brokers", backplane.wire("b0"))
    assert done.returncode == 0, done.stderr
    assert f"takes appends again from offset {kept[1]}" in done.stdout
    assert await produce(backplane.wire("b1"), 1, b"resumed") == kept[1]
    again = await tidelog("partition", "reset-head", STREAM, "1", "--yes", "--brokers", backplane.wire("b1"))
    assert again.returncode == 1 and "not suspended" in again.stderr, again.stderr

    # The follower cut by the confirmed head takes over cleanly when the leader hands off and stops.
    await backplane.stop("b1")
    await b0.mirror.wait_for(lambda s: s.partition(STREAM, 0).leader == "b0", BOUND)  # type: ignore[union-attr]
    assert await produce(backplane.wire("b0"), 0, b"after the hand-off") == kept[0] + 1
