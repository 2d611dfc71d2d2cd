"""A loopback TCP forwarder that a fault test can cut and heal: the network partition of a multi-process cluster.

Processes on one machine cannot be partitioned by unplugging a cable, and network namespaces need privileges CI
does not have. So a broker is reached through a :class:`TcpProxy` instead of directly, and the test decides when
bytes flow::

    proxy = TcpProxy("127.0.0.1", broker_wire_port)
    await proxy.start()          # clients connect to proxy.port
    proxy.cut()                  # every open connection is reset; new ones are black-holed
    proxy.heal()                 # new connections are forwarded again
    await proxy.close()

While cut, a new connection is accepted and then *black-holed* by default: its bytes are read and dropped and
nothing ever comes back, which is what a peer behind a dead link sees (its requests time out; it does not get a
quick "connection refused" that would make failure detection look easier than it is). ``cut(refuse=True)``
closes new connections at once instead. Connections opened while cut stay dead after :meth:`TcpProxy.heal`
(they are closed then), as TCP connections across a real partition would be.

One connection is two pump tasks (client → target and target → client), each ending when its side closes.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

__all__ = ["TcpProxy"]

_CHUNK = 256 * 1024
_CONNECT_TIMEOUT = 5.0


class _Link:
    """One proxied connection: the client's streams, the target's (once connected), and its pump tasks."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.target: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        """Reset both sides at once (no orderly FIN), as a link that just died would look to both ends."""
        for writer in (self.client, self.target):
            if writer is not None:
                writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class TcpProxy:
    """Forwards connections on ``host:port`` (``port`` 0: a free one) to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self._requested_port = port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._holes: set[asyncio.StreamWriter] = set()  # connections accepted while cut
        self._cut = False
        self._refuse = False
        self.connections_total = 0  # accepted, forwarded or not: lets tests see that a peer tried

    # ---- lifecycle ----

    async def start(self) -> None:
        """Listen; a no-op when already listening."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._accept, self.host, self._requested_port)

    async def close(self) -> None:
        """Stop listening and drop every connection; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self._drop_all()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), _CONNECT_TIMEOUT)

    async def __aenter__(self) -> TcpProxy:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The port clients connect to (known once started, or when given explicitly)."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        if self._requested_port:
            return self._requested_port
        raise RuntimeError("the proxy's port is chosen when it starts")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def open_connections(self) -> int:
        """Connections currently forwarded (black-holed ones excluded)."""
        return len(self._links)

    # ---- faults ----

    def cut(self, *, refuse: bool = False) -> None:
        """Reset every forwarded connection; black-hole new ones (``refuse``: close them at once instead)."""
        self._cut = True
        self._refuse = refuse
        for link in list(self._links):
            link.abort()
        self._links.clear()

    def heal(self) -> None:
        """Forward new connections again; connections black-holed during the cut are closed now."""
        self._cut = False
        for writer in list(self._holes):
            writer.transport.abort()
        self._holes.clear()

    def _drop_all(self) -> None:
        for link in list(self._links):
            link.abort()
        self._links.clear()
        for writer in list(self._holes):
            writer.transport.abort()
        self._holes.clear()

    # ---- forwarding ----

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        if self._cut:
            await self._black_hole(reader, writer)
            return
        link = _Link(writer)
        self._links.add(link)
        try:
            try:
                target_reader, target_writer = await asyncio.wait_for(
                    asyncio.open_connection(self.target_host, self.target_port), _CONNECT_TIMEOUT
                )
            except (OSError, TimeoutError):
                writer.transport.abort()  # the target is down: the client sees a reset, as it would directly
                return
            link.target = target_writer
            if link not in self._links:  # cut while we were connecting
                link.abort()
                return
            link.tasks = [
                asyncio.create_task(_pump(reader, target_writer), name="proxy-upstream"),
                asyncio.create_task(_pump(target_reader, writer), name="proxy-downstream"),
            ]
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            for each in (writer, link.target):
                if each is not None:
                    each.transport.abort()

    async def _black_hole(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refuse:
            writer.transport.abort()
            return
        self._holes.add(writer)
        try:
            while await reader.read(_CHUNK):  # ends when the client closes or heal()/close() aborts it
                pass
        except (ConnectionError, OSError):
            pass
        finally:
            self._holes.discard(writer)
            writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close the other side so a client's FIN reaches the target."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()
