"""LocalCluster with real processes: three brokers start and register; kill, restart, pause, resume and stop act
on the right PIDs; stopping leaves nothing running.

One cluster serves the whole module (starting one costs a few seconds); the stop test runs last and checks that
every process the cluster started is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.helpers import LONG_BOUND
from tidelog.launch.process import pid_alive, wait_pid_exit
from tidelog.local.cluster import LocalCluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {"broker_lease_ttl_ms": "2000"}  # a killed broker's key lapses within seconds


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    started = LocalCluster(tmp_path_factory.mktemp("cluster"), 3, settings=SETTINGS)
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


async def test_every_broker_serves_and_is_registered(cluster: LocalCluster) -> None:
    assert [b.id for b in cluster.brokers] == ["b0", "b1", "b2"]
    registered = await cluster.registered_brokers()
    assert sorted(registered) == ["b0", "b1", "b2"]
    for handle in cluster.brokers:
        assert handle.running and handle.pid is not None
        assert registered[handle.id].wire_port == handle.wire_port
        assert registered[handle.id].port == handle.port
    assert cluster.bootstrap() == [f"127.0.0.1:{b.wire_port}" for b in cluster.brokers]
    # None until the brokers run controller elections (being built): then one of them.
    assert await cluster.controller_id() in {None, "b0", "b1", "b2"}
    assert await cluster.partition_record("no-such-stream", 0) is None


async def test_kill_then_restart(cluster: LocalCluster) -> None:
    victim = cluster.broker("b1")
    old_pid = victim.pid
    assert old_pid is not None
    await cluster.kill("b1")
    assert not victim.running and not pid_alive(old_pid)
    assert victim.wire_address not in cluster.bootstrap()

    async def deregistered() -> bool:
        return await cluster.broker_record("b1") is None

    await cluster.wait_until(deregistered, LONG_BOUND, "b1's lease to lapse")
    await cluster.restart("b1")
    assert victim.running and victim.pid != old_pid
    record = await cluster.broker_record("b1")
    assert record is not None and record.wire_port == victim.wire_port
    with pytest.raises(RuntimeError, match="still running"):
        await cluster.restart("b1")


async def test_restart_right_after_kill_waits_for_the_new_registration(cluster: LocalCluster) -> None:
    # The killed run's key is still in etcd (its lease has not lapsed): restart must wait for the new one.
    before = await cluster.broker_record("b2")
    assert before is not None
    await cluster.kill("b2")
    await cluster.restart("b2")
    after = await cluster.broker_record("b2")
    assert after is not None and after.started_ns > before.started_ns


async def test_pause_and_resume(cluster: LocalCluster) -> None:
    handle = cluster.broker("b0")
    await cluster.pause("b0")
    assert handle.paused and handle.running
    assert handle.wire_address not in cluster.bootstrap()
    assert _state(handle.pid) == "T"  # stopped
    await cluster.resume("b0")
    assert not handle.paused
    await cluster.wait_until(lambda: _state(handle.pid) != "T", LONG_BOUND, "b0 to run again")


async def test_stop_broker_is_graceful_and_deregisters(cluster: LocalCluster) -> None:
    code = await cluster.stop_broker("b2")
    assert code == 0
    assert await cluster.broker_record("b2") is None  # a graceful stop revokes the lease at once
    await cluster.restart("b2")


async def test_stop_leaves_no_process(cluster: LocalCluster) -> None:
    await cluster.pause("b1")  # a paused broker must still be stopped
    pids = [b.pid for b in cluster.brokers] + [cluster.nats.pid, cluster.etcd.pid]
    assert all(pid is not None for pid in pids)
    await cluster.stop()
    await cluster.stop()  # idempotent
    async with asyncio.timeout(LONG_BOUND):
        for pid in pids:
            assert pid is not None
            await wait_pid_exit(pid)
    assert not any(pid_alive(pid) for pid in pids if pid is not None)
    assert cluster.bootstrap() == []


def _state(pid: int | None) -> str:
    assert pid is not None
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[-1].split()[0]
