"""The HTTP port under authorization, on a real broker (TLS, client certificates optional, ACLs on): /metrics and
the web view need ``describe`` on ``cluster`` from the client's certificate or a Basic password; /healthz, /readyz
and static files stay open; refusals are 401 (with a Basic challenge) or 403 and one line."""

from __future__ import annotations

import asyncio
import base64
import http.client
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import trustme

from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tidelog.metadata.acl_records import CLUSTER_NAME, AclEntry, Operation, Permission, ResourceType, add_acl
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import make_user, put_user
from tidelog.protocol.tls import TlsFiles, client_context
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

KEYS = namespace_keys()
GRANTS = [
    AclEntry("alice", ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE, Permission.ALLOW),
    AclEntry("viewer", ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE, Permission.ALLOW),
]


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    challenge: str | None


@dataclass
class Setup:
    broker: Broker
    contexts: dict[str, ssl.SSLContext]  # "anonymous" (the CA only), "viewer", "carl" (certificates)

    async def get(self, path: str, who: str = "anonymous", password: tuple[str, str] | None = None) -> Answer:
        assert self.broker.http is not None
        port = self.broker.http.port

        def ask() -> Answer:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=self.contexts[who], timeout=BOUND)
            headers = {}
            if password is not None:
                headers["Authorization"] = "Basic " + base64.b64encode(":".join(password).encode()).decode()
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                return Answer(response.status, response.read().decode(), response.getheader("WWW-Authenticate"))
            finally:
                connection.close()

        return await asyncio.wait_for(asyncio.to_thread(ask), BOUND)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("http-access")
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    files = {}
    for name, leaf in (
        ("broker", ca.issue_cert("127.0.0.1", "localhost", common_name="broker")),
        ("viewer", ca.issue_cert("viewer@example.org", common_name="viewer")),
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
        for grant in GRANTS:
            await add_acl(broker.etcd, KEYS, grant)
        assert broker.acls is not None
        await broker.acls.wait_for(lambda m: len(m.entries) >= len(GRANTS), BOUND)
        contexts = {
            "anonymous": client_context(TlsFiles(ca=ca_file)),
            "viewer": client_context(files["viewer"]),
            "carl": client_context(files["carl"]),
        }
        yield Setup(broker, contexts)
    finally:
        await broker.stop()


async def test_health_and_static_files_stay_open(setup: Setup) -> None:
    assert (await setup.get("/healthz")).status == 200
    assert (await setup.get("/readyz")).status in (200, 503)
    assert (await setup.get("/static/nothing-here.js")).status == 404  # reached the app: not refused


@pytest.mark.parametrize("path", ["/metrics", "/"])
async def test_an_anonymous_client_is_challenged(setup: Setup, path: str) -> None:
    answer = await setup.get(path)
    assert answer.status == 401 and answer.challenge is not None and answer.challenge.startswith("Basic")
    assert answer.body.strip() == "principal ANONYMOUS may not describe cluster: no ACL entry allows it"


@pytest.mark.parametrize("path", ["/metrics", "/"])
async def test_a_certificate_or_a_password_with_describe_cluster_reads(setup: Setup, path: str) -> None:
    by_certificate = await setup.get(path, "viewer")
    assert by_certificate.status == 200, by_certificate.body
    by_password = await setup.get(path, password=("alice", "correct horse"))
    assert by_password.status == 200, by_password.body
    if path == "/metrics":
        assert "tidelog_authz_denied_total" in by_password.body


async def test_a_principal_the_acls_refuse_gets_403(setup: Setup) -> None:
    answer = await setup.get("/metrics", "carl")
    assert answer.status == 403 and answer.challenge is None
    assert answer.body.strip() == "principal carl may not describe cluster: no ACL entry allows it"


async def test_bad_credentials_get_401(setup: Setup) -> None:
    wrong = await setup.get("/metrics", password=("alice", "wrong"))
    assert wrong.status == 401
    assert wrong.body.strip() == "login failed for user 'alice': wrong password or no such user"
    both = await setup.get("/metrics", "viewer", password=("alice", "correct horse"))
    assert both.status == 401 and "already the principal viewer" in both.body
