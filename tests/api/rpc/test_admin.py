"""The gRPC ``tidelog.v1.Admin`` against a real broker (TLS, client certificates, ACLs on), written as a client in
another language would use it: a stub from the generated module and messages built by hand. Each RPC does what
its wire op does, and each is refused with a clear status: an unknown stream, a setting that cannot change, a
plan naming a broker that is not live, a partition not being reassigned, and a caller the ACLs do not allow.

One broker cannot move a replica anywhere: the moves themselves (a partition reassigned, re-targeted, a broker
decommissioned) are tested on three broker processes in tests/broker/test_reassign_cluster.py, through the same
:class:`~tidelog.broker.partition_moves.PartitionMoves` these RPCs call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.api.access_samples import GRPC_SAMPLES
from tests.broker.conftest import broker_config
from tests.broker.helpers import bounded, create_stream, expect_code
from tidelog.local.serve_process import grpc_credentials
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol._gen.tidelog.v1 import admin_pb2 as pb
from tidelog.protocol._gen.tidelog.v1 import admin_pb2_grpc
from tidelog.protocol.tls import TlsFiles
from tidelog.server import Broker

pytestmark = pytest.mark.asyncio(loop_scope="module")

INVALID = grpc.StatusCode.INVALID_ARGUMENT
ADMIN_METHODS = sorted(m for m in GRPC_SAMPLES if m.startswith("/tidelog.v1.Admin/"))


@dataclass
class Setup:
    broker: Broker
    admin: admin_pb2_grpc.AdminStub  # a super user
    mallory: admin_pb2_grpc.AdminStub  # allowed nothing
    api: api_pb2_grpc.APIStub  # the super user's Liftbridge API, to create streams
    channels: dict[str, grpc.aio.Channel]

    @property
    def me(self) -> str:
        return self.broker.id


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("grpc-admin")
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    files: dict[str, TlsFiles] = {}
    for name, leaf in (
        ("broker", ca.issue_cert("127.0.0.1", "localhost", common_name="broker")),
        ("admin", ca.issue_cert("admin@example.org", common_name="admin")),
        ("mallory", ca.issue_cert("mallory@example.org", common_name="mallory")),
    ):
        cert, key = directory / f"{name}.pem", directory / f"{name}.key"
        cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
        key.write_bytes(leaf.private_key_pem.bytes())
        files[name] = TlsFiles(ca=ca_file, cert=cert, key=key)
    broker = Broker(
        broker_config(
            directory / "data",
            tls_cert=files["broker"].cert,
            tls_key=files["broker"].key,
            tls_client_ca=ca_file,
            tls_ca=ca_file,
            tls_client_auth="required",  # ACLs on
            super_users=("admin",),
        )
    )
    await broker.start()
    channels: dict[str, grpc.aio.Channel] = {}
    try:
        assert broker.grpc is not None and broker.authorizer is not None
        for who in ("admin", "mallory"):
            channels[who] = grpc.aio.secure_channel(f"127.0.0.1:{broker.grpc.port}", grpc_credentials(files[who]))
            await bounded(channels[who].channel_ready())
        yield Setup(
            broker,
            admin_pb2_grpc.AdminStub(channels["admin"]),
            admin_pb2_grpc.AdminStub(channels["mallory"]),
            api_pb2_grpc.APIStub(channels["admin"]),
            channels,
        )
    finally:
        for channel in channels.values():
            await channel.close()
        await broker.stop()


async def call(method: Any, request: Any) -> Any:
    return await bounded(method(request, timeout=10))


def plan(stream: str, *replicas: str, partition: int = 0) -> list[pb.PartitionReplicas]:
    return [pb.PartitionReplicas(stream=stream, partition=partition, replicas=replicas)]


# ---- streams ----


async def test_add_partitions_grows_a_stream_and_refuses_shrinking_or_an_unknown_stream(setup: Setup) -> None:
    await create_stream(setup.api, "grown", partitions=1)
    answer = await call(setup.admin.AddPartitions, pb.AddPartitionsRequest(stream="grown", partitions=3))
    assert (answer.before, answer.after) == (1, 3)
    assert setup.broker.mirror.snapshot.stream("grown").partitions == 3  # type: ignore[union-attr]
    again = await call(setup.admin.AddPartitions, pb.AddPartitionsRequest(stream="grown", partitions=3))
    assert (again.before, again.after) == (3, 3)

    shrink = setup.admin.AddPartitions(pb.AddPartitionsRequest(stream="grown", partitions=2), timeout=10)
    assert "cannot shrink to 2" in await expect_code(INVALID, shrink)
    absent = setup.admin.AddPartitions(pb.AddPartitionsRequest(stream="absent", partitions=2), timeout=10)
    assert "no stream named 'absent'" in await expect_code(grpc.StatusCode.NOT_FOUND, absent)


async def test_alter_stream_changes_live_settings_and_refuses_the_others_by_name(setup: Setup) -> None:
    await create_stream(setup.api, "altered")
    settings = {"retention_max_age_ms": "60000", "minIsr": "1"}
    answer = await call(setup.admin.AlterStream, pb.AlterStreamRequest(stream="altered", settings=settings))
    assert sorted((c.name, c.before, c.after) for c in answer.changes) == [
        ("min_isr", "", "1"),
        ("retention_max_age_ms", "", "60000"),
    ]
    config = setup.broker.mirror.snapshot.stream("altered").config  # type: ignore[union-attr]
    assert (config.retention_max_age_ms, config.min_isr) == (60000, 1)
    back = await call(
        setup.admin.AlterStream, pb.AlterStreamRequest(stream="altered", settings={"retention_max_age_ms": "default"})
    )
    assert [(c.name, c.before, c.after) for c in back.changes] == [("retention_max_age_ms", "60000", "")]

    fixed = setup.admin.AlterStream(
        pb.AlterStreamRequest(stream="altered", settings={"flush_policy": "always"}), timeout=10
    )
    assert "flush_policy cannot change at run time" in await expect_code(INVALID, fixed)
    unknown = setup.admin.AlterStream(pb.AlterStreamRequest(stream="altered", settings={"colour": "red"}), timeout=10)
    assert "unknown stream setting 'colour'" in await expect_code(INVALID, unknown)
    absent = setup.admin.AlterStream(
        pb.AlterStreamRequest(stream="absent", settings={"retention_max_age_ms": "1"}), timeout=10
    )
    await expect_code(grpc.StatusCode.NOT_FOUND, absent)


# ---- reassignment ----


async def test_generate_proposes_nothing_to_move_and_refuses_a_broker_that_is_not_live(setup: Setup) -> None:
    await create_stream(setup.api, "planned", partitions=2)
    request = pb.GenerateReassignmentRequest(brokers=[setup.me], streams=["planned"])
    assert list((await call(setup.admin.GenerateReassignment, request)).moves) == []  # all on it already

    gone = setup.admin.GenerateReassignment(pb.GenerateReassignmentRequest(brokers=["gone"]), timeout=10)
    assert "gone is not a live broker" in await expect_code(INVALID, gone)
    absent = setup.admin.GenerateReassignment(
        pb.GenerateReassignmentRequest(brokers=[setup.me], streams=["absent"]), timeout=10
    )
    await expect_code(grpc.StatusCode.NOT_FOUND, absent)


async def test_execute_and_verify_a_plan_and_refuse_one_naming_a_dead_broker(setup: Setup) -> None:
    await create_stream(setup.api, "executed")
    request = pb.ExecuteReassignmentRequest(partitions=plan("executed", setup.me), throttle_bps=1_000_000)
    (move,) = (await call(setup.admin.ExecuteReassignment, request)).moves
    assert (move.stream, list(move.current), list(move.proposed), move.note) == ("executed", [setup.me], [setup.me], "")
    verified = await call(
        setup.admin.VerifyReassignment, pb.VerifyReassignmentRequest(partitions=plan("executed", setup.me))
    )
    assert [(s.partition, s.state, list(s.replicas), s.leader) for s in verified.statuses] == [
        (0, "complete", [setup.me], setup.me)
    ]

    dead = setup.admin.ExecuteReassignment(
        pb.ExecuteReassignmentRequest(partitions=plan("executed", setup.me, "gone")), timeout=10
    )
    assert "executed/0: gone is not a live broker" in await expect_code(INVALID, dead)
    negative = setup.admin.ExecuteReassignment(
        pb.ExecuteReassignmentRequest(partitions=plan("executed", setup.me), throttle_bps=-1), timeout=10
    )
    assert "throttle_bps must be 0" in await expect_code(INVALID, negative)
    empty = setup.admin.ExecuteReassignment(pb.ExecuteReassignmentRequest(), timeout=10)
    assert "names no partition" in await expect_code(INVALID, empty)
    assert setup.broker.mirror.snapshot.partition("executed", 0).replicas == (setup.me,)  # type: ignore[union-attr]


async def test_verify_says_what_a_plan_is_not_and_lists_nothing_under_way(setup: Setup) -> None:
    await create_stream(setup.api, "verified")
    other = await call(
        setup.admin.VerifyReassignment, pb.VerifyReassignmentRequest(partitions=plan("verified", "elsewhere"))
    )
    assert [(s.state, s.detail) for s in other.statuses] == [("other", f"replicas {setup.me}, not being reassigned")]
    absent = await call(setup.admin.VerifyReassignment, pb.VerifyReassignmentRequest(partitions=plan("absent", "x")))
    assert [(s.state, s.detail) for s in absent.statuses] == [("other", "no such partition")]
    assert list((await call(setup.admin.VerifyReassignment, pb.VerifyReassignmentRequest())).statuses) == []


async def test_cancel_refuses_a_partition_not_being_reassigned(setup: Setup) -> None:
    await create_stream(setup.api, "cancelled")
    ref = [pb.PartitionRef(stream="cancelled", partition=0)]
    refused = setup.admin.CancelReassignment(pb.CancelReassignmentRequest(partitions=ref), timeout=10)
    assert "cancelled/0 is not being reassigned" in await expect_code(INVALID, refused)
    negative = [pb.PartitionRef(stream="cancelled", partition=-1)]
    bad = setup.admin.CancelReassignment(pb.CancelReassignmentRequest(partitions=negative), timeout=10)
    assert "a partition id is a number from 0" in await expect_code(INVALID, bad)


# ---- brokers and leaders ----


async def test_decommission_reports_what_cannot_move_and_its_progress(setup: Setup) -> None:
    await create_stream(setup.api, "stuck")
    moves = (await call(setup.admin.DecommissionBroker, pb.DecommissionBrokerRequest(broker_id=setup.me))).moves
    stuck = [m for m in moves if m.stream == "stuck"]
    assert [m.note for m in stuck] == [f"no other broker can take its replica on {setup.me}"]  # the only broker
    progress = await call(setup.admin.DecommissionProgress, pb.DecommissionProgressRequest(broker_id=setup.me))
    assert progress.replicas_left >= 1
    assert {s.state for s in progress.statuses if s.stream == "stuck"} == {"waiting"}
    assert setup.broker.mirror.snapshot.partition("stuck", 0).replicas == (setup.me,)  # type: ignore[union-attr]

    absent = setup.admin.DecommissionBroker(pb.DecommissionBrokerRequest(broker_id="gone"), timeout=10)
    assert "no broker 'gone' is live or holds replicas" in await expect_code(INVALID, absent)
    nameless = setup.admin.DecommissionProgress(pb.DecommissionProgressRequest(), timeout=10)
    assert "needs the broker_id" in await expect_code(INVALID, nameless)


async def test_elect_preferred_leaders_moves_none_on_a_balanced_cluster(setup: Setup) -> None:
    answer = await call(setup.admin.ElectPreferredLeaders, pb.ElectPreferredLeadersRequest())
    assert (answer.moved, answer.not_preferred) == (0, 0)
    refused = setup.mallory.ElectPreferredLeaders(pb.ElectPreferredLeadersRequest(), timeout=10)
    assert "principal mallory may not alter cluster" in await expect_code(grpc.StatusCode.PERMISSION_DENIED, refused)


# ---- the service ----


@pytest.mark.parametrize("method", ADMIN_METHODS, ids=lambda m: m.rsplit("/", 1)[-1])
async def test_a_caller_the_acls_do_not_allow_is_refused(setup: Setup, method: str) -> None:
    name = method.rsplit("/", 1)[-1]
    refused = getattr(setup.mallory, name)(GRPC_SAMPLES[method], timeout=10)
    assert "principal mallory may not" in await expect_code(grpc.StatusCode.PERMISSION_DENIED, refused)


async def test_the_health_service_names_the_admin_service(setup: Setup) -> None:
    health = health_pb2_grpc.HealthStub(setup.channels["admin"])
    answer = await call(health.Check, health_pb2.HealthCheckRequest(service="tidelog.v1.Admin"))
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
