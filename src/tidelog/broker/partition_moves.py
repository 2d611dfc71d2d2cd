"""Moving replicas between brokers, as requested over the wire: ``tidelog partition reassign`` and ``tidelog broker
decommission``.

The controller's :class:`~tidelog.metadata.reassignment.Reassigner` does the work (started, completed and
cancelled reassignments live in the partition records, so they outlast any controller). This broker forwards
the requests that write to the controller (in process when it is the controller), and answers from its own
metadata the ones that only read: a proposed plan (``--generate``) and how far reassignments are
(``--verify``, decommission progress).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidelog.broker.controller_link import call_controller
from tidelog.metadata import reassignment_plans as plans
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.reassignment import Move, Reassigner
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import InvalidArgumentError, UnavailableError, UnknownStreamError
from tidelog.protocol.reassign_messages import (
    DecommissionBrokerRequest,
    DecommissionBrokerResponse,
    ListReassignmentsRequest,
    ListReassignmentsResponse,
    PartitionMove,
    ReassignmentStatus,
    ReassignPartitionsRequest,
    ReassignPartitionsResponse,
)

if TYPE_CHECKING:
    from tidelog.broker.controller_link import ControllerLink

_TIMEOUT = 10.0


class PartitionMoves:
    """Reassignments and decommissions, forwarded to the controller; plans and progress from the mirror."""

    def __init__(
        self, broker_id: str, mirror: MetadataMirror, link: ControllerLink | None, reassigner: Reassigner | None
    ) -> None:
        self._broker_id = broker_id
        self._mirror = mirror
        self._link = link
        self._reassigner = reassigner

    async def reassign(self, request: ReassignPartitionsRequest) -> ReassignPartitionsResponse:
        """Propose (``generate``), start, or cancel reassignments."""
        if request.generate:
            return ReassignPartitionsResponse(self.generate(request.brokers, request.streams))
        if not request.partitions:
            raise InvalidArgumentError("the plan names no partition")
        seen: set[tuple[str, int]] = set()
        for p in request.partitions:
            if (p.stream, p.partition) in seen:
                raise InvalidArgumentError(f"the plan names {p.stream}/{p.partition} twice")
            seen.add((p.stream, p.partition))
        reassigner = self._local(request.forwarded)
        if reassigner is None:
            assert self._link is not None
            answer = await self._link.forward(_forwarded(request), _TIMEOUT)
            assert isinstance(answer, ReassignPartitionsResponse)
            moves = answer.moves
        elif request.cancel:
            moves = _wire(
                await call_controller(reassigner.cancel([(p.stream, p.partition) for p in request.partitions]))
            )
        else:
            targets = [(p.stream, p.partition, tuple(p.replicas)) for p in request.partitions]
            moves = _wire(await call_controller(reassigner.execute(targets, request.throttle_bps)))
        await self._settled(moves, cancel=request.cancel)
        return ReassignPartitionsResponse(moves)

    async def decommission(self, request: DecommissionBrokerRequest) -> DecommissionBrokerResponse:
        """Start moving every replica off a broker."""
        reassigner = self._local(request.forwarded)
        if reassigner is None:
            assert self._link is not None
            forwarded = DecommissionBrokerRequest(request.broker_id, request.throttle_bps, request.timeout_ms, True)
            answer = await self._link.forward(forwarded, _TIMEOUT)
            assert isinstance(answer, DecommissionBrokerResponse)
            moves = answer.moves
        else:
            moves = _wire(await call_controller(reassigner.decommission(request.broker_id, request.throttle_bps)))
        await self._settled(tuple(m for m in moves if not m.note), cancel=False)
        return DecommissionBrokerResponse(moves)

    def generate(self, brokers: Sequence[str], streams: Sequence[str]) -> tuple[PartitionMove, ...]:
        """A plan that keeps ``streams``' replicas (every stream's when empty) on ``brokers`` only."""
        snap = self._mirror.snapshot
        if not brokers:
            raise InvalidArgumentError("--generate needs the brokers to place replicas on (--brokers a,b,c)")
        if unknown := sorted(set(brokers) - snap.brokers.keys()):
            raise InvalidArgumentError(
                f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a live broker "
                f"(live: {', '.join(sorted(snap.brokers))})"
            )
        for name in streams:
            if snap.stream(name) is None:
                raise UnknownStreamError(f"no stream named {name!r}")
        wanted = set(streams) if streams else None
        holding = {b for p in snap.partitions.values() for b in p.replicas}
        moves, stuck = plans.plan_off(snap, holding - set(brokers), brokers, streams=wanted)
        out = [PartitionMove(r.stream, r.id, r.replicas, t) for r, t in moves]
        out += [PartitionMove(r.stream, r.id, r.replicas, r.replicas, note) for r, note in stuck]
        return tuple(sorted(out, key=lambda m: (m.stream, m.partition)))

    def list(self, request: ListReassignmentsRequest) -> ListReassignmentsResponse:
        """How far reassignments are (the request says which)."""
        snap = self._mirror.snapshot
        statuses: list[ReassignmentStatus] = []
        if request.partitions:
            for p in request.partitions:
                statuses.append(_status(snap, snap.partition(p.stream, p.partition), p.stream, p.partition, p.replicas))
        else:
            for key in sorted(snap.partitions):
                record = snap.partitions[key]
                if record.reassign_to:
                    statuses.append(_status(snap, record, record.stream, record.id, record.reassign_to))
                elif request.broker_id and request.broker_id in record.replicas:  # not moving off it (yet)
                    statuses.append(
                        ReassignmentStatus(
                            record.stream,
                            record.id,
                            record.replicas,
                            record.replicas,
                            record.isr,
                            record.leader,
                            "waiting",
                            f"not moving: its replica on {request.broker_id} stays until it is reassigned",
                        )
                    )
        on = sum(1 for p in snap.partitions.values() if request.broker_id and request.broker_id in p.replicas)
        return ListReassignmentsResponse(tuple(statuses), on)

    def _local(self, forwarded: bool) -> Reassigner | None:
        """The local controller's reassigner, or None to forward."""
        if self._link is None or self._reassigner is None:
            raise UnavailableError("this broker runs without a controller: replicas cannot move")
        if self._link.is_local:
            return self._reassigner
        if forwarded:
            raise UnavailableError(
                f"broker {self._broker_id} is not the controller (the controller is {self._link.controller_id})"
            )
        return None

    async def _settled(self, moves: Sequence[PartitionMove], *, cancel: bool) -> None:
        """Wait until this broker's mirror shows ``moves`` started (or undone), so that a ``--verify`` sent to it
        next sees them."""

        def shows(snap: MetadataSnapshot) -> bool:
            for move in moves:
                record = snap.partition(move.stream, move.partition)
                if record is None:
                    continue
                if cancel and record.reassign_to:
                    return False
                moved = move.proposed in (record.reassign_to, record.replicas)
                if not cancel and move.proposed != move.current and not moved:
                    return False
            return True

        try:
            await self._mirror.wait_for(shows, _TIMEOUT)
        except TimeoutError:
            raise UnavailableError("timed out waiting for the metadata to show the reassignment") from None


def _wire(moves: Sequence[Move]) -> tuple[PartitionMove, ...]:
    return tuple(PartitionMove(m.stream, m.partition, m.before, m.after, m.note) for m in moves)


def _forwarded(request: ReassignPartitionsRequest) -> ReassignPartitionsRequest:
    return ReassignPartitionsRequest(
        request.partitions,
        request.throttle_bps,
        request.cancel,
        request.generate,
        request.brokers,
        request.streams,
        request.timeout_ms,
        True,
    )


def _status(
    snap: MetadataSnapshot, record: PartitionRecord | None, stream: str, pid: int, target: Sequence[str]
) -> ReassignmentStatus:
    wanted = tuple(target)
    progress = plans.progress(record, wanted, snap.brokers.keys(), plans.min_isr_of(snap.stream(stream)))
    if record is None:
        return ReassignmentStatus(stream, pid, (), wanted, (), "", progress.state, progress.detail)
    return ReassignmentStatus(
        stream,
        pid,
        record.replicas,
        wanted,
        record.isr,
        record.leader,
        progress.state,
        progress.detail,
        record.throttle_bps,
    )
