"""RESET_HEAD, broker side: an operator confirms the head of a suspended partition (fail to safety).

Any broker takes the request (``tidelog partition reset-head`` asks whichever it reaches first):

1. The stream and partition are checked against this broker's mirror, for a quick and precise error.
2. A broker that is not the controller forwards the request, marked ``forwarded`` (a receiver that has just lost
   the election answers "not the controller" rather than forwarding it again), and waits for the answer.
3. The controller (:meth:`~tidelog.metadata.controller.Controller.reset_head`) asks the partition's leader for
   its bounds — in process when it leads the partition, LIST_OFFSETS otherwise — decides
   (:func:`~tidelog.metadata.suspension.decide_reset_head`) and writes the record, fenced.
4. The broker that took the request answers once its own mirror shows the new leadership.

The leader applies the record when its broker sees it (:func:`tidelog.broker.partitions.safety.apply_confirmed_head`);
the client waits for that by asking the leader (:meth:`tidelog.client.admin.Admin.reset_head`).
"""

from __future__ import annotations

import msgspec

from tidelog.broker.context import BrokerContext
from tidelog.broker.controller_link import call_controller
from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.metadata.suspension import LeaderBounds
from tidelog.protocol.errors import (
    InternalError,
    UnavailableError,
    UnknownPartitionError,
    UnknownStreamError,
    UnsupportedError,
)
from tidelog.protocol.messages import ListOffsetsRequest, ListOffsetsResponse, ResetHeadRequest, ResetHeadResponse

DEFAULT_TIMEOUT = 10.0


async def reset_head(ctx: BrokerContext, request: ResetHeadRequest) -> ResetHeadResponse:
    """Confirm the head (steps in the module docstring); raises the precise error otherwise."""
    timeout = request.timeout_ms / 1000 if request.timeout_ms else DEFAULT_TIMEOUT
    stream, partition = request.stream, request.partition
    found = ctx.mirror.snapshot.stream(stream)
    if found is None:
        raise UnknownStreamError(f"no stream named {stream!r}")
    if not 0 <= partition < found.partitions:
        raise UnknownPartitionError(f"stream {stream!r} has partitions 0..{found.partitions - 1}, not {partition}")
    link = ctx.link
    if link is None:
        raise UnsupportedError(f"broker {ctx.broker_id} runs without a controller: nothing can confirm a head")
    if link.is_local:
        offset = None if request.offset < 0 else request.offset

        async def bounds_of(record: PartitionRecord) -> LeaderBounds:
            return await leader_bounds(ctx, record, timeout)

        old, new, bounds = await call_controller(link.controller.reset_head(stream, partition, offset, bounds_of))
        response = ResetHeadResponse(
            new.leader,
            new.leader_epoch,
            new.head_offset,
            bounds.high_watermark,
            bounds.log_end,
            old.suspended or bounds.suspended,
        )
    elif request.forwarded:
        raise UnavailableError(f"broker {ctx.broker_id} is not the controller (the controller is {link.controller_id})")
    else:
        answer = await link.forward(msgspec.structs.replace(request, forwarded=True), timeout)
        if not isinstance(answer, ResetHeadResponse):
            raise InternalError(f"the controller answered RESET_HEAD with a {type(answer).__name__}")
        response = answer

    def applied(snapshot: MetadataSnapshot) -> bool:
        record = snapshot.partition(stream, partition)
        return record is None or record.leader_epoch >= response.leader_epoch

    try:
        await ctx.mirror.wait_for(applied, timeout)
    except TimeoutError:
        raise UnavailableError(
            f"the head of {stream}/{partition} was confirmed, but this broker did not see it"
        ) from None
    return response


async def leader_bounds(ctx: BrokerContext, record: PartitionRecord, timeout: float) -> LeaderBounds:
    """What the partition's leader reports about itself: the leadership it acts on, its HW, log end and own
    suspension. In process when this broker leads it (it may not have taken the record yet: then it reports the
    epoch it leads at, or -1)."""
    if record.leader == ctx.broker_id:
        local = ctx.manager.local(record.stream, record.id)
        if local is None:
            return LeaderBounds(-1, 0, 0)
        return LeaderBounds(local.record.leader_epoch, local.high_watermark, local.log_end, local.safety.reason)
    if ctx.peers is None:
        raise UnavailableError(f"broker {ctx.broker_id} cannot reach other brokers")
    response = await ctx.peers.request(record.leader, ListOffsetsRequest(record.stream, record.id), timeout=timeout)
    bounds = response.header
    if not isinstance(bounds, ListOffsetsResponse):
        raise InternalError(f"leader {record.leader} answered LIST_OFFSETS with a {type(bounds).__name__}")
    return LeaderBounds(bounds.leader_epoch, bounds.high_watermark, bounds.log_end, bounds.suspended)
