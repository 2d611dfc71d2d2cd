"""Password logins on gRPC calls, on a real broker (TLS, client certificates optional, ACLs on): a call that sends
``authorization: Basic`` with a user's password gets the user's principal and exactly its ACLs (unary,
server-streaming and PublishAsync); a wrong password, an unknown user, a malformed header, a password on a
connection with a certificate, and a password on a port without TLS are each refused with UNAUTHENTICATED before
the call does anything."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import trustme

from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tidelog.api.rpc.call_principal import basic_authorization
from tidelog.local.serve_process import grpc_credentials
from tidelog.metadata.acl_records import AclEntry, Operation, Pattern, Permission, ResourceType, add_acl
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import make_user, put_user
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.tls import TlsFiles
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

KEYS = namespace_keys()
GRANT = AclEntry("alice", ResourceType.STREAM, "pw-", Operation.ALL, Permission.ALLOW, Pattern.PREFIXED)
ALICE = [basic_authorization("alice", "correct horse")]


@dataclass
class Setup:
    broker: Broker
    anonymous: TlsFiles  # the CA only
    with_certificate: TlsFiles
    broker_files: TlsFiles

    def channel(self, files: TlsFiles | None = None) -> grpc.aio.Channel:
        assert self.broker.grpc is not None
        credentials = grpc_credentials(files or self.anonymous)
        return grpc.aio.secure_channel(f"127.0.0.1:{self.broker.grpc.port}", credentials)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("grpc-passwords")
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    files = {}
    for name, leaf in (
        ("broker", ca.issue_cert("127.0.0.1", "localhost", common_name="broker")),
        ("carl", ca.issue_cert("carl@example.org", common_name="carl")),
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
            tls_client_auth="optional",
            authz_enabled=True,
        )
    )
    await broker.start()
    try:
        await put_user(broker.etcd, KEYS, make_user("alice", "correct horse"))
        await add_acl(broker.etcd, KEYS, GRANT)
        assert broker.acls is not None
        await broker.acls.wait_for(lambda m: GRANT in m.entries.values(), BOUND)
        yield Setup(broker, TlsFiles(ca=ca_file), files["carl"], files["broker"])
    finally:
        await broker.stop()


def create(name: str) -> api_pb2.CreateStreamRequest:
    return api_pb2.CreateStreamRequest(subject=name, name=name, partitions=1)


async def test_a_password_gives_the_call_the_user_principal(setup: Setup) -> None:
    async with setup.channel() as channel:
        stub = api_pb2_grpc.APIStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateStream(create("pw-anonymous"), timeout=BOUND)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "principal ANONYMOUS" in (refused.value.details() or "")
        await stub.CreateStream(create("pw-created"), metadata=ALICE, timeout=BOUND)
        # the same ACLs as any principal named alice: nothing outside pw-
        with pytest.raises(grpc.aio.AioRpcError) as outside:
            await stub.CreateStream(create("other-stream"), metadata=ALICE, timeout=BOUND)
        assert outside.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "principal alice may not create stream 'other-stream'" in (outside.value.details() or "")
    assert "pw-created" in setup.broker.mirror.snapshot.streams  # type: ignore[union-attr]
    assert "other-stream" not in setup.broker.mirror.snapshot.streams  # type: ignore[union-attr]


async def test_streaming_calls_log_in_too(setup: Setup) -> None:
    """PublishAsync (bidirectional) and Subscribe (server-streaming), with call credentials on the channel."""
    assert setup.broker.grpc is not None
    login = grpc.metadata_call_credentials(lambda _context, callback: callback(tuple(ALICE), None))
    credentials = grpc.composite_channel_credentials(grpc_credentials(setup.anonymous), login)
    async with grpc.aio.secure_channel(f"127.0.0.1:{setup.broker.grpc.port}", credentials) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        await stub.CreateStream(create("pw-stream"), timeout=BOUND)

        async def messages() -> AsyncIterator[api_pb2.PublishRequest]:
            for n in range(3):
                yield api_pb2.PublishRequest(
                    stream="pw-stream", value=b"v%d" % n, correlationId=str(n), ackPolicy=api_pb2.ALL
                )

        acks = [response async for response in stub.PublishAsync(messages(), timeout=BOUND)]
        assert [ack.correlationId for ack in acks] == ["0", "1", "2"]
        call = stub.Subscribe(api_pb2.SubscribeRequest(stream="pw-stream", startPosition=api_pb2.EARLIEST))
        try:
            assert await asyncio.wait_for(call.read(), BOUND) == api_pb2.Message()  # the subscription is made
            assert (await asyncio.wait_for(call.read(), BOUND)).value == b"v0"
        finally:
            call.cancel()


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "correct horse")])
async def test_a_wrong_password_or_unknown_user_is_refused_alike(setup: Setup, user: str, password: str) -> None:
    async with setup.channel() as channel:
        stub = api_pb2_grpc.APIStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.CreateStream(create("pw-refused"), metadata=[basic_authorization(user, password)], timeout=BOUND)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == f"login failed for user {user!r}: wrong password or no such user"
    assert "pw-refused" not in setup.broker.mirror.snapshot.streams  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("Bearer abc", "unknown scheme"),
        ("Basic !!!", "not valid base64"),
        ("Basic " + "YWxpY2U=", "names no user"),  # "alice", no colon
    ],
)
async def test_malformed_authorization_is_refused(setup: Setup, value: str, message: str) -> None:
    async with setup.channel() as channel:
        stub = api_pb2_grpc.APIStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), metadata=[("authorization", value)], timeout=BOUND)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in (refused.value.details() or "")


async def test_a_connection_with_a_certificate_does_not_send_a_password(setup: Setup, tmp_path: Path) -> None:
    """gRPC asks for client certificates only under ``required`` (under ``optional`` a certificate is not even
    requested, and the password decides)."""
    assert setup.anonymous.ca is not None and setup.with_certificate.cert is not None
    required = Broker(
        broker_config(
            tmp_path / "required",
            tls_cert=setup.broker_files.cert,
            tls_key=setup.broker_files.key,
            tls_client_ca=setup.anonymous.ca,
            tls_ca=setup.anonymous.ca,
            tls_client_auth="required",
        )
    )
    await required.start()
    try:
        assert required.grpc is not None
        credentials = grpc_credentials(setup.with_certificate)
        async with grpc.aio.secure_channel(f"127.0.0.1:{required.grpc.port}", credentials) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), metadata=ALICE, timeout=BOUND)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "already the principal carl" in (refused.value.details() or "")
    finally:
        await required.stop()


async def test_a_port_without_tls_refuses_passwords(tmp_path: Path) -> None:
    """Even with authorization off: a password is refused, never ignored."""
    plain = Broker(broker_config(tmp_path / "plain"))
    await plain.start()
    try:
        assert plain.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{plain.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=BOUND)  # no password: served
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.FetchMetadata(api_pb2.FetchMetadataRequest(), metadata=ALICE, timeout=BOUND)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "served only over TLS" in (refused.value.details() or "")
    finally:
        await plain.stop()
