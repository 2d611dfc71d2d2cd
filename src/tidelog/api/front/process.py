"""One API front process: ``python -m tidelog.api.front``, started by its broker
(:mod:`tidelog.api.front.supervisor`), never by hand.

The broker writes :class:`FrontSettings` on the front's standard input (a length line, then the pickled settings)
and keeps that pipe open: the front ends when it reads the end of it (the broker is gone, however it went), or on
SIGTERM/SIGINT, and then stops serving within a short grace. Once it listens it writes ``ready`` on its standard
output, which the broker waits for.

It connects to NATS (copies and ack inboxes), to etcd (the metadata mirror, for each partition's leader, and the
users, to log in callers that send a password exactly as the broker does: the same interceptor, without ACLs,
which are refused with fronts) and to the broker's loopback gRPC port (every call but ``PublishAsync``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tidelog.api.front.nats_copies import RawCopies
from tidelog.api.front.publish import front_publish_async
from tidelog.api.front.relay import ADMIN_SERVICE, API_SERVICE, APPENDER_SERVICE, relayed_service
from tidelog.api.password_check import PasswordCheck, etcd_users
from tidelog.api.principals import PrincipalResolver
from tidelog.api.rpc.authorization import AuthorizationInterceptor
from tidelog.api.rpc.call_principal import CallPrincipals
from tidelog.broker.config import BrokerConfig
from tidelog.broker.config_values import parse_etcd_endpoint
from tidelog.broker.context import BrokerContext
from tidelog.broker.ingest.nats_client import BrokerNats
from tidelog.broker.peers import Peers
from tidelog.broker.secure_links import etcd_tls, nats_security
from tidelog.metadata.etcd_client import open_etcd
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.namespace import namespace_keys
from tidelog.protocol._gen import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

READY = b"ready\n"
STOP_GRACE = 2.0
"""Seconds a stopping front gives its open calls to end."""


@dataclass(frozen=True, slots=True)
class FrontSettings:
    """What a front needs from its broker: the configuration, the port to share, the broker's loopback port, and
    where NATS and etcd are (the broker's own ones when it runs them embedded)."""

    config: BrokerConfig
    index: int
    port: int
    broker_port: int
    nats_urls: tuple[str, ...]
    etcd_endpoints: tuple[str, ...]


def write_settings(settings: FrontSettings) -> bytes:
    body = pickle.dumps(settings)
    return b"%d\n" % len(body) + body


def read_settings(stream: BinaryIO) -> FrontSettings:
    length = int(stream.readline())
    settings = pickle.loads(stream.read(length))  # from the broker that started this process, through its pipe
    if not isinstance(settings, FrontSettings):
        raise TypeError(f"expected FrontSettings on standard input, got {type(settings).__name__}")
    return settings


class _NoPartitions:
    """A front's stand-in for the partition manager: it leads nothing and runs no ingest; what it gives as every
    partition's ingest is where the copies go first (:mod:`tidelog.api.front.nats_copies`), when there is one."""

    def __init__(self, copies: RawCopies | None) -> None:
        self._copies = copies

    def ingest_of(self, stream: str, partition: int) -> RawCopies | None:
        return self._copies


def _server_options(cfg: BrokerConfig) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", cfg.max_message_bytes + 64 * 1024),
        ("grpc.so_reuseport", 1),  # beside the other fronts, on the port the broker reserved
        *(
            [("grpc.max_concurrent_streams", cfg.grpc_max_concurrent_streams)]
            if cfg.grpc_max_concurrent_streams
            else []
        ),
        *([("grpc.max_connection_idle_ms", cfg.grpc_idle_timeout_ms)] if cfg.grpc_idle_timeout_ms else []),
    ]


