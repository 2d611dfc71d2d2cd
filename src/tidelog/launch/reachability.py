"""Waiting for a dependency (NATS, etcd) that does not answer: retry with a capped back-off, and say so once.

A broker started before its NATS servers or its etcd, or cut off from them, must neither give up nor flood its
log: an operator needs one line when the state changes ("etcd at http://10.0.0.5:2379 is unreachable
(connection refused); retrying with back-off up to 5s") and one when it recovers, not a traceback twice a
second. :class:`ReachabilityLog` remembers the last state it reported and logs only changes (a repeat of the
same failure goes to DEBUG); :func:`retry_until_reachable` runs one attempt after another with the back-off,
reporting through it, and is cancelled like any coroutine (SIGTERM during start-up cancels it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = [
    "BACKOFF_CAP",
    "ReachabilityLog",
    "describe_failure",
    "etcd_address",
    "retry_until_reachable",
    "wait_for_etcd",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

BACKOFF_FIRST = 0.5
BACKOFF_CAP = 5.0
"""Seconds between two attempts at most: the back-off doubles from :data:`BACKOFF_FIRST` up to this."""


def describe_failure(exc: BaseException) -> str:
    """A short, one-line reason for a failed attempt (no traceback, no class path)."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    text = " ".join(str(exc).split()) or type(exc).__name__
    if text.lower().startswith("nats: "):
        text = text[len("nats: ") :]
    return text if len(text) <= 200 else text[:197] + "..."


def etcd_address(client: Any) -> str:
    """``host:port`` of an ``aetcd.Client``, for messages (empty if it does not say)."""
    host, port = getattr(client, "_host", None), getattr(client, "_port", None)
    return f"{host}:{port}" if host is not None and port is not None else ""


class ReachabilityLog:
    """Logs whether ``what`` at ``address`` answers, once per change of state."""

    def __init__(self, logger: logging.Logger, what: str, address: str) -> None:
        self._log = logger
        self.what = what
        self.address = address
        self._name = f"{what} at {address}" if address else what
        self._failing: str | None = None  # the reason last reported, None while reachable

    @property
    def failing(self) -> bool:
        return self._failing is not None

    def unreachable(self, reason: str, next_step: str) -> None:
        """Report a failed attempt: at WARNING when the reason is new, at DEBUG when it repeats."""
        if reason == self._failing:
            self._log.debug("%s: still unreachable (%s)", self._name, reason)
            return
        self._failing = reason
        self._log.warning("%s is unreachable (%s); %s", self._name, reason, next_step)

    def reachable(self, detail: str = "") -> None:
        """Report success; logged only after a reported failure."""
        if self._failing is None:
            return
        self._failing = None
        suffix = f" ({detail})" if detail else ""
        self._log.warning("%s is reachable again%s", self._name, suffix)


async def retry_until_reachable(
    attempt: Callable[[], Awaitable[T]],
    report: ReachabilityLog,
    *,
    first: float = BACKOFF_FIRST,
    cap: float = BACKOFF_CAP,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
) -> T:
    """Await ``attempt()`` until it succeeds, sleeping ``first`` seconds after the first failure, doubling up to
    ``cap``. Failures of the kinds in ``retry_on`` are reported through ``report``; others propagate."""
    wait = first
    while True:
        try:
            result = await attempt()
        except retry_on as exc:
            report.unreachable(describe_failure(exc), f"retrying with back-off up to {cap:g}s")
            await asyncio.sleep(wait)
            wait = min(wait * 2, cap)
            continue
        report.reachable()
        return result


async def wait_for_etcd(client: Any, address: str, *, attempt_within: float = 3.0) -> None:
    """Return once the etcd behind ``client`` (an ``aetcd.Client``) answers a status request, retrying as
    :func:`retry_until_reachable` does. The client connects lazily, so this is the first real round trip; any
    failure (refused, timed out, unavailable, not authorised) is retried and logged once per change."""

    async def status() -> None:
        async with asyncio.timeout(attempt_within):
            await client.status()

    report = ReachabilityLog(log, "etcd", address)
    await retry_until_reachable(status, report, retry_on=(Exception,))
