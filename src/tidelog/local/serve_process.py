"""``tidelog serve`` as a real child process on free ports, for tests and benchmarks.

The broker runs the way an operator runs it — its own process with its own embedded nats-server and etcd — and
is ready once its gRPC health service reports ``proto.API`` SERVING. Stop it with ``await proc.stop()`` (SIGTERM
to its PID; the broker stops its children before it exits).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidelog.launch.ports import free_ports
from tidelog.launch.probes import ReadinessProbe
from tidelog.launch.process import ManagedProcess, ProcessStartError
from tidelog.protocol.tls import TlsFiles

TIDELOG = Path(sys.executable).parent / "tidelog"
START_WITHIN = 60.0  # Python start-up plus etcd and nats-server on a loaded machine


def serving(port: int, host: str = "127.0.0.1", *, tls: TlsFiles | None = None) -> ReadinessProbe:
    """Ready once the broker's gRPC health service reports ``proto.API`` as SERVING (over TLS with ``tls``: the
    CA to verify the broker against, and the client certificate to present)."""
    credentials = grpc_credentials(tls) if tls is not None else None

    async def probe() -> bool:
        target = f"{host}:{port}"
        try:
            channel = (
                grpc.aio.insecure_channel(target)
                if credentials is None
                else grpc.aio.secure_channel(target, credentials)
            )
            async with channel:
                request = health_pb2.HealthCheckRequest(service="proto.API")
                response = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    return probe


def grpc_credentials(tls: TlsFiles) -> grpc.ChannelCredentials:
    """gRPC channel credentials from PEM files: the CA, and a client certificate and key when given."""

    def read(path: Path | None) -> bytes | None:
        return path.read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(read(tls.ca), read(tls.key), read(tls.cert))


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any ``TIDELOG_*`` setting, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDELOG_")}
    env.update(settings)
    return env


@dataclass
class ServedBroker:
    """A running ``tidelog serve`` and where to reach it."""

    process: ManagedProcess
    port: int
    wire_port: int
    nats_port: int
    data_dir: Path
    http_port: int = 0

    @property
    def wire_address(self) -> str:
        return f"127.0.0.1:{self.wire_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    async def stop(self, grace: float = 20.0) -> int | None:
        return await self.process.stop(grace=grace)


_START_ATTEMPTS = 3  # a free port may be taken before the broker binds it: try again on fresh ones


async def start_served_broker(workdir: Path, *args: str, **settings: str) -> ServedBroker:
    """Start ``tidelog serve`` with data under ``workdir``; ``settings`` become ``TIDELOG_*`` variables."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            return await _start_once(workdir, args, settings)
        except ProcessStartError as exc:
            if attempt == _START_ATTEMPTS or "address already in use" not in exc.log_tail.lower():
                raise
    raise AssertionError("unreachable")


async def _start_once(workdir: Path, args: tuple[str, ...], settings: dict[str, str]) -> ServedBroker:
    port, wire_port, nats_port, http_port = free_ports(4)
    env = clean_env(TIDELOG_EMBEDDED_NATS_PORT=str(nats_port), TIDELOG_HTTP_PORT=str(http_port))
    env.update({f"TIDELOG_{k.upper()}": v for k, v in settings.items()})
    data_dir = workdir / "data"
    process = ManagedProcess(
        [str(TIDELOG), "serve", "--data-dir", str(data_dir), "--port", str(port), "--wire-port", str(wire_port), *args],
        log_path=workdir / "serve.log",
        name="tidelog-serve",
        env=env,
    )
    await process.start(serving(port), ready_within=START_WITHIN)
    return ServedBroker(process, port, wire_port, nats_port, data_dir, http_port)
