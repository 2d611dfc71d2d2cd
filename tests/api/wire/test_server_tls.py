"""The wire server over TLS, in-process: who gets in, who is refused (and what they are told), and certificate
rotation without a restart.

Certificates come from ``trustme``: one CA the server trusts, another it does not, leaves valid, expired, for
another host. Each refusal is checked to happen before any request is served: nothing produced is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tests.helpers import BOUND
from tidelog.api.server_tls import ServerTls
from tidelog.api.wire.server import WireServer
from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.connection import Connection, ConnectionClosedError
from tidelog.protocol.messages import Acks, ProduceRequest
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.protocol.tls import ClientAuth, TlsFiles, client_context
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log
from tidelog.testing.fakes import StubManager

NOW = 1_700_000_000_000_000_000
PAST = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)


def write_leaf(directory: Path, name: str, leaf: trustme.LeafCert) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    return cert, key


def write_ca(directory: Path, name: str, ca: trustme.CA) -> Path:
    path = directory / f"{name}.pem"
    path.write_bytes(ca.cert_pem.bytes())
    return path


@dataclass
class Pki:
    directory: Path
    ca: trustme.CA
    ca_file: Path
    other_ca: trustme.CA

    def client(self, name: str, leaf: trustme.LeafCert | None, *, ca: Path | None = None) -> ssl.SSLContext:
        cert = key = None
        if leaf is not None:
            cert, key = write_leaf(self.directory, name, leaf)
        return client_context(TlsFiles(ca=ca or self.ca_file, cert=cert, key=key))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    return Pki(tmp_path, ca, write_ca(tmp_path, "ca", ca), trustme.CA())


@dataclass
class Served:
    server: WireServer
    tls: ServerTls
    partition: Partition


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, cert: Path, key: Path, client_ca: Path | None, auth: ClientAuth
) -> AsyncIterator[Served]:
    log = Log.open(tmp_path / "log", LogConfig(flush_policy=FlushPolicy.NEVER))
    stream = StreamRecord("s", "s", "", 1, 1, NOW)
    partition = Partition(stream, PartitionRecord("s", 0, ("b",), "b", ("b",)), log, "b", min_isr=1)
    ctx = BrokerContext(
        "b",
        BrokerConfig(data_dir=tmp_path, port=0, wire_port=0),
        StubManager({("s", 0): partition}),
        admin=None,  # type: ignore[arg-type]
        mirror=None,  # type: ignore[arg-type]
        nc=None,
    )
    tls = ServerTls(cert, key, client_ca=client_ca, client_auth=auth)
    server = WireServer(ctx, "127.0.0.1", 0, ssl=tls.context)
    await server.start()
    try:
        yield Served(server, tls, partition)
    finally:
        await server.stop(grace=1.0)
        await partition.close()


async def produce(port: int, context: ssl.SSLContext | None, value: bytes = b"x") -> int:
    connection = await Connection.open("127.0.0.1", port, ssl=context, connect_timeout=BOUND)
    try:
        batch = build_batch([NewRecord(value)], timestamp=NOW)
        response = await connection.request(ProduceRequest("s", 0, Acks.LEADER), batch, timeout=BOUND)
        return int(response.header.base_offset)  # type: ignore[attr-defined]
    finally:
        await connection.close()


@pytest.fixture
async def mtls(tmp_path: Path, pki: Pki) -> AsyncIterator[Served]:
    cert, key = write_leaf(tmp_path, "server", pki.ca.issue_cert("127.0.0.1", "localhost"))
    async with serving(tmp_path, cert, key, pki.ca_file, ClientAuth.REQUIRED) as served:
        yield served


async def test_a_client_with_a_valid_certificate_produces(mtls: Served, pki: Pki) -> None:
    client = pki.client("client", pki.ca.issue_cert("client@example.org", common_name="client"))
    assert await produce(mtls.server.port, client) == 0
    assert mtls.partition.log_end == 1


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no certificate", "refused ours"),
        ("expired", "refused ours"),
        ("another CA", "refused ours"),
        ("plaintext", "is it a TLS port"),
    ],
)
async def test_bad_clients_are_refused_and_nothing_is_stored(mtls: Served, pki: Pki, case: str, reason: str) -> None:
    contexts: dict[str, ssl.SSLContext | None] = {
        "no certificate": pki.client("anon", None),
        "expired": pki.client("old", pki.ca.issue_cert("old@example.org", not_before=PAST, not_after=PAST)),
        "another CA": pki.client("stranger", pki.other_ca.issue_cert("stranger@example.org")),
        "plaintext": None,
    }
    with pytest.raises(ConnectionClosedError, match=reason):
        await produce(mtls.server.port, contexts[case])
    assert mtls.partition.log_end == 0


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("expired", "has expired"),
        ("another CA", "CA that is not trusted"),
        ("wrong host", "not issued for the IP address dialled"),
    ],
)
async def test_clients_refuse_bad_server_certificates(tmp_path: Path, pki: Pki, case: str, reason: str) -> None:
    leaves = {
        "expired": pki.ca.issue_cert("127.0.0.1", not_before=PAST, not_after=PAST),
        "another CA": pki.other_ca.issue_cert("127.0.0.1"),
        "wrong host": pki.ca.issue_cert("10.9.8.7", "broker.example.org"),
    }
    cert, key = write_leaf(tmp_path, "server", leaves[case])
    async with serving(tmp_path, cert, key, None, ClientAuth.NONE) as served:
        with pytest.raises(ConnectionClosedError, match=reason):
            await produce(served.server.port, pki.client("client", None))
        assert served.partition.log_end == 0


async def test_optional_client_certificates_let_both_kinds_in(tmp_path: Path, pki: Pki) -> None:
    cert, key = write_leaf(tmp_path, "server", pki.ca.issue_cert("127.0.0.1"))
    async with serving(tmp_path, cert, key, pki.ca_file, ClientAuth.OPTIONAL) as served:
        assert await produce(served.server.port, pki.client("anon", None)) == 0
        assert await produce(served.server.port, pki.client("c", pki.ca.issue_cert("c@example.org"))) == 1
        with pytest.raises(ConnectionClosedError, match="refused ours"):  # a certificate given is verified
            await produce(served.server.port, pki.client("stranger", pki.other_ca.issue_cert("s@example.org")))


async def server_serial(port: int, context: ssl.SSLContext) -> int:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


async def test_a_rotated_certificate_reaches_new_connections_without_a_restart(tmp_path: Path, pki: Pki) -> None:
    first, second = pki.ca.issue_cert("127.0.0.1"), pki.ca.issue_cert("127.0.0.1")
    cert, key = write_leaf(tmp_path, "server", first)
    client = pki.client("client", None)
    async with serving(tmp_path, cert, key, None, ClientAuth.NONE) as served:
        before = await server_serial(served.server.port, client)
        open_before = await Connection.open("127.0.0.1", served.server.port, ssl=client, connect_timeout=BOUND)
        served.tls.poll_interval = 0.05
        served.tls.start()
        write_leaf(tmp_path, "server", second)  # the same paths, new contents
        async with asyncio.timeout(BOUND):
            await served.tls.wait_generation(2)
        after = await server_serial(served.server.port, client)
        assert before != after
        assert after == x509_serial(second)
        # The connection made before the rotation goes on working.
        batch = build_batch([NewRecord(b"old")], timestamp=NOW)
        await open_before.request(ProduceRequest("s", 0, Acks.LEADER), batch, timeout=BOUND)
        await open_before.close()
        await served.tls.stop()


async def test_unusable_new_files_keep_the_previous_certificate(tmp_path: Path, pki: Pki) -> None:
    cert, key = write_leaf(tmp_path, "server", pki.ca.issue_cert("127.0.0.1"))
    async with serving(tmp_path, cert, key, None, ClientAuth.NONE) as served:
        key.write_bytes(pki.ca.issue_cert("127.0.0.1").private_key_pem.bytes())  # a key of another certificate
        assert served.tls.reload_if_changed() is False
        assert served.tls.generation == 1
        assert await produce(served.server.port, pki.client("client", None)) == 0


def x509_serial(leaf: trustme.LeafCert) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number
