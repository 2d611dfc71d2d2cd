"""Authorization on a real broker (TLS, client certificates required, so ACLs on by default): every wire op and
every gRPC method, generated from the access tables, is refused to a principal the ACLs do not allow and let
through to one they do; super users, policy changes through etcd, undecodable records, and PublishAsync stopping
at the first refused message.

Principals: ``admin`` (a super user), ``alice`` (allowed exactly what each sample request needs), ``carol``
(allowed ``all`` on every stream, group and the cluster, which still is not a broker), ``mallory`` (nothing), and
the broker's own certificate (a broker principal).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import trustme

from tests.api.access_samples import GRPC_SAMPLES, WIRE_SAMPLES
from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tidelog import telemetry
from tidelog.api.access_table import BROKERS_ONLY, GRPC_ACCESS, OPEN, WIRE_ACCESS
from tidelog.local.serve_process import grpc_credentials
from tidelog.metadata.acl_mirror import AclMirror
from tidelog.metadata.acl_records import (
    CLUSTER_NAME,
    AclEntry,
    Operation,
    Pattern,
    Permission,
    ResourceType,
    acl_prefix,
    add_acl,
    remove_acls,
)
from tidelog.metadata.namespace import namespace_keys
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import PermissionDeniedError, TidelogError, UnknownStreamError
from tidelog.protocol.frames import Op
from tidelog.protocol.messages import Acks, CreateStreamRequest, MetadataRequest, ProduceRequest
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.protocol.tls import TlsFiles, client_context
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

KEYS = namespace_keys()
WAIT = 5.0  # a request's own timeout: a denial answers at once, an allowed request may wait in its handler


@dataclass
class Setup:
    broker: Broker
    directory: Path
    ca: Path
    files: dict[str, TlsFiles]

    def wire_context(self, who: str) -> ssl.SSLContext:
        return client_context(self.files[who])

    async def wire(self, who: str) -> Connection:
        assert self.broker.wire is not None
        return await Connection.open(
            "127.0.0.1", self.broker.wire.port, ssl=self.wire_context(who), connect_timeout=BOUND
        )

    def channel(self, who: str) -> grpc.aio.Channel:
        assert self.broker.grpc is not None
        return grpc.aio.secure_channel(f"127.0.0.1:{self.broker.grpc.port}", grpc_credentials(self.files[who]))


def _write(directory: Path, name: str, leaf: trustme.LeafCert) -> TlsFiles:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return TlsFiles(ca=directory / "ca.pem", cert=cert, key=key)


def alice_entries() -> list[AclEntry]:
    """Exactly what each sample request needs, for alice."""
    needed = set()
    for table, samples in ((WIRE_ACCESS, WIRE_SAMPLES), (GRPC_ACCESS, GRPC_SAMPLES)):
        for key, request in samples.items():
            rule = table[key]
            if callable(rule):
                needed.update(rule(request))
    return [AclEntry("alice", access.resource, access.name, access.operation, Permission.ALLOW) for access in needed]


CAROL = [
    AclEntry("carol", resource, name, Operation.ALL, Permission.ALLOW)
    for resource, name in ((ResourceType.STREAM, "*"), (ResourceType.GROUP, "*"), (ResourceType.CLUSTER, CLUSTER_NAME))
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory = tmp_path_factory.mktemp("authz")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    files = {
        "broker": _write(directory, "broker", ca.issue_cert("127.0.0.1", "localhost", common_name="broker")),
        **{
            who: _write(directory, who, ca.issue_cert(f"{who}@example.org", common_name=who))
            for who in ("admin", "alice", "carol", "mallory")
        },
    }
    broker = Broker(
        broker_config(
            directory / "data",
            tls_cert=files["broker"].cert,
            tls_key=files["broker"].key,
            tls_client_ca=directory / "ca.pem",
            tls_ca=directory / "ca.pem",
            tls_client_auth="required",
            super_users=("admin",),
        )
    )
    await broker.start()
    try:
        assert broker.acls is not None and broker.authorizer is not None  # on by default under required
        entries = [*alice_entries(), *CAROL]
        for entry in entries:
            await add_acl(broker.etcd, KEYS, entry)
        await broker.acls.wait_for(lambda m: len(m.entries) >= len(entries), BOUND)
        yield Setup(broker, directory, directory / "ca.pem", files)
    finally:
        await broker.stop()


# ---- each wire op: refused, and let through ----


async def wire_outcome(setup: Setup, who: str, op: int) -> BaseException | None:
    connection = await setup.wire(who)
    try:
        await connection.request(WIRE_SAMPLES[op], timeout=WAIT)
    except (TidelogError, TimeoutError) as exc:
        return exc
    finally:
        await connection.close()
    return None


CHECKED_OPS = sorted(op for op, rule in WIRE_ACCESS.items() if rule is not OPEN)


@pytest.mark.parametrize("op", CHECKED_OPS, ids=lambda op: Op(op).name)
async def test_wire_op_is_refused_to_a_principal_not_allowed(setup: Setup, op: int) -> None:
    who = "carol" if WIRE_ACCESS[op] is BROKERS_ONLY else "mallory"
    outcome = await wire_outcome(setup, who, op)
    assert isinstance(outcome, PermissionDeniedError), outcome
    assert f"principal {who} may not" in outcome.message


@pytest.mark.parametrize("op", CHECKED_OPS, ids=lambda op: Op(op).name)
async def test_wire_op_is_let_through_to_a_principal_allowed(setup: Setup, op: int) -> None:
    who = "broker" if WIRE_ACCESS[op] is BROKERS_ONLY else "alice"
    outcome = await wire_outcome(setup, who, op)
    assert not isinstance(outcome, PermissionDeniedError), outcome


# ---- each gRPC method: refused, and let through ----


async def grpc_outcome(setup: Setup, who: str, method: str) -> grpc.StatusCode:
    request = GRPC_SAMPLES[method]
    kind = _kind(method)
    async with setup.channel(who) as channel:
        try:
            if kind == "unary":
                call: Any = channel.unary_unary(method, request_serializer=_ser, response_deserializer=_raw)
                await call(request, timeout=WAIT)
            elif kind == "server":
                call = channel.unary_stream(method, request_serializer=_ser, response_deserializer=_raw)
                async for _ in call(request, timeout=WAIT):
                    break
            elif kind == "client":
                call = channel.stream_unary(method, request_serializer=_ser, response_deserializer=_raw)
                await call(iter([request]), timeout=WAIT)
            else:
                call = channel.stream_stream(method, request_serializer=_ser, response_deserializer=_raw)
                async for _ in call(iter([request]), timeout=WAIT):
                    pass
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _ser(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def _raw(data: bytes) -> bytes:
    return data


def _kind(method: str) -> str:
    from tidelog.protocol._gen import api_pb2 as api
    from tidelog.protocol._gen.tidelog.v1 import admin_pb2, append_pb2

    service, name = method.strip("/").split("/")
    for descriptor in (api.DESCRIPTOR, append_pb2.DESCRIPTOR, admin_pb2.DESCRIPTOR):
        for found in descriptor.services_by_name.values():
            if found.full_name == service:
                m = found.methods_by_name[name]
                return {(False, False): "unary", (False, True): "server", (True, False): "client"}.get(
                    (m.client_streaming, m.server_streaming), "both"
                )
    raise AssertionError(f"no method {method}")


@pytest.mark.parametrize("method", sorted(GRPC_SAMPLES))
async def test_grpc_method_is_refused_to_a_principal_not_allowed(setup: Setup, method: str) -> None:
    assert await grpc_outcome(setup, "mallory", method) is grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize("method", sorted(GRPC_SAMPLES))
async def test_grpc_method_is_let_through_to_a_principal_allowed(setup: Setup, method: str) -> None:
    assert await grpc_outcome(setup, "alice", method) is not grpc.StatusCode.PERMISSION_DENIED


async def test_the_health_service_is_open(setup: Setup) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    assert GRPC_ACCESS["/grpc.health.v1.Health/Check"] is OPEN
    async with setup.channel("mallory") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=BOUND)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


# ---- what a refusal leaves behind, and who else passes ----


async def test_a_refused_create_creates_nothing_and_is_counted(setup: Setup) -> None:
    before = _denied_count()
    connection = await setup.wire("mallory")
    try:
        with pytest.raises(PermissionDeniedError, match="principal mallory may not create stream 'mal'"):
            await connection.request(CreateStreamRequest("mal", "mal"), timeout=BOUND)
    finally:
        await connection.close()
    async with setup.channel("mallory") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api_pb2_grpc.APIStub(channel).CreateStream(
                api_pb2.CreateStreamRequest(subject="mal", name="mal"), timeout=BOUND
            )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "principal mallory may not create stream 'mal'" in (refused.value.details() or "")
    assert "mal" not in setup.broker.mirror.snapshot.streams  # type: ignore[union-attr]
    assert _denied_count() >= before + 2


def _denied_count() -> float:
    found = telemetry.REGISTRY.get_sample_value(
        "tidelog_authz_denied_total", {"protocol": "wire", "operation": "CREATE_STREAM"}
    )
    grpc_found = telemetry.REGISTRY.get_sample_value(
        "tidelog_authz_denied_total", {"protocol": "grpc", "operation": "CreateStream"}
    )
    return (found or 0) + (grpc_found or 0)


async def produce(setup: Setup, who: str, stream: str) -> BaseException | int:
    connection = await setup.wire(who)
    try:
        batch = build_batch([NewRecord(b"x")], timestamp=1_700_000_000_000_000_000)
        response = await connection.request(ProduceRequest(stream, 0, Acks.LEADER), batch, timeout=BOUND)
        return int(response.header.base_offset)  # type: ignore[attr-defined]
    except TidelogError as exc:
        return exc
    finally:
        await connection.close()


async def create(setup: Setup, stream: str) -> None:
    connection = await setup.wire("admin")
    try:
        await connection.request(CreateStreamRequest(stream, stream), timeout=BOUND)
    finally:
        await connection.close()


async def test_a_super_user_needs_no_acl(setup: Setup) -> None:
    await create(setup, "by-admin")
    assert await produce(setup, "admin", "by-admin") == 0


async def mirrored(setup: Setup, holds: Callable[[AclMirror], bool]) -> None:
    """Wait until the broker's ACL mirror (fed by etcd's watch) shows the change."""
    acls = setup.broker.acls
    assert acls is not None
    await acls.wait_for(holds, BOUND)


async def test_a_policy_change_reaches_the_broker_through_etcd(setup: Setup) -> None:
    await create(setup, "changing")
    assert isinstance(await produce(setup, "mallory", "changing"), PermissionDeniedError)
    grant = AclEntry("mallory", ResourceType.STREAM, "chang", Operation.WRITE, Permission.ALLOW, Pattern.PREFIXED)
    await add_acl(setup.broker.etcd, KEYS, grant)

    await mirrored(setup, lambda m: grant in m.entries.values())
    assert await produce(setup, "mallory", "changing") == 0
    deny = AclEntry("*", ResourceType.STREAM, "changing", Operation.WRITE, Permission.DENY)
    await add_acl(setup.broker.etcd, KEYS, deny)

    await mirrored(setup, lambda m: deny in m.entries.values())
    assert isinstance(await produce(setup, "mallory", "changing"), PermissionDeniedError)  # deny wins
    assert await produce(setup, "admin", "changing") == 1  # super users are above every deny
    assert await remove_acls(setup.broker.etcd, KEYS, [grant, deny]) == 2
    await mirrored(setup, lambda m: grant not in m.entries.values() and deny not in m.entries.values())
    assert isinstance(await produce(setup, "mallory", "changing"), PermissionDeniedError)


async def test_an_undecodable_record_fails_closed(setup: Setup) -> None:
    request = MetadataRequest(("absent-stream",))

    async def alice_metadata() -> BaseException | None:
        connection = await setup.wire("alice")
        try:
            await connection.request(request, timeout=BOUND)
        except TidelogError as exc:
            return exc
        finally:
            await connection.close()
        return None

    assert not isinstance(await alice_metadata(), PermissionDeniedError)
    key = acl_prefix(KEYS) + b"garbage"
    await setup.broker.etcd.put(key, b'{"principal": "x", "resource": "topic"}')
    try:
        await mirrored(setup, lambda m: key in m.broken)
        outcome = await alice_metadata()
        assert isinstance(outcome, PermissionDeniedError) and "do not decode" in outcome.message
        await create(setup, "while-broken")  # the super user still works, to repair it
    finally:
        await setup.broker.etcd.delete(key)

    await mirrored(setup, lambda m: not m.broken)
    assert not isinstance(await alice_metadata(), PermissionDeniedError)


async def test_publish_async_stops_at_the_first_refused_message(setup: Setup) -> None:
    await create(setup, "async-ok")
    await create(setup, "async-forbidden")
    grant = AclEntry("alice", ResourceType.STREAM, "async-ok", Operation.WRITE, Permission.ALLOW)
    await add_acl(setup.broker.etcd, KEYS, grant)
    await mirrored(setup, lambda m: grant in m.entries.values())

    def request(stream: str, cid: str) -> api_pb2.PublishRequest:
        return api_pb2.PublishRequest(stream=stream, value=cid.encode(), correlationId=cid, ackPolicy=api_pb2.LEADER)

    async def gated() -> AsyncIterator[api_pb2.PublishRequest]:
        yield request("async-ok", "c1")
        yield request("async-forbidden", "c2")
        yield request("async-ok", "c3")

    responses = []
    async with setup.channel("alice") as channel:
        call = api_pb2_grpc.APIStub(channel).PublishAsync(gated(), timeout=BOUND)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for response in call:
                responses.append(response)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "stream 'async-forbidden'" in (refused.value.details() or "")
    assert [r.correlationId for r in responses] == ["c1"]
    manager = setup.broker.manager
    assert manager is not None
    assert manager.leader_of("async-ok", 0).log_end == 1  # c3 was never published
    assert manager.leader_of("async-forbidden", 0).log_end == 0


async def test_an_unknown_stream_still_answers_unknown_to_the_allowed(setup: Setup) -> None:
    outcome = await wire_outcome(setup, "alice", Op.METADATA)
    assert outcome is None or isinstance(outcome, UnknownStreamError)