async def serve(settings: FrontSettings, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then stop within :data:`STOP_GRACE`."""
    cfg = settings.config
    keys = namespace_keys(cfg.namespace)
    security = nats_security(cfg)
    copies = None if security else RawCopies(list(settings.nats_urls))  # with TLS or credentials: nats-py only
    nc = BrokerNats(
        list(settings.nats_urls),
        name=f"tidelog-front-{cfg.id}-{settings.index}",
        security=security,
        require_tls=cfg.nats_tls,
    )
    etcd = open_etcd(
        [parse_etcd_endpoint(e) for e in settings.etcd_endpoints],
        timeout=10,
        tls=etcd_tls(cfg),
        user=cfg.etcd_user,
        password=cfg.etcd_password,
    )
    mirror = MetadataMirror(etcd, keys)
    peers = Peers(lambda: mirror.snapshot)
    unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{settings.broker_port}", options=unlimited)
    server: grpc.aio.Server | None = None
    try:
        await nc.connect()
        if copies is not None:
            copies.start()
        await etcd.connect()
        await mirror.start()
        assert cfg.id is not None
        ctx = BrokerContext(cfg.id, cfg, cast(Any, _NoPartitions(copies)), cast(Any, None), mirror, nc, peers=peers)
        broker = api_pb2_grpc.APIStub(channel)

        async def publish_async(requests: Any, context: Any) -> AsyncIterator[api_pb2.PublishResponse]:
            async for response in front_publish_async(ctx, broker, requests):
                yield response

        own = {
            "PublishAsync": grpc.stream_stream_rpc_method_handler(
                publish_async,
                request_deserializer=api_pb2.PublishRequest.FromString,
                response_serializer=api_pb2.PublishResponse.SerializeToString,
            )
        }
        calls = CallPrincipals(PrincipalResolver("cn", ()), PasswordCheck(etcd_users(etcd, keys)))
        server = grpc.aio.server(
            interceptors=[AuthorizationInterceptor(None, calls)],
            options=_server_options(cfg),
            maximum_concurrent_rpcs=cfg.grpc_max_concurrent_rpcs or None,
        )
        server.add_generic_rpc_handlers(
            (
                relayed_service(channel, API_SERVICE, own),
                relayed_service(channel, APPENDER_SERVICE, {}),
                relayed_service(channel, ADMIN_SERVICE, {}),
            )
        )
        checks = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(checks, server)
        if server.add_insecure_port(f"{cfg.host}:{settings.port}") == 0:
            raise OSError(f"cannot listen for gRPC on {cfg.host}:{settings.port}")
        await server.start()
        for name in ("", "proto.API", "tidelog.v1.Appender", "tidelog.v1.Admin"):
            await checks.set(name, health_pb2.HealthCheckResponse.SERVING)
        sys.stdout.buffer.write(READY)
        sys.stdout.buffer.flush()
        await stop.wait()
    finally:
        if server is not None:
            await server.stop(STOP_GRACE)
        await channel.close()
        if copies is not None:
            await copies.close()
        await peers.close()
        await mirror.stop()
        with contextlib.suppress(Exception):
            await nc.close()
        with contextlib.suppress(Exception):
            await etcd.close()


def _watch_parent(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set ``stop`` once standard input ends: the broker closed it, or is gone."""
    with contextlib.suppress(Exception):  # the descriptor, not sys.stdin: no lock held at interpreter exit
        while os.read(0, 4096):
            pass
    with contextlib.suppress(RuntimeError):  # the loop is already closed
        loop.call_soon_threadsafe(stop.set)


async def main(settings: FrontSettings) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    threading.Thread(target=_watch_parent, args=(loop, stop), daemon=True, name="parent-watch").start()
    await serve(settings, stop)


def run() -> int:
    settings = read_settings(sys.stdin.buffer)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s api-front-{settings.index} %(levelname)s %(name)s: %(message)s"
    )
    import uvloop

    try:
        uvloop.run(main(settings))
    except Exception as exc:
        log.error("api front %d stopped: %s", settings.index, exc)
        return 1
    return 0
