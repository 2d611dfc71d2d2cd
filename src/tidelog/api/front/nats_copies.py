"""A front's NATS copies on a connection of its own: ready-made ``HPUB`` commands, a run's copies in one write.

On the broker a stored message's copy goes out on the target ingest's own NATS connection
(:mod:`tidelog.broker.ingest.copies`); a front has no ingest, and nats-py builds and queues each message in
Python, 20–40 µs per copy measured in a front. :class:`RawCopies` is a plain NATS client connection that only
publishes (``echo`` off, no subscriptions): :meth:`RawCopies.publish_copy` takes the command
:func:`~tidelog.broker.ingest.copies.copy_command` built, and everything sent in one turn of the event loop leaves
in one write. It answers the server's PINGs and nothing else.

It is used only while it is connected and the command fits the server's ``max_payload``; otherwise
:meth:`~RawCopies.publish_copy` answers False and the copy goes through nats-py, as on a broker whose ingest
connection is down. It is not used at all when NATS needs TLS or authentication (those go through nats-py, which
does them): a connection that finds the server asking for either closes at once. A lost connection is dialled again
after :data:`RECONNECT_DELAY`; copies written into a connection that then breaks are lost, as the ingest's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

RECONNECT_DELAY = 1.0
CONNECT_TIMEOUT = 5.0
_CONNECT = {
    "verbose": False,
    "pedantic": False,
    "tls_required": False,
    "name": "tidelog-front-copies",
    "lang": "python",
    "version": "0",
    "protocol": 1,
    "echo": False,
    "headers": True,
    "no_responders": False,
}


class RawCopies:
    """One publishing NATS connection (module docstring)."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = urls
        self._writer: asyncio.StreamWriter | None = None
        self._max_payload = 0
        self._out: list[bytes] = []
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="front-nats-copies")

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._drop()

    def publish_copy(self, command: bytes) -> bool:
        """Queue ``command`` for this turn's write; False when not connected or above ``max_payload``."""
        writer = self._writer
        if writer is None or writer.is_closing() or len(command) > self._max_payload:
            return False
        if not self._out:
            asyncio.get_running_loop().call_soon(self._write_out)
        self._out.append(command)
        return True

    def _write_out(self) -> None:
        out, self._out = self._out, []
        writer = self._writer
        if writer is not None and out and not writer.is_closing():
            writer.write(b"".join(out))

    def _drop(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    async def _run(self) -> None:
        while not self._closing:
            try:
                reader = await self._connect()
                await self._serve(reader)
            except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.debug("the front's NATS copy connection: %r", exc)
            finally:
                self._drop()
            await asyncio.sleep(RECONNECT_DELAY)

    async def _connect(self) -> asyncio.StreamReader:
        for url in self._urls:
            parts = urlsplit(url)
            if parts.scheme not in ("nats", "") or parts.username or parts.password:
                continue
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    reader, writer = await asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 4222)
                    info = await reader.readline()
                    if not info.startswith(b"INFO "):
                        raise ValueError(f"expected INFO from {url}, got {info[:40]!r}")
                    details = json.loads(info[5:])
                    if details.get("tls_required") or details.get("auth_required") or not details.get("headers"):
                        writer.close()
                        raise ValueError(f"{url} needs TLS or authentication, or has no headers")
                    writer.write(b"CONNECT " + json.dumps(_CONNECT).encode() + b"\r\nPING\r\n")
                    while (line := await reader.readline()) != b"PONG\r\n":
                        if not line or line.startswith(b"-ERR"):
                            writer.close()
                            raise ValueError(f"{url} refused the connection: {line.strip()!r}")
            except (OSError, TimeoutError) as exc:
                log.debug("cannot reach %s for NATS copies: %r", url, exc)
                continue
            self._max_payload = int(details.get("max_payload", 1024 * 1024))
            self._writer = writer
            return reader
        raise OSError("no NATS server took the front's copy connection")

    async def _serve(self, reader: asyncio.StreamReader) -> None:
        """Answer PINGs until the connection ends."""
        while line := await reader.readline():
            if line == b"PING\r\n" and self._writer is not None:
                self._writer.write(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                log.warning("NATS closed the front's copy connection: %s", line.strip().decode(errors="replace"))
                return
