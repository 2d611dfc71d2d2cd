"""Three brokers on lossy disks (FUSE): the leader whose fsyncs, then whose writes, fail with EIO steps down, the
partition takes acknowledged writes again on another in-sync replica without an operator, and the failed replica
recovers its log and rejoins the ISR once its disk heals, without a restart. Nothing acknowledged is lost."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from tidelog.client import Admin
from tidelog.local.cluster import LocalCluster
from tidelog.testing.fault_run import SETTINGS
from tidelog.testing.history import History
from tidelog.testing.lossy_disk import LossyDisk
from tidelog.testing.workload import produce_direct, read_all, tally

from ..helpers import LONG_BOUND

pytestmark = pytest.mark.slow

S = "stepdown"


async def test_a_leader_whose_disk_fails_steps_down_and_recovers_without_a_restart(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3, settings=SETTINGS)
    disks = {b.id: LossyDisk(tmp_path / b.id / "disk", b.data_dir, name=f"lossy-fs {b.id}") for b in cluster.brokers}
    history = History()

    async def record() -> tuple[str, tuple[str, ...]]:
        found = await cluster.partition_record(S, 0)
        assert found is not None
        return found.leader, found.isr

    async def produce(leader: str, name: str, count: int) -> dict[str, int]:
        address = cluster.broker(leader).direct_wire_address
        outcomes = await produce_direct(address, S, 0, history, name=name, count=count, timeout=10.0)
        return tally(outcomes)

    async def acked(name: str, count: int) -> None:
        """``count`` acknowledged writes to whoever leads, retrying refusals (a leadership settling) for a bound."""
        deadline, attempt, done = time.monotonic() + LONG_BOUND, 0, 0
        while done < count:
            assert time.monotonic() < deadline, f"only {done} of {count} writes acknowledged: {await record()}"
            leader, _ = await record()
            if leader:
                done += (await produce(leader, f"{name}.{attempt}", count - done)).get("acked", 0)
            attempt += 1

    async with contextlib.AsyncExitStack() as stack:
        for disk in disks.values():
            await stack.enter_async_context(disk)
        await stack.enter_async_context(cluster)
        deadline = time.monotonic() + LONG_BOUND
        while True:  # the controller may not have read every registration yet (see FaultRun._create_stream)
            try:
                async with Admin(cluster.bootstrap()) as admin:
                    await admin.create_stream(S, partitions=1, replication_factor=3)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise

        async def isr_full() -> bool:
            leader, isr = await record()
            return bool(leader) and len(isr) == 3

        await cluster.wait_until(isr_full, LONG_BOUND, "a full ISR")
        await acked("before", 5)

        for kind in ("eio-fsync", "eio-write"):
            victim, _ = await record()
            pid = cluster.broker(victim).pid
            await disks[victim].fail(kind)
            assert "acked" not in await produce(victim, f"{kind}-refused", 2)  # nothing it could not store

            async def moved_on(victim: str = victim) -> bool:  # it may be back in the ISR already, as a follower
                leader, _ = await record()  # whose recovered log holds everything committed (nothing new came)
                return bool(leader) and leader != victim

            await cluster.wait_until(moved_on, LONG_BOUND, f"leadership to leave {victim} after {kind}")
            await acked(f"{kind}-after", 5)  # no operator, no restart
            await disks[victim].heal()

            async def rejoined(victim: str = victim) -> bool:
                _, isr = await record()
                return victim in isr

            await cluster.wait_until(rejoined, LONG_BOUND, f"{victim} to recover its log and rejoin the ISR")
            assert cluster.broker(victim).pid == pid  # recovered in place

        await acked("end", 3)
        final = await read_all(cluster.bootstrap, S, LONG_BOUND)
    history.final_read(S, 0, final[0])
    report = history.check()
    assert report.ok, str(report)
    assert len(history.acknowledged(S, 0)) == 5 + 5 + 5 + 3
