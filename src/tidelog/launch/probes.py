"""Readiness probes: async checks that a started server accepts work (a TCP connect, an HTTP health answer).

:meth:`~tidelog.launch.process.ManagedProcess.start` polls one until it passes, so nothing waits a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

__all__ = ["ReadinessProbe", "all_of", "http_get", "http_probe", "tcp_probe"]

ReadinessProbe = Callable[[], Awaitable[bool]]
"""An async check that answers ``True`` once the server accepts work; it must not block for long."""


def tcp_probe(host: str, port: int, *, timeout: float = 1.0) -> ReadinessProbe:
    """Ready once a TCP connection to ``host:port`` succeeds."""

    async def probe() -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    return probe


async def http_get(url: str, *, limit: int = 1 << 20) -> tuple[int, bytes]:
    """GET a plain-HTTP ``url`` and return ``(status, body)``; bound it with ``asyncio.timeout``.

    Health endpoints are all the harness needs, so this speaks HTTP/1.0 (the server closes the connection after
    one response and never uses chunked encoding) rather than adding an HTTP client dependency.
    """
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"http_get supports http://host:port/path URLs only, got {url!r}")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {parts.netloc}\r\nAccept: */*\r\n\r\n".encode("ascii"))
        await writer.drain()
        raw = bytearray()
        while chunk := await reader.read(65536):  # until the server closes: HTTP/1.0 framing
            raw += chunk
            if len(raw) > limit:
                raise ValueError(f"response from {url} is larger than {limit} bytes")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = bytes(raw).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise ValueError(f"not an HTTP response from {url}: {bytes(raw[:80])!r}")
    return int(status_line[1]), body


def http_probe(
    url: str, *, expect_status: int = 200, body_contains: bytes | None = None, timeout: float = 1.0
) -> ReadinessProbe:
    """Ready once ``GET url`` answers ``expect_status`` (and a body containing ``body_contains``, if given)."""

    async def probe() -> bool:
        try:
            status, body = await asyncio.wait_for(http_get(url), timeout)
        except (OSError, TimeoutError, ValueError):
            return False
        return status == expect_status and (body_contains is None or body_contains in body)

    return probe


def all_of(*probes: ReadinessProbe) -> ReadinessProbe:
    """Ready once every probe passes, checked in order (a failing one skips the rest of this round)."""

    async def probe() -> bool:
        for each in probes:
            if not await each():
                return False
        return True

    return probe
