"""SCRAM-SHA-256 logins on a real broker (TLS, client certificates optional, ACLs on): a client without a
certificate logs in and gets the user's principal; a wrong password, an unknown user, a replayed or cut-short
exchange, another mechanism, a connection that has a certificate and a listener without TLS are each refused
precisely, and the principal stays what it was. etcd holds only salted, hashed credentials."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import trustme
from scramp import ScramClient

from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tidelog.client import Admin, Cluster
from tidelog.metadata.acl_records import AclEntry, Operation, Pattern, Permission, ResourceType, add_acl
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import make_user, put_user
from tidelog.protocol.auth_messages import SaslFinishRequest, SaslStartRequest
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import InvalidArgumentError, PermissionDeniedError, UnknownStreamError
from tidelog.protocol.messages import MetadataRequest
from tidelog.protocol.scram_login import scram_login
from tidelog.protocol.tls import TlsFiles, client_context
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

KEYS = namespace_keys()
GRANT = AclEntry("alice", ResourceType.STREAM, "sasl-", Operation.ALL, Permission.ALLOW, Pattern.PREFIXED)


@dataclass
class Setup:
    broker: Broker
    anonymous: ssl.SSLContext  # TLS, no client certificate
    with_certificate: ssl.SSLContext

    async def connect(self, context: ssl.SSLContext | None = None) -> Connection:
        assert self.broker.wire is not None
        return await Connection.open(
            "127.0.0.1", self.broker.wire.port, ssl=context or self.anonymous, connect_timeout=BOUND
        )


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("sasl")
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
        files[name] = (cert, key)
    broker = Broker(
        broker_config(
            directory / "data",
            tls_cert=files["broker"][0],
            tls_key=files["broker"][1],
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
        yield Setup(
            broker,
            client_context(TlsFiles(ca=ca_file)),
            client_context(TlsFiles(ca=ca_file, cert=files["carl"][0], key=files["carl"][1])),
        )
    finally:
        await broker.stop()


async def describe(connection: Connection) -> BaseException | None:
    try:
        await connection.request(MetadataRequest(("sasl-absent",)), timeout=BOUND)
    except (PermissionDeniedError, UnknownStreamError) as exc:
        return exc
    return None


async def test_a_login_gives_the_user_principal(setup: Setup) -> None:
    connection = await setup.connect()
    try:
        refused = await describe(connection)
        assert isinstance(refused, PermissionDeniedError) and "principal ANONYMOUS" in refused.message
        assert await scram_login(connection, "alice", "correct horse", timeout=BOUND) == "alice"
        assert not isinstance(await describe(connection), PermissionDeniedError)
    finally:
        await connection.close()


async def test_the_native_client_logs_in_with_credentials(setup: Setup) -> None:
    assert setup.broker.wire is not None
    cluster = Cluster(
        f"127.0.0.1:{setup.broker.wire.port}", ssl=setup.anonymous, credentials=("alice", "correct horse")
    )
    try:
        async with Admin(cluster=cluster) as admin:
            await admin.create_stream("sasl-created", partitions=1)
        assert "sasl-created" in setup.broker.mirror.snapshot.streams  # type: ignore[union-attr]
    finally:
        await cluster.close()


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "correct horse")])
async def test_a_wrong_password_or_unknown_user_is_refused_alike(setup: Setup, user: str, password: str) -> None:
    connection = await setup.connect()
    try:
        with pytest.raises(PermissionDeniedError, match=f"login failed for user '{user}': wrong password or no"):
            await scram_login(connection, user, password, timeout=BOUND)
        refused = await describe(connection)
        assert isinstance(refused, PermissionDeniedError) and "principal ANONYMOUS" in refused.message
    finally:
        await connection.close()


async def test_a_replayed_exchange_is_refused(setup: Setup) -> None:
    """A client-final message recorded from one exchange does not log in another, nor the same one twice."""
    first = await setup.connect()
    client = ScramClient(["SCRAM-SHA-256"], "alice", "correct horse")
    try:
        started = await first.request(SaslStartRequest("SCRAM-SHA-256", client.get_client_first()), timeout=BOUND)
        client.set_server_first(started.header.message)  # type: ignore[attr-defined]
        recorded = client.get_client_final()
        await first.request(SaslFinishRequest(recorded), timeout=BOUND)
        with pytest.raises(InvalidArgumentError, match="SASL_FINISH without a SASL_START"):
            await first.request(SaslFinishRequest(recorded), timeout=BOUND)
    finally:
        await first.close()
    second = await setup.connect()
    try:
        replay = ScramClient(["SCRAM-SHA-256"], "alice", "not known")
        await second.request(SaslStartRequest("SCRAM-SHA-256", replay.get_client_first()), timeout=BOUND)
        with pytest.raises(PermissionDeniedError, match="login failed for user 'alice'"):
            await second.request(SaslFinishRequest(recorded), timeout=BOUND)
        assert isinstance(await describe(second), PermissionDeniedError)
    finally:
        await second.close()


async def test_an_exchange_cut_short_or_malformed_is_refused(setup: Setup) -> None:
    connection = await setup.connect()
    try:
        with pytest.raises(InvalidArgumentError, match="SASL_FINISH without a SASL_START"):
            await connection.request(SaslFinishRequest("c=biws,r=x,p=eA=="), timeout=BOUND)
        with pytest.raises(InvalidArgumentError, match="'PLAIN' is not served: use SCRAM-SHA-256"):
            await connection.request(SaslStartRequest("PLAIN", "\0alice\0pw"), timeout=BOUND)
        with pytest.raises(InvalidArgumentError, match="not a SCRAM client-first message"):
            await connection.request(SaslStartRequest("SCRAM-SHA-256", "hello"), timeout=BOUND)
        assert await scram_login(connection, "alice", "correct horse", timeout=BOUND) == "alice"  # still possible
    finally:
        await connection.close()


async def test_a_connection_with_a_certificate_does_not_log_in(setup: Setup) -> None:
    connection = await setup.connect(setup.with_certificate)
    try:
        with pytest.raises(InvalidArgumentError, match="already the principal carl"):
            await scram_login(connection, "alice", "correct horse", timeout=BOUND)
    finally:
        await connection.close()


async def test_etcd_holds_only_salted_hashes(setup: Setup) -> None:
    found = await setup.broker.etcd.get(f"{KEYS.prefix}/users/alice".encode())
    stored = bytes(found.value)
    assert b"correct horse" not in stored
    assert set(json.loads(stored)) == {"name", "salt", "stored_key", "server_key", "iterations"}


async def test_a_listener_without_tls_refuses_logins(tmp_path: Path) -> None:
    plain = Broker(broker_config(tmp_path / "plain"))
    await plain.start()
    try:
        assert plain.wire is not None
        connection = await Connection.open("127.0.0.1", plain.wire.port, connect_timeout=BOUND)
        try:
            with pytest.raises(InvalidArgumentError, match="only over TLS"):
                await scram_login(connection, "alice", "correct horse", timeout=BOUND)
        finally:
            await connection.close()
    finally:
        await plain.stop()
