"""gRPC over the listener certificates of :class:`~tidelog.api.server_tls.ServerTls`: bad client certificates are
refused in the handshake, and a rotated certificate reaches new channels without a restart."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import trustme
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.helpers import BOUND
from tidelog.api.server_tls import ServerTls
from tidelog.local.serve_process import grpc_credentials
from tidelog.protocol.tls import ClientAuth, TlsFiles

PAST = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)


def write(directory: Path, name: str, leaf: trustme.LeafCert) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(leaf.cert_chain_pems[0].bytes())
    key.write_bytes(leaf.private_key_pem.bytes())
    return cert, key


def write_ca(directory: Path, name: str, ca: trustme.CA) -> Path:
    path = directory / f"{name}.pem"
    path.write_bytes(ca.cert_pem.bytes())
    return path


async def check(port: int, client: TlsFiles) -> grpc.StatusCode:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", grpc_credentials(client)) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=BOUND)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


class Served:
    def __init__(self, tls: ServerTls, port: int) -> None:
        self.tls = tls
        self.port = port


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Served, trustme.CA, Path]]:
    ca = trustme.CA()
    ca_file = write_ca(tmp_path, "ca", ca)
    cert, key = write(tmp_path, "server", ca.issue_cert("127.0.0.1"))
    tls = ServerTls(cert, key, client_ca=ca_file, client_auth=ClientAuth.REQUIRED, poll_interval=0.05)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    await server.start()
    try:
        yield Served(tls, port), ca, ca_file
    finally:
        await tls.stop()
        await server.stop(None)


async def test_client_certificates_are_checked(tmp_path: Path, served: tuple[Served, trustme.CA, Path]) -> None:
    server, ca, ca_file = served
    good = write(tmp_path, "good", ca.issue_cert("app@example.org"))
    expired = write(tmp_path, "old", ca.issue_cert("old@example.org", not_before=PAST, not_after=PAST))
    stranger = write(tmp_path, "stranger", trustme.CA().issue_cert("s@example.org"))
    assert await check(server.port, TlsFiles(ca=ca_file, cert=good[0], key=good[1])) is grpc.StatusCode.OK
    for cert, key in (expired, stranger):
        assert await check(server.port, TlsFiles(ca=ca_file, cert=cert, key=key)) is grpc.StatusCode.UNAVAILABLE
    assert await check(server.port, TlsFiles(ca=ca_file)) is grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("wrong", ["expired", "another CA", "wrong host"])
async def test_clients_refuse_a_bad_server_certificate(
    tmp_path: Path, served: tuple[Served, trustme.CA, Path], wrong: str
) -> None:
    server, ca, ca_file = served
    bad = {
        "expired": ca.issue_cert("127.0.0.1", not_before=PAST, not_after=PAST),
        "another CA": trustme.CA().issue_cert("127.0.0.1"),
        "wrong host": ca.issue_cert("10.9.8.7"),
    }[wrong]
    write(tmp_path, "server", bad)  # over the files the server uses
    assert server.tls.reload_if_changed()
    client = write(tmp_path, "good", ca.issue_cert("app@example.org"))
    assert await check(server.port, TlsFiles(ca=ca_file, cert=client[0], key=client[1])) is grpc.StatusCode.UNAVAILABLE


async def test_a_rotated_certificate_reaches_new_channels(
    tmp_path: Path, served: tuple[Served, trustme.CA, Path]
) -> None:
    server, ca, _ = served
    client = write(tmp_path, "good", ca.issue_cert("app@example.org"))
    other = trustme.CA()
    other_file = write_ca(tmp_path, "other", other)
    trusting_other = TlsFiles(ca=other_file, cert=client[0], key=client[1])
    assert await check(server.port, trusting_other) is grpc.StatusCode.UNAVAILABLE
    server.tls.start()
    write(tmp_path, "server", other.issue_cert("127.0.0.1"))  # the server's files now hold another CA's certificate
    async with asyncio.timeout(BOUND):
        await server.tls.wait_generation(2)
    assert await check(server.port, trusting_other) is grpc.StatusCode.OK
