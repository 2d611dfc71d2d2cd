"""The broker's HTTP listener: uvicorn serving the Starlette app of :mod:`tidelog.ui.routes` on the broker's loop.

The socket is bound here, the way the other listeners bind theirs (``SO_REUSEADDR``; port 0 picks a free port,
which :attr:`HttpServer.port` then reports), and handed to uvicorn, so a port in use fails the broker's start in
one line before anything else runs (the broker checks it first with the other ports). uvicorn runs inside the
broker's event loop through its ``startup``/``main_loop``/``shutdown`` steps rather than ``serve()``, which would
take over SIGINT and SIGTERM from the broker's own controlled shutdown. Its access log is off (a scrape a second
would drown the broker's log); its own log lines go through the ``uvicorn`` loggers at warning level.

**Access.** With a ``guard`` (the broker passes one when authorization is on: :mod:`tidelog.api.http_access`),
every request is first shown to it with the client's verified certificate and its ``authorization`` header; a
refusal is answered with its status and one line (401 with a ``WWW-Authenticate: Basic`` challenge). The
certificate is read from the connection's TLS session when the connection is made (uvicorn's HTTP/1.1 protocol,
subclassed to put it in the request scope as ASGI's TLS extension ``client_cert_chain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HttpGuard", "HttpServer"]

HttpGuard = Callable[[str | None, str | None, str], Awaitable[tuple[int, str] | None]]
"""``(client certificate PEM, authorization header, path)`` → None to serve the request, or (status, reason)."""

log = logging.getLogger(__name__)

STOP_WITHIN = 5.0  # seconds open HTTP connections get to finish when the broker stops


class HttpServer:
    """Serves ``app`` on ``host:port`` from :meth:`start` to :meth:`stop`."""

    def __init__(
        self,
        app: Starlette,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        guard: HttpGuard | None = None,
    ) -> None:
        """``tls``: serve HTTPS with this server context (for when the broker's listeners use TLS); ``guard``:
        check every request first (module docstring)."""
        self._app = app
        self._host = host
        self._sock = _bind(host, port)
        self.port: int = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            app if guard is None else _Guarded(app, guard),
            http=_TlsScopeProtocol if guard is not None else "auto",
            lifespan="off",
            access_log=False,
            log_level="warning",
            log_config=None,
            timeout_graceful_shutdown=int(STOP_WITHIN),
        )
        config.load()
        config.ssl = tls  # uvicorn hands it to loop.create_server with the socket
        self._server = uvicorn.Server(config)
        self._server.lifespan = config.lifespan_class(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._server.startup(sockets=[self._sock])
        self._task = asyncio.create_task(self._server.main_loop(), name="http-server")

    async def stop(self) -> None:
        """Stop accepting, let requests in progress finish (up to :data:`STOP_WITHIN`), close the socket."""
        server = self._server
        server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STOP_WITHIN + 1):
                    await server.shutdown(sockets=[self._sock])
        self._sock.close()


class _TlsScopeProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, adding the client's verified certificate to each request's scope."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        chain = [ssl.DER_cert_to_PEM_cert(der)] if der else []
        app = self.app

        async def with_certificate(scope: Any, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})["tls"] = {"client_cert_chain": chain}
            await app(scope, receive, send)

        self.app = with_certificate


class _Guarded:
    """An ASGI app that shows every HTTP request to a guard before ``app`` sees it."""

    def __init__(self, app: Starlette, guard: HttpGuard) -> None:
        self._app = app
        self._guard = guard

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        chain = scope.get("extensions", {}).get("tls", {}).get("client_cert_chain") or [None]
        authorization = next(
            (value.decode("latin-1") for key, value in scope["headers"] if key.lower() == b"authorization"), None
        )
        refused = await self._guard(chain[0], authorization, scope["path"])
        if refused is None:
            await self._app(scope, receive, send)
            return
        status, reason = refused
        headers = {"WWW-Authenticate": 'Basic realm="tidelog", charset="UTF-8"'} if status == 401 else None
        await PlainTextResponse(reason + "\n", status_code=status, headers=headers)(scope, receive, send)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
