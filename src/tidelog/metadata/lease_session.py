"""An etcd lease kept alive while its holder runs, that says when it is gone (etcd's ``concurrency.Session``).

Keys written with the session's lease live exactly as long as the lease: when the holder dies, is paused, or is
cut off from etcd for longer than the TTL, etcd deletes them on its own, atomically, and every watcher sees the
deletion. A background task refreshes the lease a third of its TTL after etcd last confirmed it, through the
injected clock (:class:`RenewalSchedule`): a refresh that fails or hangs is retried a few times a second, not a
third of the TTL later, and one that comes late because the event loop was busy is logged, so a lease survives
a busy moment or a lost packet with two thirds of its TTL to spare.

A session only ever moves from alive to lost. It is lost when etcd answers a refresh with a TTL of zero (etcd's
way of saying "no such lease": it expired, or somebody revoked it) or when an operation that used the lease was
refused with "requested lease not found" (:meth:`LeaseSession.mark_lost`). A failed refresh, a timeout or a
refused connection does *not* lose the session: etcd may well still hold the lease, and the keys are what count.
A lost session stays lost; its holder opens a new one.

Nothing here is relied on for safety. "My refresh succeeded a moment ago" says nothing about whether the lease
is still alive now, so the controller never acts on it; see :mod:`tidelog.metadata.fenced_writer`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tidelog.clock import Clock, SystemClock
from tidelog.launch.reachability import ReachabilityLog, describe_failure, etcd_address

log = logging.getLogger(__name__)

LEASE_NOT_FOUND = "requested lease not found"
"""What etcd says, in the error's text, about a put or transaction that names a lease it no longer has."""


RETRY_SECONDS = 0.25
"""How soon a failed or timed-out lease refresh is tried again (a tenth of the TTL when that is sooner)."""


class RenewalSchedule:
    """When to refresh a lease of ``ttl`` seconds, from when etcd last confirmed it (times in seconds)."""

    __slots__ = ("_confirmed", "_failed", "_ttl")

    def __init__(self, ttl: float, now: float) -> None:
        self._ttl = ttl
        self._confirmed = now  # when the last refresh that etcd answered was sent
        self._failed = False  # the last refresh failed: retry soon

    @property
    def timeout(self) -> float:
        """How long one refresh may take before it counts as failed (it is then retried)."""
        return max(self._ttl / 3, RETRY_SECONDS)

    def delay(self, now: float) -> float:
        """Seconds to wait before the next refresh."""
        if self._failed:
            return min(RETRY_SECONDS, self._ttl / 10)
        return max(self._confirmed + self._ttl / 3 - now, 0.0)

    def confirmed(self, sent: float) -> None:
        """etcd answered the refresh sent at ``sent``: the lease held its full TTL from then."""
        self._confirmed = sent
        self._failed = False

    def failed(self) -> None:
        self._failed = True

    def late_by(self, now: float) -> float:
        """How far past its time a refresh starting at ``now`` is; more than a sixth of the TTL is worth a
        warning (the event loop was busy that long)."""
        return now - (self._confirmed + self._ttl / 3) if not self._failed else 0.0


def is_lease_not_found(error: BaseException) -> bool:
    """Whether ``error`` is etcd refusing an operation because the lease it named is gone."""
    return LEASE_NOT_FOUND in str(error)


class LeaseSession:
    """One etcd lease and the task that keeps it alive."""

    def __init__(self, client: Any, ttl_seconds: int, *, clock: Clock | None = None, name: str = "lease") -> None:
        if ttl_seconds < 1:
            raise ValueError(f"ttl_seconds must be at least 1, got {ttl_seconds}")
        self._client = client
        self._requested_ttl = ttl_seconds
        self._clock = clock or SystemClock()
        self._name = name
        self._lease: Any = None  # the aetcd Lease; None until open()
        self._ttl = ttl_seconds  # as granted: etcd raises TTLs below its minimum
        self._keepalive: asyncio.Task[None] | None = None
        self._closing = False  # ends the keep-alive loop even if a library swallows its cancellation
        self._lost = asyncio.Event()

    @property
    def id(self) -> int:
        """The lease id, for ``put(..., lease=...)``."""
        if self._lease is None:
            raise RuntimeError("the session is not open")
        return int(self._lease.id)

    @property
    def ttl(self) -> int:
        """The TTL etcd granted, in seconds."""
        return self._ttl

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        """Return once the session is lost."""
        await self._lost.wait()

    async def open(self) -> None:
        """Grant the lease and start keeping it alive."""
        if self._lease is not None:
            raise RuntimeError("the session is already open")
        self._lease = await self._client.lease(self._requested_ttl)
        self._ttl = int(self._lease.ttl) or self._requested_ttl
        self._keepalive = asyncio.create_task(self._keep_alive(), name=f"{self._name}-keepalive")

    def mark_lost(self) -> None:
        """Record that etcd no longer has the lease (an operation naming it was refused)."""
        if not self._lost.is_set():
            log.info("%s: lease %x is gone", self._name, self._lease.id if self._lease is not None else 0)
            self._lost.set()

    async def close(self, *, revoke: bool = True) -> None:
        """Stop keeping the lease alive and, unless ``revoke`` is false, revoke it: its keys go at once."""
        self._closing = True
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.wait({self._keepalive})  # not `await`: a cancellation of close() itself must propagate
            self._keepalive = None
        if revoke and self._lease is not None and not self.lost:
            try:
                await self._lease.revoke()
            except Exception as exc:  # unreachable etcd: the lease will expire by itself
                log.debug("%s: could not revoke lease %x", self._name, self._lease.id, exc_info=True)
                log.warning(
                    "%s: could not revoke lease %x (%s); it expires after its TTL",
                    self._name,
                    self._lease.id,
                    describe_failure(exc),
                )
        self._lost.set()

    async def _keep_alive(self) -> None:
        schedule = RenewalSchedule(self._ttl, self._now())
        reach = ReachabilityLog(log, "etcd", etcd_address(self._client))
        while not self._closing:
            await self._clock.sleep(schedule.delay(self._now()))
            sent = self._now()
            if schedule.late_by(sent) > self._ttl / 6:
                log.warning(
                    "%s: lease %x refreshed %.1f s late (the event loop was busy)",
                    self._name,
                    self._lease.id,
                    schedule.late_by(sent),
                )
            try:
                async with asyncio.timeout(schedule.timeout):
                    reply = await self._lease.refresh()
            except Exception as exc:  # etcd briefly unreachable: the lease may well still be alive, keep trying
                log.debug("%s: could not refresh lease %x", self._name, self._lease.id, exc_info=True)
                reach.unreachable(describe_failure(exc), f"{self._name}: refreshing its lease again soon")
                schedule.failed()
                continue
            reach.reachable(f"{self._name}: lease {self._lease.id:x} refreshed")
            if reply is None or int(reply.TTL) <= 0:
                self.mark_lost()
                return
            schedule.confirmed(sent)

    def _now(self) -> float:
        return self._clock.monotonic_ns() / 1e9
