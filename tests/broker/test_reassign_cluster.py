"""Moving replicas on a cluster of three broker processes: a partition reassigned (throttled) to another broker
catches up there, the new broker leads it with every record and the old one deletes its copy; one moving too
slowly is re-targeted to a third broker (through ``tidelog.v1.Admin``) and completes there. Two run the CLI as a
user types it (in process, on a thread of its own, as tests/cli do): a generated plan executed and verified, and
a decommission that waits until the broker is safe to stop. The last kills a broker: its replicas are re-placed
on the others (that it deletes them when it comes back is tests/broker/test_manager_reassigned.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from click.testing import CliRunner, Result

from tests.helpers import LONG_BOUND
from tidelog.cli.main import cli
from tidelog.client import Admin, Producer
from tidelog.local.cluster import LocalCluster
from tidelog.protocol._gen.tidelog.v1 import admin_pb2, admin_pb2_grpc
from tidelog.protocol.reassign_messages import PartitionReplicas

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {
    "shutdown_timeout_ms": "5000",  # the cluster's teardown stops every broker at once: none can take over
    "broker_lease_ttl_ms": "2000",
    "leader_balance_interval_ms": "3600000",
    "replica_replacement_delay_ms": "1000",  # the last test kills a broker; none is gone before it
}
RECORDS = 200
BIG_RECORDS = 2200  # of about 1 kB: two fetches' worth


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(Path(tmp_path_factory.mktemp("reassign")), 3, settings=SETTINGS) as running:
        yield running


async def test_a_reassigned_partition_moves_with_its_records(cluster: LocalCluster) -> None:
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("moving", partitions=1, replication_factor=1)
        (before,) = (await admin.describe_stream("moving")).partitions
    async with Producer(cluster.bootstrap()) as producer:
        for i in range(RECORDS):
            await producer.send("moving", b"x" * 100 + str(i).encode())
        await producer.flush()
    old = before.replicas[0]
    new = next(b.id for b in cluster.brokers if b.id != old)
    plan = (PartitionReplicas("moving", 0, (new,)),)
    async with Admin(cluster.bootstrap()) as admin:
        answer = await admin.reassign_partitions(plan, throttle_bps=10_000_000)
        assert [(m.current, m.proposed) for m in answer.moves] == [((old,), (new,))]

        async def complete() -> bool:
            return all(s.state == "complete" for s in (await admin.list_reassignments(plan)).statuses)

        await cluster.wait_until(complete, LONG_BOUND, "the reassignment to complete")
        (after,) = (await admin.describe_stream("moving")).partitions
    assert (after.leader, after.replicas, after.isr) == (new, (new,), (new,))
    assert after.high_watermark == RECORDS

    async def old_copy_deleted() -> bool:
        return not list(cluster.broker(old).data_dir.glob("streams/moving@*/0"))

    await cluster.wait_until(old_copy_deleted, LONG_BOUND, f"{old} to delete its copy")


async def test_a_slow_target_is_replaced_by_a_new_plan_over_grpc(cluster: LocalCluster) -> None:
    """Through ``tidelog.v1.Admin``: a partition moving to a broker throttled to a crawl is re-targeted to another
    broker, completes there, and both the old replica and the one dropped delete their copy."""
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("retargeted", partitions=1, replication_factor=1)
        (before,) = (await admin.describe_stream("retargeted")).partitions
    async with Producer(cluster.bootstrap()) as producer:
        for i in range(BIG_RECORDS):  # above one fetch: the throttled target cannot catch up at once
            await producer.send("retargeted", b"x" * 1000 + str(i).encode())
        await producer.flush()
    old = before.replicas[0]
    slow, fast = (b.id for b in cluster.brokers if b.id != old)
    async with grpc.aio.insecure_channel(cluster.broker(old).grpc_address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)

        def plan(target: str) -> list[admin_pb2.PartitionReplicas]:
            return [admin_pb2.PartitionReplicas(stream="retargeted", partition=0, replicas=[target])]

        crawl = admin_pb2.ExecuteReassignmentRequest(partitions=plan(slow), throttle_bps=1000)
        await stub.ExecuteReassignment(crawl, timeout=LONG_BOUND)
        (move,) = (
            await stub.ExecuteReassignment(
                admin_pb2.ExecuteReassignmentRequest(partitions=plan(fast)), timeout=LONG_BOUND
            )
        ).moves
        assert (list(move.current), list(move.proposed)) == ([old], [fast])  # current: the plan that moves back

        async def complete() -> bool:
            verify = admin_pb2.VerifyReassignmentRequest(partitions=plan(fast))
            statuses = (await stub.VerifyReassignment(verify, timeout=LONG_BOUND)).statuses
            return all(s.state == "complete" for s in statuses)

        await cluster.wait_until(complete, LONG_BOUND, "the re-targeted reassignment to complete")
    async with Admin(cluster.bootstrap()) as admin:
        (after,) = (await admin.describe_stream("retargeted")).partitions
    assert (after.leader, after.replicas, after.isr, after.high_watermark) == (fast, (fast,), (fast,), BIG_RECORDS)

    async def copies_deleted() -> bool:
        return not any(list(cluster.broker(b).data_dir.glob("streams/retargeted@*/0")) for b in (old, slow))

    await cluster.wait_until(copies_deleted, LONG_BOUND, f"{old} and {slow} to delete their copies")


async def tidelog(cluster: LocalCluster, *args: str) -> Result:
    env = {"TIDELOG_BROKERS": ",".join(cluster.bootstrap()), "COLUMNS": "200"}

    def run() -> Result:
        return CliRunner().invoke(cli, list(args), env=env)

    return await asyncio.wait_for(asyncio.to_thread(run), LONG_BOUND)


async def test_a_generated_plan_executed_and_verified_from_the_cli(cluster: LocalCluster, tmp_path: Path) -> None:
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("planned", partitions=3, replication_factor=1)
    keep = [b.id for b in cluster.brokers][:2]
    generated = await tidelog(
        cluster,
        "partition",
        "reassign",
        "--generate",
        "--to-brokers",
        ",".join(keep),
        "--stream",
        "planned",
        "-o",
        "json",
    )
    assert generated.exit_code == 0, generated.output
    proposed = json.loads(generated.stdout)["proposed"]
    assert all(set(p["replicas"]) <= set(keep) for p in proposed["partitions"])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(proposed))
    executed = await tidelog(cluster, "partition", "reassign", "--execute", str(plan), "--throttle", "10000000")
    assert executed.exit_code == 0, executed.output
    assert set(json.loads(executed.stdout)) == {"current", "proposed"}
    verified = await tidelog(
        cluster, "partition", "reassign", "--verify", str(plan), "--wait", "--timeout", "60", "-o", "json"
    )
    assert verified.exit_code == 0, verified.output
    assert {p["state"] for p in json.loads(verified.stdout)["partitions"]} == {"complete"}


async def test_decommission_leaves_the_broker_without_replicas(cluster: LocalCluster) -> None:
    controller = await cluster.controller_id()
    leaving = next(b.id for b in cluster.brokers if b.id != controller)
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("spread", partitions=3, replication_factor=2)
    result = await tidelog(cluster, "broker", "decommission", leaving, "--timeout", "60", "-o", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["safe_to_stop"] is True and document["replicas_left"] == 0
    async with Admin(cluster.bootstrap()) as admin:
        parts = (await admin.describe_stream("spread")).partitions
    assert all(leaving not in p.replicas and len(p.replicas) == 2 for p in parts)


async def test_a_broker_gone_past_the_delay_is_replaced(cluster: LocalCluster) -> None:
    controller = await cluster.controller_id()
    async with Admin(cluster.bootstrap()) as admin:
        await admin.create_stream("healing", partitions=1, replication_factor=2)
        (before,) = (await admin.describe_stream("healing")).partitions
    gone = next((b for b in before.replicas if b != controller), before.replicas[0])
    await cluster.kill(gone)

    async def replaced() -> bool:
        async with Admin([b.wire_address for b in cluster.brokers if b.id != gone]) as admin:
            (p,) = (await admin.describe_stream("healing")).partitions
        return gone not in p.replicas and len(p.replicas) == 2 and len(p.isr) == 2

    await cluster.wait_until(replaced, LONG_BOUND, f"{gone}'s replica to be re-placed")
