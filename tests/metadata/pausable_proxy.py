"""A TCP relay between one etcd client and etcd that can stop passing bytes: a broker cut off from etcd.

While paused, the relay holds whatever either side sends (nothing is lost or reordered, the connections stay up),
so to the client etcd looks frozen and to etcd the client looks frozen: keep-alives go unanswered and the lease
expires, watch events wait, and a request sent meanwhile reaches etcd only on :meth:`PausableProxy.resume`, with
the client still acting on what it knew before. That is the state of a controller paused past its lease (or
partitioned from etcd) at the moment it wakes up, without depending on which of its tasks runs first.
"""

from __future__ import annotations

import asyncio
import contextlib


class PausableProxy:
    """Relays 127.0.0.1:``port`` to ``target``; :meth:`pause` and :meth:`resume` stop and restart the flow."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def pause(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        self._writers += [client_writer, upstream_writer]
        for reader, writer in ((client_reader, upstream_writer), (upstream_reader, client_writer)):
            pump = asyncio.create_task(self._pump(reader, writer))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._open.wait()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
