"""This broker's way to the controller, wherever the controller runs.

Every metadata change is made by the controller (its writes are fenced by the controller epoch). A broker that
is the controller calls it in process; any other broker sends the request over the wire protocol to the broker
the election names, marked ``forwarded`` so that a receiver which has just lost the election answers
"not the controller" instead of forwarding again (a request never travels in circles). A request that finds
no controller (mid-election) or a stale one is retried, with a short backoff, until its timeout.

A dead controller is noticed the way a dead leader is: when the controller's wire port *refuses* connections
(no process listens there; a paused one would still accept), any broker revokes the controller key's lease and
the dead broker's registration lease. A new controller is then elected at once and fails the dead broker's
partitions over, instead of everyone waiting for the leases to lapse. Wrong judgement cannot do harm: a live
broker re-registers, and a live controller's next fenced write simply fails and it campaigns again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from tidelog.broker.peers import Peers
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.broker_probe import probe_refused
from tidelog.metadata.controller_plans import AlterIsrError
from tidelog.metadata.fenced_writer import ControllerError
from tidelog.metadata.lease_session import is_lease_not_found
from tidelog.metadata.records import Keys, PartitionRecord, decode_broker, decode_controller
from tidelog.metadata.suspension import HeadRejection, SuspensionError
from tidelog.protocol.connection import ConnectionClosedError
from tidelog.protocol.errors import (
    FencedLeaderEpochError,
    InvalidArgumentError,
    TidelogError,
    UnavailableError,
    UnknownPartitionError,
)
from tidelog.protocol.messages import Header
from tidelog.protocol.peer_messages import (
    AlterIsrRequest,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    ReportUnreachableRequest,
    SuspendPartitionRequest,
)

PROBE_TIMEOUT = 0.5

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8)


def as_client_error(exc: Exception) -> Exception:
    """The wire error for a controller-side failure: not being (or no longer being) the controller is
    retriable elsewhere; a refused ISR change says why, retriable when the controller's view may just lag."""
    if isinstance(exc, AlterIsrError):
        if exc.retriable:
            return UnavailableError(str(exc))
        if exc.reason.name in ("STALE_EPOCH", "NOT_LEADER"):
            return FencedLeaderEpochError(str(exc))
        return InvalidArgumentError(str(exc))
    if isinstance(exc, SuspensionError):
        if exc.retriable:
            return UnavailableError(exc.detail)
        if exc.reason in (HeadRejection.STALE_EPOCH, HeadRejection.NOT_LEADER):
            return FencedLeaderEpochError(exc.detail)
        if exc.reason is HeadRejection.UNKNOWN_PARTITION:
            return UnknownPartitionError(exc.detail)
        return InvalidArgumentError(exc.detail)
    if isinstance(exc, ControllerError):
        return UnavailableError(f"not the controller: {exc}")
    return exc


async def call_controller(call: Awaitable[T]) -> T:
    """Await a call into the local controller, with its errors translated by :func:`as_client_error`."""
    try:
        return await call
    except (AlterIsrError, ControllerError) as exc:
        raise as_client_error(exc) from exc


class Election(Protocol):
    @property
    def is_controller(self) -> bool: ...

    @property
    def controller_id(self) -> str | None: ...


