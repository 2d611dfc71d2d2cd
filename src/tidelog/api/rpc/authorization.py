"""Authorization of every gRPC call, as a server interceptor, before its handler runs.

:class:`AuthorizationInterceptor` wraps each method's handler with the rule
:data:`~tidelog.api.access_table.GRPC_ACCESS` gives for it, checked against the caller's principal
(:meth:`~tidelog.api.rpc.call_principal.CallPrincipals.of`):

- unary and server-streaming calls (``Subscribe``): the request is checked before the handler is called, so a
  refused ``Subscribe`` never creates a subscription (Liftbridge checks after creating it);
- client-streaming calls (``tidelog.v1.Appender/Append``): the first message is read and checked before the
  handler starts, and every later one before it is handed on;
- bidirectional ``PublishAsync``: every message is checked before it is handed on; the first refused one ends the
  call with PERMISSION_DENIED after the acks of the messages before it, and nothing after it is published
  (Liftbridge's keeps publishing).

A method missing from the table is refused to everyone but brokers and super users.

The caller's principal comes from :class:`~tidelog.api.rpc.call_principal.CallPrincipals`: its certificate, or the
user name and password sent with the call; credentials it refuses end the call with UNAUTHENTICATED first. On a
broker without authorization the interceptor still checks credentials (a wrong password is refused, never
ignored) and nothing else: request streams are then handed on unchecked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from tidelog.api.access_table import GRPC_ACCESS, Rule
from tidelog.api.authorizer import Authorizer
from tidelog.api.principals import Principal
from tidelog.api.rpc.call_principal import AUTHORIZATION_KEY, CallPrincipals, CallRefused
from tidelog.protocol.errors import PermissionDeniedError, status_details

_Behavior = Callable[[Any, Any], Any]


class AuthorizationInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks every call's credentials, and against the ACLs (``authorizer``), before its handler runs (module
    docstring)."""

    def __init__(self, authorizer: Authorizer | None, principals: CallPrincipals) -> None:
        self._authorizer = authorizer
        self._principals = principals

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        if self._authorizer is None and not _has_credentials(details):
            return handler  # nothing to check: no ACLs, no password
        method = details.method
        rule = GRPC_ACCESS.get(method)
        check = _Check(self._authorizer, self._principals, rule, method)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                check.unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                check.server_streaming(handler.unary_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                check.client_streaming(handler.stream_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            check.bidirectional(handler.stream_stream), handler.request_deserializer, handler.response_serializer
        )


def _has_credentials(details: Any) -> bool:
    return any(key == AUTHORIZATION_KEY for key, _value in details.invocation_metadata or ())


class _Check:
    """One method's rule, applied to its calls."""

    def __init__(self, authorizer: Authorizer | None, principals: CallPrincipals, rule: Rule | None, method: str):
        self._authorizer = authorizer
        self._principals = principals
        self._rule = rule
        self._method = method
        self._name = method.rsplit("/", 1)[-1]

    async def _principal(self, context: Any) -> Principal:
        """The call's principal; a call whose credentials are refused is ended with UNAUTHENTICATED."""
        try:
            return await self._principals.of(context)
        except CallRefused as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, status_details(str(exc)))
            raise  # abort raises; not reached

    def _check(self, principal: Principal, request: Any) -> None:
        if self._authorizer is None:
            return
        if self._rule is None:
            self._authorizer.check_unknown(principal, "grpc", self._name)
        else:
            self._authorizer.check(principal, self._rule, request, "grpc", self._name)

    async def _check_or_abort(self, context: Any, principal: Principal, request: Any) -> None:
        try:
            self._check(principal, request)
        except PermissionDeniedError as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, status_details(exc.message))

    def unary(self, behavior: _Behavior) -> _Behavior:
        async def checked(request: Any, context: Any) -> Any:
            await self._check_or_abort(context, await self._principal(context), request)
            return await behavior(request, context)

        return checked

    def server_streaming(self, behavior: _Behavior) -> _Behavior:
        async def checked(request: Any, context: Any) -> AsyncIterator[Any]:
            await self._check_or_abort(context, await self._principal(context), request)
            async for response in behavior(request, context):
                yield response

        return checked

    def client_streaming(self, behavior: _Behavior) -> _Behavior:
        async def checked(requests: AsyncIterator[Any], context: Any) -> Any:
            principal = await self._principal(context)
            if self._authorizer is None:
                return await behavior(requests, context)
            gate = _Gate(self, principal, requests)
            await gate.first()
            if gate.refused is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, status_details(gate.refused.message))
            response = await behavior(gate, context)
            if gate.refused is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, status_details(gate.refused.message))
            return response

        return checked

    def bidirectional(self, behavior: _Behavior) -> _Behavior:
        async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            principal = await self._principal(context)
            if self._authorizer is None:
                async for response in behavior(requests, context):
                    yield response
                return
            gate = _Gate(self, principal, requests)
            async for response in behavior(gate, context):
                yield response
            if gate.refused is not None:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, status_details(gate.refused.message))

        return checked


class _Gate:
    """A call's request stream, each message checked before it is handed on; the first refused ends it."""

    def __init__(self, check: _Check, principal: Principal, requests: AsyncIterator[Any]) -> None:
        self._check = check
        self._principal = principal
        self._requests = aiter(requests)
        self._peeked: list[Any] = []
        self.refused: PermissionDeniedError | None = None

    async def first(self) -> None:
        """Read and check the first message now (before the handler starts)."""
        request = await anext(self._requests, None)
        if request is not None and self._pass(request):
            self._peeked.append(request)

    def _pass(self, request: Any) -> bool:
        try:
            self._check._check(self._principal, request)
        except PermissionDeniedError as exc:
            self.refused = exc
            return False
        return True

    def __aiter__(self) -> _Gate:
        return self

    async def __anext__(self) -> Any:
        if self._peeked:
            return self._peeked.pop()
        if self.refused is not None:
            raise StopAsyncIteration
        request = await anext(self._requests, None)
        if request is None or not self._pass(request):
            raise StopAsyncIteration
        return request
