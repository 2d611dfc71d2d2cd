"""A broker's own links secured: NATS over TLS with a user and password, etcd over TLS with a client certificate.

Real servers on loopback: a nats-server with TLS and authorization from its flags, an etcd serving https with
client certificates required. The broker stores what is published to NATS (so its NATS links work: the broker's
client, and ingest through nats-py) and registers in etcd (so the etcd link works). A NATS server without TLS is
refused when TLS was asked for, before the password would be sent to it in clear.
"""

from __future__ import annotations

import asyncio
import importlib.util
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest
import pytest_asyncio
import trustme

from tests.helpers import BOUND, LONG_BOUND
from tidelog.broker.config import BrokerConfig
from tidelog.broker.embedded import EmbeddedEtcd, EmbeddedNats
from tidelog.broker.ingest.nats_client import NatsNotTlsError
from tidelog.broker.secure_links import PeerTls, nats_security
from tidelog.launch.probes import ReadinessProbe, tcp_probe
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.tls import TlsConfigError, TlsFiles, client_context
from tidelog.server import Broker, server_tls

pytestmark = pytest.mark.slow


class TlsEtcd(EmbeddedEtcd):
    """An etcd whose client URL is https, with client certificates required (``extra_args`` give the files)."""

    @property
    def client_url(self) -> str:
        return super().client_url.replace("http://", "https://")

    def _ready_probe(self) -> ReadinessProbe:
        return tcp_probe(self.host, self.client_port)  # its health endpoint needs TLS; the broker waits for it


class Pki:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_file = self.write("ca.pem", self.ca.cert_pem.bytes())
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.server_cert = self.write("server.pem", server.cert_chain_pems[0].bytes())
        self.server_key = self.write("server.key", server.private_key_pem.bytes())
        client = self.ca.issue_cert("broker@example.org", common_name="root")
        self.client_cert = self.write("client.pem", client.cert_chain_pems[0].bytes())
        self.client_key = self.write("client.key", client.private_key_pem.bytes())

    def write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest_asyncio.fixture
async def secure_nats(tmp_path: Path, pki: Pki) -> AsyncIterator[EmbeddedNats]:
    server = EmbeddedNats(
        tmp_path / "nats",
        extra_args=[
            "--tls", "--tlscert", str(pki.server_cert), "--tlskey", str(pki.server_key),
            "--user", "tidelog", "--pass", "s3cret",
        ],
    )  # fmt: skip
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest_asyncio.fixture
async def secure_etcd(tmp_path: Path, pki: Pki) -> AsyncIterator[EmbeddedEtcd]:
    server = TlsEtcd(
        tmp_path / "etcd",
        extra_args=[
            "--cert-file", str(pki.server_cert), "--key-file", str(pki.server_key),
            "--trusted-ca-file", str(pki.ca_file), "--client-cert-auth",
        ],
    )  # fmt: skip
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def secure_config(tmp_path: Path, pki: Pki, nats_url: str, etcd_endpoint: str, **more: Any) -> BrokerConfig:
    return BrokerConfig(
        data_dir=tmp_path / "broker",
        port=0,
        wire_port=0,
        nats_servers=(nats_url,),
        nats_tls_ca=pki.ca_file,
        nats_user="tidelog",
        nats_password="s3cret",
        etcd_endpoints=(etcd_endpoint,),
        etcd_tls_ca=pki.ca_file,
        etcd_tls_cert=pki.client_cert,
        etcd_tls_key=pki.client_key,
        **more,
    )


async def test_a_broker_works_over_secured_nats_and_etcd(
    tmp_path: Path, pki: Pki, secure_nats: EmbeddedNats, secure_etcd: EmbeddedEtcd
) -> None:
    broker = Broker(secure_config(tmp_path, pki, secure_nats.url, secure_etcd.endpoints[0]))
    async with asyncio.timeout(LONG_BOUND):
        await broker.start()
    try:
        assert broker.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(api_pb2.CreateStreamRequest(name="s", subject="s"), timeout=BOUND)
            # Through NATS (TLS, user and password): the broker's ingest stores it.
            client = await nats.connect(
                secure_nats.url,
                tls=client_context(TlsFiles(ca=pki.ca_file)),
                user="tidelog",
                password="s3cret",
                connect_timeout=BOUND,
            )
            try:
                await client.publish("s", b"over tls")
                await client.flush()
            finally:
                await client.close()
            manager = broker.manager
            assert manager is not None
            async with asyncio.timeout(BOUND):
                while (partition := manager.local("s", 0)) is None or partition.log_end < 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
    finally:
        await broker.stop()


async def test_a_nats_server_without_tls_is_refused_before_the_password_is_sent(tmp_path: Path, pki: Pki) -> None:
    received = bytearray()

    async def clear_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'INFO {"server_id":"fake","version":"2.10.0","max_payload":1048576,"auth_required":true}\r\n')
        await writer.drain()
        received.extend(await reader.read(65536))  # a CONNECT would arrive here
        writer.close()

    server = await asyncio.start_server(clear_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        broker = Broker(secure_config(tmp_path, pki, f"nats://127.0.0.1:{port}", "http://127.0.0.1:1"))
        with pytest.raises(NatsNotTlsError, match="does not use TLS"):
            async with asyncio.timeout(LONG_BOUND):
                await broker.start()
    finally:
        server.close()
        await server.wait_closed()
    assert b"s3cret" not in received and b"CONNECT" not in received


def test_nats_security_options(tmp_path: Path, pki: Pki) -> None:
    base = {"data_dir": tmp_path, "nats_servers": ("nats://n:4222",)}
    assert nats_security(BrokerConfig(**base)) == {}
    with_password = nats_security(BrokerConfig(**base, nats_user="u", nats_password="p", nats_tls_ca=pki.ca_file))
    assert with_password["user"] == "u" and with_password["password"] == "p"
    assert isinstance(with_password["tls"], ssl.SSLContext)
    assert nats_security(BrokerConfig(**base, nats_token="t")) == {"token": "t"}
    creds = tmp_path / "user.creds"
    creds.write_text("not read here")
    config = BrokerConfig(**base, nats_creds=creds)
    if importlib.util.find_spec("nkeys") is None:
        with pytest.raises(TlsConfigError, match="needs the 'nkeys' package"):
            nats_security(config)
    else:
        assert nats_security(config) == {"user_credentials": str(creds)}
        with pytest.raises(TlsConfigError, match="does not exist"):
            nats_security(BrokerConfig(**base, nats_nkey_seed=tmp_path / "nope.nk"))


def test_links_to_other_brokers_present_the_reloaded_certificate(tmp_path: Path, pki: Pki) -> None:
    config = BrokerConfig(data_dir=tmp_path, tls_cert=pki.server_cert, tls_key=pki.server_key, tls_ca=pki.ca_file)
    listener = server_tls(config)
    assert listener is not None
    peer = PeerTls(config, listener)
    first = peer()
    assert peer() is first  # one context while the files stay the same
    leaf = pki.ca.issue_cert("127.0.0.1")
    pki.write("server.pem", leaf.cert_chain_pems[0].bytes())
    pki.write("server.key", leaf.private_key_pem.bytes())
    assert listener.reload_if_changed()
    assert peer() is not first
