"""``tidelog cluster status`` against a running LocalCluster, and ``tidelog dev-cluster`` from start to Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tidelog.client import Admin
from tidelog.launch.ports import free_port
from tidelog.launch.process import pid_alive, wait_pid_exit
from tidelog.local.cluster import LocalCluster
from tidelog.local.serve_process import TIDELOG, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TIMEOUT = 60.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path_factory.mktemp("status"), 2) as started:
        yield started


async def tidelog(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run one ``tidelog`` command off the event loop, with a wide terminal so tables are not cut."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TIDELOG), *args], capture_output=True, text=True, timeout=TIMEOUT, env=clean_env(COLUMNS="200", **env)
        )

    return await asyncio.to_thread(run)


async def test_status_shows_brokers_controller_and_partitions(cluster: LocalCluster) -> None:
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("status-orders", "status.orders", partitions=2, replication_factor=1)
        await admin.describe_stream("status-orders")  # leaders elected and serving

    result = await tidelog("cluster", "status", TIDELOG_ETCD_ENDPOINTS=cluster.etcd_endpoints[0])
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for handle in cluster.brokers:
        row = " ".join(_words(out, handle.id))
        assert handle.grpc_address in row and handle.wire_address in row and "yes" in row
    assert "controller:" in out
    partitions = [line.split() for line in out.splitlines() if "status-orders" in line]
    assert len(partitions) == 2, out
    for cells in partitions:
        assert cells[2] in {"b0", "b1"}  # leader
        assert cells[5:7] == ["0", "0"]  # HW and lag: asked of the leader
    assert "under-replicated" not in out

    as_json = await tidelog("cluster", "status", "-o", "json", TIDELOG_ETCD_ENDPOINTS=cluster.etcd_endpoints[0])
    view = json.loads(as_json.stdout)
    assert {b["id"] for b in view["brokers"] if b["alive"]} == {h.id for h in cluster.brokers}
    assert view["controller"] in {h.id for h in cluster.brokers}
    ours = [p for p in view["partitions"] if p["stream"] == "status-orders"]
    assert [(p["partition"], p["high_watermark"], p["log_end"], p["lag"]) for p in ours] == [(0, 0, 0, 0), (1, 0, 0, 0)]
    assert not any(p["under_replicated"] or p["suspended"] for p in ours)


async def test_status_flag_wins_and_unreachable_etcd_is_one_line() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = await tidelog("cluster", "status", "--etcd-endpoints", dead, TIDELOG_ETCD_ENDPOINTS="http://x:1/bad/")
    assert result.returncode == 1
    assert "cannot read the cluster from etcd" in result.stderr and "Traceback" not in result.stderr


async def test_status_without_endpoints_is_a_usage_error() -> None:
    result = await tidelog("cluster", "status")
    assert result.returncode == 2
    assert "TIDELOG_ETCD_ENDPOINTS" in result.stderr


async def test_dev_cluster_runs_until_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    process = await asyncio.create_subprocess_exec(
        str(TIDELOG),
        "dev-cluster",
        "--brokers",
        "1",
        "--data-dir",
        str(data_dir),
        "--setting",
        "broker_lease_ttl_ms=2000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(COLUMNS="300"),
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while not lines or "Ctrl-C to stop" not in lines[-1]:
                line = await process.stdout.readline()
                assert line, "dev-cluster exited early:\n" + "".join(lines)
                lines.append(line.decode())
        out = "".join(lines)
        pid = int(_words(out, "b0")[3])
        assert pid_alive(pid)
        assert "NATS: nats://127.0.0.1:" in out and "etcd: http://127.0.0.1:" in out
        etcd = re.search(r"etcd: (\S+)", out)
        assert etcd is not None
        status = await tidelog("cluster", "status", "--etcd-endpoints", etcd.group(1))
        assert status.returncode == 0 and "b0" in status.stdout, status.stderr

        os.kill(pid, signal.SIGKILL)  # a broker that dies is reported and reaped, never left a zombie
        async with asyncio.timeout(TIMEOUT):
            while "was killed by SIGKILL" not in lines[-1]:
                line = await process.stdout.readline()
                assert line, "dev-cluster exited early:\n" + "".join(lines)
                lines.append(line.decode())
        assert f"broker b0 (pid {pid}) was killed by SIGKILL" in lines[-1] and "serve.log" in lines[-1]
        assert not await asyncio.to_thread(Path(f"/proc/{pid}").exists)  # reaped
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            rest = await process.stdout.read()
            code = await process.wait()
    assert code == 0, "".join(lines) + rest.decode()
    assert "cluster stopped" in rest.decode()
    async with asyncio.timeout(TIMEOUT):
        await wait_pid_exit(pid)
    log_path = data_dir / "b0" / "serve.log"
    assert f"b0 log: {log_path}" in "".join(lines)
    assert (data_dir / "b0" / "serve.log").exists()  # an explicit data dir is kept


def _words(out: str, first: str) -> list[str]:
    """The words of the table row that starts with ``first`` (tables are drawn without column rules)."""
    for line in out.splitlines():
        if line.split()[:1] == [first]:
            return line.split()
    raise AssertionError(f"no row for {first!r} in:\n{out}")


async def test_dev_cluster_with_a_real_s3_server(tmp_path: Path) -> None:
    """``--tiered-store s3`` starts weed mini beside the cluster; the broker starts only if the store takes its
    credentials (checked at start), and everything stops with the cluster."""
    process = await asyncio.create_subprocess_exec(
        str(TIDELOG),
        "dev-cluster",
        "--brokers",
        "1",
        "--data-dir",
        str(tmp_path / "dev"),
        "--tiered-store",
        "s3",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=clean_env(COLUMNS="300"),
        start_new_session=True,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while not lines or "Ctrl-C to stop" not in lines[-1]:
                line = await process.stdout.readline()
                assert line, "dev-cluster exited early:\n" + "".join(lines)
                lines.append(line.decode())
        out = "".join(lines)
        assert "S3 (weed mini): http://127.0.0.1:" in out
        assert "tiered store" not in (tmp_path / "dev" / "b0" / "serve.log").read_text()  # no refusal, no failure
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(TIMEOUT):
            rest = await process.stdout.read()
            code = await process.wait()
    assert code == 0, "".join(lines) + rest.decode()
    assert "cluster stopped" in rest.decode()
