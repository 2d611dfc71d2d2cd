"""The seam for principals: the verified client certificate of a wire connection and of a gRPC call, or None."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.helpers import BOUND
from tidelog.api.peer_certificate import grpc_peer_certificate, wire_peer_certificate
from tidelog.api.server_tls import ServerTls
from tidelog.local.serve_process import grpc_credentials
from tidelog.protocol.tls import ClientAuth, TlsFiles, client_context


def common_name(certificate: x509.Certificate | None) -> str | None:
    if certificate is None:
        return None
    return str(certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


class Files:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = trustme.CA()
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(self.ca.cert_pem.bytes())
        self.server = self.leaf("server", self.ca.issue_cert("127.0.0.1"))
        self.alice = self.leaf("alice", self.ca.issue_cert("alice@example.org", common_name="alice"))

    def leaf(self, name: str, leaf: trustme.LeafCert) -> tuple[Path, Path]:
        cert, key = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        cert.write_bytes(leaf.cert_chain_pems[0].bytes())
        key.write_bytes(leaf.private_key_pem.bytes())
        return cert, key

    def listener(self, auth: ClientAuth) -> ServerTls:
        return ServerTls(*self.server, client_ca=self.ca_file, client_auth=auth)

    def client(self, with_cert: bool) -> TlsFiles:
        cert, key = self.alice if with_cert else (None, None)
        return TlsFiles(ca=self.ca_file, cert=cert, key=key)


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


async def wire_peer(server_context: ssl.SSLContext | None, client: ssl.SSLContext | None) -> x509.Certificate | None:
    seen: asyncio.Future[x509.Certificate | None] = asyncio.get_running_loop().create_future()

    class Recorder(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.set_result(wire_peer_certificate(transport))

    server = await asyncio.get_running_loop().create_server(Recorder, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    try:
        async with asyncio.timeout(BOUND):
            return await seen
    finally:
        writer.close()
        server.close()


@pytest.mark.parametrize(
    ("auth", "with_cert", "expected"),
    [(ClientAuth.REQUIRED, True, "alice"), (ClientAuth.OPTIONAL, True, "alice"), (ClientAuth.OPTIONAL, False, None)],
)
async def test_wire_peer_certificate(files: Files, auth: ClientAuth, with_cert: bool, expected: str | None) -> None:
    listener = files.listener(auth)
    found = await wire_peer(listener.context(), client_context(files.client(with_cert)))
    assert common_name(found) == expected


async def test_a_plaintext_wire_connection_has_no_peer_certificate() -> None:
    assert await wire_peer(None, None) is None


class RecordingHealth(health.aio.HealthServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[x509.Certificate | None] = []

    async def Check(self, request: Any, context: Any) -> Any:
        self.seen.append(grpc_peer_certificate(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def grpc_peer(listener: ServerTls | None, client: TlsFiles | None) -> x509.Certificate | None:
    server = grpc.aio.server()
    servicer = RecordingHealth()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    if listener is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", listener.grpc_credentials())
    await server.start()
    try:
        target = f"127.0.0.1:{port}"
        channel = (
            grpc.aio.insecure_channel(target)
            if client is None
            else grpc.aio.secure_channel(target, grpc_credentials(client))
        )
        async with channel:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=BOUND)
    finally:
        await server.stop(None)
    return servicer.seen[0]


async def test_grpc_peer_certificate_under_required_client_auth(files: Files) -> None:
    assert common_name(await grpc_peer(files.listener(ClientAuth.REQUIRED), files.client(True))) == "alice"


async def test_grpc_peer_certificate_is_none_without_client_auth_or_tls(files: Files) -> None:
    # gRPC cannot ask for a certificate without requiring it: under 'optional' its clients are anonymous.
    assert await grpc_peer(files.listener(ClientAuth.OPTIONAL), files.client(True)) is None
    assert await grpc_peer(files.listener(ClientAuth.NONE), files.client(False)) is None
    assert await grpc_peer(None, None) is None
