"""The gRPC servicers — ``proto.API``, ``tidelog.v1.Appender`` and ``tidelog.v1.Admin`` — as thin handlers that
call the RPC family modules and map errors to statuses.

Every handler goes through :func:`_guard`/the streaming equivalents, the one place where an exception becomes a
gRPC status — looked up in :mod:`tidelog.protocol.errors`, so gRPC and the wire protocol answer the same condition
with the same meaning. Cursor RPCs are in :mod:`tidelog.api.rpc.cursors`, consumer-group RPCs in
:mod:`tidelog.api.rpc.groups`, the cluster reshaping RPCs in :mod:`tidelog.api.rpc.admin`.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tidelog import telemetry
from tidelog.api.authorizer import Authorizer
from tidelog.api.password_check import PasswordCheck
from tidelog.api.principals import PrincipalResolver
from tidelog.api.rpc import admin, cursors, groups, metadata, publish, publish_batches, subscribe
from tidelog.api.rpc.append import GrpcAppends
from tidelog.api.rpc.authorization import AuthorizationInterceptor
from tidelog.api.rpc.call_principal import CallPrincipals
from tidelog.api.server_tls import ServerTls
from tidelog.broker.context import BrokerContext
from tidelog.broker.translate import as_tidelog_error
from tidelog.protocol._gen import api_pb2_grpc
from tidelog.protocol._gen.tidelog.v1 import admin_pb2_grpc, append_pb2_grpc
from tidelog.protocol.errors import InternalError, TidelogError, status_details

log = logging.getLogger(__name__)

T = TypeVar("T")


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    err = as_tidelog_error(exc)
    if isinstance(err, InternalError) and not isinstance(exc, TidelogError):
        log.exception("internal error serving a gRPC request", exc_info=exc)
    await context.abort(err.grpc_status, status_details(err.message))


async def _guard(context: grpc.aio.ServicerContext[Any, Any], call: Awaitable[T]) -> T:
    try:
        return await call
    except grpc.aio.AbortError:
        raise
    except Exception as exc:
        await _abort(context, exc)
        raise AssertionError("unreachable: abort raises") from exc


class LiftbridgeService(api_pb2_grpc.APIServicer):  # type: ignore[misc]
    """``proto.API`` over a :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    async def CreateStream(self, request: Any, context: Any) -> Any:
        return await _guard(context, metadata.create_stream(self._ctx, request))

    async def DeleteStream(self, request: Any, context: Any) -> Any:
        return await _guard(context, metadata.delete_stream(self._ctx, request))

    async def PauseStream(self, request: Any, context: Any) -> Any:
        return await _guard(context, metadata.pause_stream(self._ctx, request))

    async def SetStreamReadonly(self, request: Any, context: Any) -> Any:
        return await _guard(context, metadata.set_stream_readonly(self._ctx, request))

    async def FetchMetadata(self, request: Any, context: Any) -> Any:
        return await _guard(context, metadata.fetch_metadata(self._ctx, request))

    async def FetchPartitionMetadata(self, request: Any, context: Any) -> Any:
        return await _guard(context, metadata.fetch_partition_metadata(self._ctx, request))

    async def Publish(self, request: Any, context: Any) -> Any:
        return await _guard(context, publish.publish(self._ctx, request, publish.request_timeout(self._ctx, context)))

    async def PublishToSubject(self, request: Any, context: Any) -> Any:
        timeout = publish.request_timeout(self._ctx, context)
        return await _guard(context, publish.publish_to_subject(self._ctx, request, timeout))

    async def PublishAsync(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for response in publish_batches.publish_async(self._ctx, request_iterator):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for message in subscribe.subscribe(self._ctx, request):
                yield message
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    async def _unimplemented(self, context: Any, what: str) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not implemented yet")

    async def SetCursor(self, request: Any, context: Any) -> Any:
        return await _guard(context, cursors.set_cursor(self._ctx, request, context))

    async def FetchCursor(self, request: Any, context: Any) -> Any:
        return await _guard(context, cursors.fetch_cursor(self._ctx, request, context))

    async def JoinConsumerGroup(self, request: Any, context: Any) -> Any:
        return await _guard(context, groups.join(self._ctx, request))

    async def LeaveConsumerGroup(self, request: Any, context: Any) -> Any:
        return await _guard(context, groups.leave(self._ctx, request))

    async def FetchConsumerGroupAssignments(self, request: Any, context: Any) -> Any:
        return await _guard(context, groups.fetch_assignments(self._ctx, request))

    async def ReportConsumerGroupCoordinator(self, request: Any, context: Any) -> Any:
        return await _guard(context, groups.report_coordinator(self._ctx, request))


class AppenderService(append_pb2_grpc.AppenderServicer):  # type: ignore[misc]
    """``tidelog.v1.Appender``: transactional appends for clients in other languages."""

    def __init__(self, appends: GrpcAppends) -> None:
        self._appends = appends

    async def Append(self, request_iterator: Any, context: Any) -> Any:
        return await _guard(context, self._appends.append(request_iterator, context))


class AdminService(admin_pb2_grpc.AdminServicer):  # type: ignore[misc]
    """``tidelog.v1.Admin``: reshaping the cluster (partitions, settings, replica moves, leaders)."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx

    async def AddPartitions(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.add_partitions(self._ctx, request, context))

    async def AlterStream(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.alter_stream(self._ctx, request, context))

    async def GenerateReassignment(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.generate_reassignment(self._ctx, request, context))

    async def ExecuteReassignment(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.execute_reassignment(self._ctx, request, context))

    async def VerifyReassignment(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.verify_reassignment(self._ctx, request, context))

    async def CancelReassignment(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.cancel_reassignment(self._ctx, request, context))

    async def DecommissionBroker(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.decommission_broker(self._ctx, request, context))

    async def DecommissionProgress(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.decommission_progress(self._ctx, request, context))

    async def ElectPreferredLeaders(self, request: Any, context: Any) -> Any:
        return await _guard(context, admin.elect_preferred_leaders(self._ctx, request, context))


class _RequestTiming(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Times every unary and client-streaming RPC into ``tidelog_request_duration_seconds{protocol="grpc"}``.
    Server-streaming RPCs (Subscribe, PublishAsync) last as long as the client wants and are not timed."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not telemetry.enabled():
            return handler
        name = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _timed(handler.unary_unary, name), handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _timed(handler.stream_unary, name), handler.request_deserializer, handler.response_serializer
            )
        return handler


def _timed(behavior: Callable[[Any, Any], Awaitable[Any]], name: str) -> Callable[[Any, Any], Awaitable[Any]]:
    observe = telemetry.request_observer("grpc", name)

    async def timed(request: Any, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return await behavior(request, context)
        finally:
            observe(time.perf_counter() - started)

    return timed


class GrpcServer:
    """The gRPC server: ``proto.API``, ``tidelog.v1.Appender``, ``tidelog.v1.Admin`` and the standard health
    service."""

    def __init__(
        self,
        ctx: BrokerContext,
        host: str,
        port: int,
        *,
        tls: ServerTls | None = None,
        authorizer: Authorizer | None = None,
        principals: PrincipalResolver | None = None,
        passwords: PasswordCheck | None = None,
        fronts: bool = False,
    ) -> None:
        """With ``tls``, the port speaks TLS only (its certificate follows ``tls``'s reloads); without, plaintext.
        With ``authorizer``, every call is checked before its handler runs
        (:mod:`tidelog.api.rpc.authorization`); with or without it, a call that sends a password is logged in
        through ``passwords`` (or refused) first (:mod:`tidelog.api.rpc.call_principal`).

        With ``fronts`` (API front processes, :mod:`tidelog.api.front`): the port is only reserved here (bound
        with SO_REUSEPORT, not listened on: the fronts listen on it), and the service listens on a loopback port
        of its own, :attr:`internal_port`, for the fronts."""
        calls = CallPrincipals(principals or PrincipalResolver("cn", ()), passwords)
        interceptors: list[Any] = [AuthorizationInterceptor(authorizer, calls), _RequestTiming()]
        cfg = ctx.config
        self._server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.max_receive_message_length", cfg.max_message_bytes + 64 * 1024),
                ("grpc.so_reuseport", 0),  # a port in use is refused, not shared (fronts: the loopback port)
                *(
                    [("grpc.max_concurrent_streams", cfg.grpc_max_concurrent_streams)]
                    if cfg.grpc_max_concurrent_streams
                    else []
                ),
                *([("grpc.max_connection_idle_ms", cfg.grpc_idle_timeout_ms)] if cfg.grpc_idle_timeout_ms else []),
            ],
            maximum_concurrent_rpcs=cfg.grpc_max_concurrent_rpcs or None,  # 0: no limit
        )
        api_pb2_grpc.add_APIServicer_to_server(LiftbridgeService(ctx), self._server)
        self.appends = GrpcAppends(ctx)
        append_pb2_grpc.add_AppenderServicer_to_server(AppenderService(self.appends), self._server)
        admin_pb2_grpc.add_AdminServicer_to_server(AdminService(ctx), self._server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.internal_port = 0
        self._reserved: socket.socket | None = None
        if fronts:
            self._reserved = reserve_port(host, port)
            self.port = self._reserved.getsockname()[1]
            self.internal_port = self._server.add_insecure_port("127.0.0.1:0")
        elif tls is None:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        else:
            self.port = self._server.add_secure_port(f"{host}:{port}", tls.grpc_credentials())
        if self.port == 0 or (fronts and self.internal_port == 0):
            raise OSError(f"cannot listen for gRPC on {host}:{port}")

    async def start(self) -> None:
        await self._server.start()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.stop(grace)
        if self._reserved is not None:
            self._reserved.close()

    async def _set_health(self, status: Any) -> None:
        for service in ("", "proto.API", "tidelog.v1.Appender", "tidelog.v1.Admin"):
            await self.health.set(service, status)


def reserve_port(host: str, port: int) -> socket.socket:
    """``host:port`` bound with SO_REUSEPORT and not listened on: the port (a free one for 0) stays this broker's
    while the API fronts listen on it beside each other; no connection is ever queued on this socket."""
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
