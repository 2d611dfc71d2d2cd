"""Password logins from the CLI (``--user`` with ``--password-file``, ``--password`` or ``TIDELOG_CLIENT_*``) on a
real broker with TLS, optional client certificates and ACLs: commands act as the user, a wrong password is one
line, and login options that cannot work are refused before anything is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import trustme
from click.testing import CliRunner, Result

from tests.broker.conftest import broker_config
from tests.helpers import BOUND
from tidelog.cli.main import cli
from tidelog.cli.top import Access, scrape_metrics
from tidelog.metadata.acl_records import CLUSTER_NAME, AclEntry, Operation, Pattern, Permission, ResourceType, add_acl
from tidelog.metadata.namespace import namespace_keys
from tidelog.metadata.user_records import make_user, put_user
from tidelog.protocol.tls import TlsFiles, client_context
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

KEYS = namespace_keys()
GRANTS = [
    AclEntry("app", ResourceType.STREAM, "login-", Operation.ALL, Permission.ALLOW, Pattern.PREFIXED),
    AclEntry("app", ResourceType.CLUSTER, CLUSTER_NAME, Operation.DESCRIBE, Permission.ALLOW),
]


@dataclass
class Setup:
    broker: Broker
    ca: Path
    password_file: Path

    async def tidelog(self, *args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Result:
        assert self.broker.wire is not None
        brokers = f"127.0.0.1:{self.broker.wire.port}"

        def run() -> Result:
            full = {"TIDELOG_BROKERS": brokers, "COLUMNS": "200", **(env or {})}
            return CliRunner().invoke(cli, list(args), env=full, input=stdin)

        return await asyncio.wait_for(asyncio.to_thread(run), BOUND * 2)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def setup(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Setup]:
    directory: Path = tmp_path_factory.mktemp("login-cli")
    ca = trustme.CA()
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    leaf = ca.issue_cert("127.0.0.1", "localhost", common_name="broker")
    cert, key = directory / "broker.pem", directory / "broker.key"
    cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    password_file = directory / "password"
    password_file.write_text("s3cret pass\n")
    broker = Broker(
        broker_config(
            directory / "data",
            tls_cert=cert,
            tls_key=key,
            tls_client_ca=ca_file,
            tls_ca=ca_file,
            tls_client_auth="optional",
            authz_enabled=True,
        )
    )
    await broker.start()
    try:
        await put_user(broker.etcd, KEYS, make_user("app", "s3cret pass"))
        for grant in GRANTS:
            await add_acl(broker.etcd, KEYS, grant)
        assert broker.acls is not None
        await broker.acls.wait_for(lambda m: len(m.entries) >= len(GRANTS), BOUND)
        yield Setup(broker, ca_file, password_file)
    finally:
        await broker.stop()


async def test_commands_act_as_the_user(setup: Setup) -> None:
    tls = ("--tls-ca", str(setup.ca))
    anonymous = await setup.tidelog("stream", "create", "login-a", *tls)
    assert anonymous.exit_code == 1 and "permission denied: principal ANONYMOUS may not" in anonymous.output
    created = await setup.tidelog(
        "stream", "create", "login-a", *tls, "--user", "app", "--password-file", str(setup.password_file)
    )
    assert created.exit_code == 0, created.output
    # the environment variables, as a script would set them; publish and read back
    env = {
        "TIDELOG_CLIENT_TLS_CA": str(setup.ca),
        "TIDELOG_CLIENT_USER": "app",
        "TIDELOG_CLIENT_PASSWORD": "s3cret pass",
    }
    published = await setup.tidelog("publish", "login-a", "one", "two", "-q", "--no-idempotent", env=env)
    assert published.exit_code == 0, published.output
    read = await setup.tidelog("subscribe", "login-a", "--earliest", "--stop-at-end", env=env)
    assert read.exit_code == 0 and [line.split()[-1] for line in read.output.splitlines()] == ["one", "two"], (
        read.output
    )
    listed = await setup.tidelog("stream", "list", *tls, "--user", "app", "--password", "s3cret pass")
    assert listed.exit_code == 0 and "login-a" in listed.output, listed.output
    outside = await setup.tidelog("stream", "create", "other", env=env)
    assert outside.exit_code == 1 and "principal app may not create stream 'other'" in outside.output


async def test_a_wrong_password_is_one_line(setup: Setup) -> None:
    result = await setup.tidelog("stream", "list", "--tls-ca", str(setup.ca), "--user", "app", "--password", "nope")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: permission denied: login failed for user 'app': wrong password or no such user"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "app", "--password", "pw"], "a password login needs TLS (--tls-ca)"),
        (["--tls-ca", "CA", "--password", "pw"], "a password needs --user"),
        (["--tls-ca", "CA", "--user", "app", "--password", "pw", "--password-file", "PW"], "give one of"),
        (["--tls-ca", "CA", "--user", "app"], "no password for user 'app': give --password-file FILE"),
        (["--tls-ca", "CA", "--user", "app", "--password-file", "EMPTY"], "its first line is the password"),
        (["--tls-ca", "CA", "--user", "", "--password", "pw"], "the user name is empty"),
    ],
)
async def test_login_options_that_cannot_work_are_refused(
    setup: Setup, tmp_path: Path, args: list[str], message: str
) -> None:
    empty = tmp_path / "empty"
    empty.write_text("")
    swap = {"CA": str(setup.ca), "PW": str(setup.password_file), "EMPTY": str(empty)}
    result = await setup.tidelog("stream", "list", *(swap.get(arg, arg) for arg in args))
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


async def test_top_reads_the_leaders_and_metrics_as_the_user(setup: Setup) -> None:
    login = ("--tls-ca", str(setup.ca), "--user", "app", "--password-file", str(setup.password_file))
    created = await setup.tidelog("stream", "create", "login-top", *login)
    assert created.exit_code == 0, created.output
    etcd = ",".join(setup.broker.etcd_endpoints)
    result = await setup.tidelog("top", "--once", "--interval", "0.2", "-o", "json", "-e", etcd, *login)
    assert result.exit_code == 0, result.output
    ours = [p for p in json.loads(result.output)["partitions"] if p["stream"] == "login-top"]
    assert [p["high_watermark"] for p in ours] == [0]  # the leader answered (None: it was not reached)
    assert setup.broker.http is not None
    url = f"https://127.0.0.1:{setup.broker.http.port}/metrics"
    access = Access(client_context(TlsFiles(ca=setup.ca)), ("app", "s3cret pass"))
    assert "tidelog_" in await asyncio.to_thread(scrape_metrics, url, access)