class ControllerLink:
    """Calls the controller: locally when this broker holds the term, over the wire otherwise."""

    def __init__(
        self,
        broker_id: str,
        election: Election,
        controller: Any,
        peers: Peers,
        *,
        etcd: Any = None,
        keys: Keys | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.broker_id = broker_id
        self._clock: Clock = clock or SystemClock()
        self._election = election
        self.controller = controller  # tidelog.metadata.controller.Controller; usable while elected
        self._peers = peers
        self._etcd = etcd  # for revoking a dead controller's leases (None: never)
        self._keys = keys or Keys()

    @property
    def is_local(self) -> bool:
        """This broker is the controller and its controller duties have started (the election turns true a
        moment before the controller has taken over; until then requests are retried)."""
        return bool(self.controller.active)

    @property
    def controller_id(self) -> str | None:
        return self._election.controller_id

    async def _retrying(self, what: str, timeout: float, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt`` until it succeeds, a non-retriable error, or ``timeout``."""
        deadline = self._clock.monotonic_ns() + int(timeout * 1e9)
        for tries in range(1_000):
            try:
                return await attempt()
            except TidelogError as exc:
                if not exc.retriable:
                    raise
                failure: Exception = exc
            except (OSError, ConnectionError) as exc:
                failure = exc
            delay = RETRY_DELAYS[min(tries, len(RETRY_DELAYS) - 1)]
            if self._clock.monotonic_ns() + int(delay * 1e9) >= deadline:
                raise UnavailableError(f"could not {what} within {timeout:.1f}s: {failure}")
            await self._clock.sleep(delay)
        raise UnavailableError(f"could not {what}")  # pragma: no cover - bounded above by the deadline

    def _remote(self) -> str:
        """The broker to send a forwarded request to. That is this broker itself when it became the controller
        while the request was being retried: the request then arrives here marked ``forwarded`` and is served
        by the local controller, so one retry loop serves every caller."""
        controller = self._election.controller_id
        if controller is None:
            raise UnavailableError("no controller is elected right now")
        if controller == self.broker_id and not self.is_local:
            if self._election.is_controller:
                raise UnavailableError("this broker is becoming the controller")
            raise UnavailableError(
                f"the controller key still names broker {self.broker_id} on an earlier lease (a previous run of "
                "this broker); it is free once that lease expires"
            )
        return controller

    async def forward(self, header: Header, timeout: float) -> Header:
        """Send an administrative request on to the controller and wait for its answer (returned)."""

        async def attempt() -> Header:
            return (await self._peers.request(self._remote(), header, timeout=timeout)).header

        return await self._retrying(f"reach the controller for {type(header).__name__}", timeout, attempt)

    async def alter_isr(self, record: PartitionRecord, isr: tuple[str, ...], timeout: float = 5.0) -> None:
        """Ask for ``record``'s ISR to become ``isr`` (this broker leads it at ``record.leader_epoch``)."""

        async def attempt() -> None:
            if self.is_local:
                await call_controller(
                    self.controller.alter_isr(record.stream, record.id, self.broker_id, record.leader_epoch, isr)
                )
                return
            request = AlterIsrRequest(record.stream, record.id, self.broker_id, record.leader_epoch, isr)
            await self._peers.request(self._remote(), request, timeout=timeout)

        await self._retrying(f"change the ISR of {record.stream}/{record.id}", timeout, attempt)

    async def suspend_partition(self, record: PartitionRecord, reason: str, timeout: float = 5.0) -> None:
        """Have the controller record that this broker, leading ``record``, suspended appends on ``reason``."""

        async def attempt() -> None:
            if self.is_local:
                await call_controller(
                    self.controller.suspend_partition(
                        record.stream, record.id, self.broker_id, record.leader_epoch, reason
                    )
                )
                return
            request = SuspendPartitionRequest(record.stream, record.id, self.broker_id, record.leader_epoch, reason)
            await self._peers.request(self._remote(), request, timeout=timeout)

        await self._retrying(f"record the suspension of {record.stream}/{record.id}", timeout, attempt)

    async def report_unreachable(self, broker_id: str) -> None:
        """Tell the controller this broker cannot connect to ``broker_id`` (best effort, never raises)."""
        try:
            if self.is_local:
                await self.controller.report_unreachable(self.broker_id, broker_id)
                return
            controller = self._remote()
            if controller == broker_id:  # the unreachable leader is the controller itself
                await self.check_controller(controller)
                return
            try:
                request = ReportUnreachableRequest(self.broker_id, broker_id)
                await self._peers.request(controller, request, timeout=2.0)
            except ConnectionClosedError:
                await self.check_controller(controller)
        except Exception as exc:
            log.debug("could not report %s unreachable: %s", broker_id, exc)

    async def check_controller(self, controller_id: str) -> bool:
        """If ``controller_id``'s wire port refuses connections, revoke its controller and broker leases (see
        the module docstring); True when something was revoked."""
        if self._etcd is None:
            return False
        record = self._peers.broker_record(controller_id)
        if record is None or await probe_refused(record, PROBE_TIMEOUT) is not None:
            return False
        revoked = False
        held = await self._etcd.get(self._keys.controller())
        if held is not None and held.lease and decode_controller(bytes(held.value)).broker_id == controller_id:
            revoked |= await self._revoke(int(held.lease))
        registered = await self._etcd.get(self._keys.broker(controller_id))
        if registered is not None and registered.lease and decode_broker(bytes(registered.value)) == record:
            revoked |= await self._revoke(int(registered.lease))
        if revoked:
            log.warning(
                "controller %s refused connections on %s:%d; revoked its leases",
                controller_id,
                record.host,
                record.wire_port,
            )
        return revoked

    async def _revoke(self, lease: int) -> bool:
        try:
            await self._etcd.revoke_lease(lease)
        except Exception as error:
            if not is_lease_not_found(error):
                raise
            return False
        return True

    async def controlled_shutdown(self, timeout: float) -> int:
        """Ask the controller to move this broker's leaderships away; the partitions it still leads."""

        async def attempt() -> int:
            if self.is_local:
                return int(await call_controller(self.controller.controlled_shutdown(self.broker_id)))
            response = await self._peers.request(
                self._remote(), ControlledShutdownRequest(self.broker_id), timeout=timeout
            )
            header = response.header
            assert isinstance(header, ControlledShutdownResponse)
            return header.remaining

        return await self._retrying("hand leadership off", timeout, attempt)
