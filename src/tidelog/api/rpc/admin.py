"""The ``tidelog.v1.Admin`` RPCs: reshaping a running cluster from clients in other languages (issue 22).

Each RPC is a wire op in another framing, and goes through the very objects the wire handlers
(:mod:`tidelog.api.wire.admin`) call: :class:`~tidelog.broker.stream_reshape.StreamReshape` for AddPartitions,
AlterStream and ElectPreferredLeaders, :class:`~tidelog.broker.partition_moves.PartitionMoves` for the
reassignment calls and the decommission, with the wire's own request headers. So validation, the forwarding to
the controller, the fenced etcd writes and the wait until this broker's mirror shows the change are the wire
path's, and a refusal reads the same on both. What is here is only translation: proto messages to those headers
and back, settings parsed by the wire's :func:`~tidelog.api.wire.admin.setting_changes`, and the call's deadline
as the bound the wire takes from ``timeout_ms``.

Errors are raised; the servicer (:mod:`tidelog.api.rpc.service`) turns them into gRPC statuses through the one
error table. Authorization happens before any of this runs, by the rules of
:data:`~tidelog.api.access_table.GRPC_ACCESS` (the wire ops' rules).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

from tidelog.api.wire.admin import moves_of, reshape_of, setting_changes
from tidelog.broker.context import BrokerContext
from tidelog.protocol._gen.tidelog.v1 import admin_pb2 as pb
from tidelog.protocol.errors import InvalidArgumentError
from tidelog.protocol.reassign_messages import (
    DecommissionBrokerRequest,
    ListReassignmentsRequest,
    ListReassignmentsResponse,
    PartitionMove,
    PartitionReplicas,
    ReassignPartitionsRequest,
)

T = TypeVar("T")


async def _within(context: Any, call: Awaitable[T]) -> T:
    """``call``, bounded by the gRPC call's deadline when it has one (TIMEOUT past it, as on the wire)."""
    remaining = context.time_remaining() if context is not None else None
    async with asyncio.timeout(remaining):
        return await call


def _throttle(value: int) -> int:
    if value < 0:
        raise InvalidArgumentError(f"throttle_bps must be 0 (no cap) or a number of bytes per second, got {value}")
    return value


def _plan(partitions: Iterable[Any]) -> tuple[PartitionReplicas, ...]:
    """A plan's partitions as the wire carries them (a negative partition id is refused by name)."""
    out = []
    for p in partitions:
        if p.partition < 0:
            raise InvalidArgumentError(f"{p.stream}/{p.partition}: a partition id is a number from 0")
        out.append(PartitionReplicas(p.stream, p.partition, tuple(getattr(p, "replicas", ()))))
    return tuple(out)


def _moves(moves: Iterable[PartitionMove]) -> pb.ReassignmentMoves:
    return pb.ReassignmentMoves(
        moves=[
            pb.PartitionMove(
                stream=m.stream, partition=m.partition, current=m.current, proposed=m.proposed, note=m.note
            )
            for m in moves
        ]
    )


def _statuses(answer: ListReassignmentsResponse) -> pb.ReassignmentStatuses:
    return pb.ReassignmentStatuses(
        statuses=[
            pb.ReassignmentStatus(
                stream=s.stream,
                partition=s.partition,
                replicas=s.replicas,
                target=s.target,
                isr=s.isr,
                leader=s.leader,
                state=s.state,
                detail=s.detail,
                throttle_bps=s.throttle_bps,
            )
            for s in answer.statuses
        ],
        replicas_left=answer.replicas_on,
    )


async def add_partitions(
    ctx: BrokerContext, request: pb.AddPartitionsRequest, context: Any
) -> pb.AddPartitionsResponse:
    answer = await _within(context, reshape_of(ctx).add_partitions(request.stream, request.partitions))
    return pb.AddPartitionsResponse(before=answer.before, after=answer.after)


async def alter_stream(ctx: BrokerContext, request: pb.AlterStreamRequest, context: Any) -> pb.AlterStreamResponse:
    changes = setting_changes(dict(request.settings))
    answer = await _within(context, reshape_of(ctx).alter(request.stream, changes))
    return pb.AlterStreamResponse(
        changes=[pb.SettingChange(name=c.name, before=c.before, after=c.after) for c in answer.changes]
    )


async def generate_reassignment(
    ctx: BrokerContext, request: pb.GenerateReassignmentRequest, context: Any
) -> pb.ReassignmentMoves:
    wire = ReassignPartitionsRequest(generate=True, brokers=tuple(request.brokers), streams=tuple(request.streams))
    return _moves((await _within(context, moves_of(ctx).reassign(wire))).moves)


async def execute_reassignment(
    ctx: BrokerContext, request: pb.ExecuteReassignmentRequest, context: Any
) -> pb.ReassignmentMoves:
    wire = ReassignPartitionsRequest(_plan(request.partitions), _throttle(request.throttle_bps))
    return _moves((await _within(context, moves_of(ctx).reassign(wire))).moves)


async def verify_reassignment(
    ctx: BrokerContext, request: pb.VerifyReassignmentRequest, _context: Any
) -> pb.ReassignmentStatuses:
    return _statuses(moves_of(ctx).list(ListReassignmentsRequest(_plan(request.partitions))))


async def cancel_reassignment(
    ctx: BrokerContext, request: pb.CancelReassignmentRequest, context: Any
) -> pb.ReassignmentMoves:
    wire = ReassignPartitionsRequest(_plan(request.partitions), cancel=True)
    return _moves((await _within(context, moves_of(ctx).reassign(wire))).moves)


async def decommission_broker(
    ctx: BrokerContext, request: pb.DecommissionBrokerRequest, context: Any
) -> pb.ReassignmentMoves:
    wire = DecommissionBrokerRequest(request.broker_id, _throttle(request.throttle_bps))
    return _moves((await _within(context, moves_of(ctx).decommission(wire))).moves)


async def decommission_progress(
    ctx: BrokerContext, request: pb.DecommissionProgressRequest, _context: Any
) -> pb.ReassignmentStatuses:
    if not request.broker_id:
        raise InvalidArgumentError("DecommissionProgress needs the broker_id of the broker being decommissioned")
    return _statuses(moves_of(ctx).list(ListReassignmentsRequest(broker_id=request.broker_id)))


async def elect_preferred_leaders(
    ctx: BrokerContext, _request: pb.ElectPreferredLeadersRequest, context: Any
) -> pb.ElectPreferredLeadersResponse:
    answer = await _within(context, reshape_of(ctx).elect_leaders())
    return pb.ElectPreferredLeadersResponse(moved=answer.moved, not_preferred=answer.not_preferred)
