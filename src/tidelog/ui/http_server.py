"""The broker's HTTP listener: uvicorn serving the Starlette app of :mod:`tidelog.ui.routes` on the broker's loop.

The socket is bound here, the way the other listeners bind theirs (``SO_REUSEADDR``; port 0 picks a free port,
which :attr:`HttpServer.port` then reports), and handed to uvicorn, so a port in use fails the broker's start in
one line before anything else runs (the broker checks it first with the other ports). uvicorn runs inside the
broker's event loop through its ``startup``/``main_loop``/``shutdown`` steps rather than ``serve()``, which would
take over SIGINT and SIGTERM from the broker's own controlled shutdown. Its access log is off (a scrape a second
would drown the broker's log); its own log lines go through the ``uvicorn`` loggers at warning level.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import uvicorn
from starlette.applications import Starlette

__all__ = ["HttpServer"]

log = logging.getLogger(__name__)

STOP_WITHIN = 5.0  # seconds open HTTP connections get to finish when the broker stops


class HttpServer:
    """Serves ``app`` on ``host:port`` from :meth:`start` to :meth:`stop`."""

    def __init__(self, app: Starlette, host: str, port: int, *, tls: ssl.SSLContext | None = None) -> None:
        """``tls``: serve HTTPS with this server context (for when the broker's listeners use TLS)."""
        self._app = app
        self._host = host
        self._sock = _bind(host, port)
        self.port: int = int(self._sock.getsockname()[1])
        config = uvicorn.Config(
            app,
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
