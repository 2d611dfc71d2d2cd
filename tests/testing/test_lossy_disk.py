"""One broker on a lossy disk (FUSE): nothing acknowledged is lost to a power cut; a full disk refuses writes
and recovers; after a failed fsync the broker acknowledges nothing more, even once the disk would let a retried
fsync "succeed", until it restarts. The long versions are nemesis faults (power-loss-one, power-loss-all,
eio-fsync-one, eio-write-one, enospc-one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.testing.history import History
from tidelog.testing.lossy_disk import LossyDisk
from tidelog.testing.workload import produce_direct, read_all, tally

pytestmark = pytest.mark.slow

S = "lossy"
TIMEOUT = 10.0


async def test_power_cuts_full_disks_and_failed_fsyncs_lose_nothing_acknowledged(tmp_path: Path) -> None:
    # No preallocation: every append grows its segment, so a full disk refuses it.
    cluster = LocalCluster(tmp_path, 1, settings={"segment_preallocate_bytes": "0", "shutdown_timeout_ms": "2000"})
    broker = cluster.brokers[0]
    history = History()

    async def produce(name: str, count: int) -> dict[str, int]:
        outcomes = await produce_direct(
            broker.wire_address, S, 0, history, name=name, count=count, timeout=TIMEOUT, ack_timeout_ms=3000
        )
        return tally(outcomes)

    async with LossyDisk(tmp_path / "disk", broker.data_dir) as disk, cluster:
        async with Admin(cluster.bootstrap()) as admin:
            await admin.create_stream(S, partitions=1, replication_factor=1)
        assert await produce("a", 10) == {"acked": 10}

        await disk.fail("enospc")
        assert "acked" not in await produce("full", 2)
        await disk.heal()
        assert await produce("b", 3) == {"acked": 3}  # space freed: writes resume without a restart

        await disk.fail("eio-fsync")
        assert "acked" not in await produce("eio", 2)
        await disk.heal()
        assert "acked" not in await produce("after", 2)  # the log stays failed: no retried fsync is trusted
        assert (await disk.status())["eio-fsync"] >= 1

        await cluster.kill(broker.id)  # the power goes
        await disk.power_loss()
        await cluster.restart(broker.id)
        assert await produce("c", 3) == {"acked": 3}
        final = await read_all(cluster.bootstrap, S, 30.0)
    history.final_read(S, 0, final[0])
    report = history.check()
    assert report.ok, str(report)
    acked = [value for _, value in history.acknowledged(S, 0)]
    assert len(acked) == 16 and all(value.split(b"-")[0] in (b"a", b"b", b"c") for value in acked)
