"""The control family of the wire protocol: requests brokers send to the controller.

ALTER_ISR (a leader's ISR change), REPORT_UNREACHABLE (a follower's hint that its leader is gone),
CONTROLLED_SHUTDOWN (a stopping broker handing its leaderships off) and SUSPEND_PARTITION (a leader that found
evidence of lost consistency, :mod:`tidelog.broker.partitions.safety`). Only the controller answers them; any other
broker says UNAVAILABLE ("not the controller"), which the sender retries after the election settles
(:class:`~tidelog.broker.controller_link.ControllerLink`). The controller validates each request against the
metadata itself (an ISR change from a stale leader epoch is refused), so a request from a confused broker can
never make a change the controller would not make on its own.
"""

from __future__ import annotations

from typing import Any

from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.broker.controller_link import call_controller
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.peer_messages import (
    AlterIsrRequest,
    AlterIsrResponse,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    ReportUnreachableRequest,
    ReportUnreachableResponse,
    SuspendPartitionRequest,
    SuspendPartitionResponse,
)


def _controller(env: HandlerEnv) -> Any:
    link = env.broker.link
    if link is None or not link.is_local:
        current = None if link is None else link.controller_id
        raise UnavailableError(f"broker {env.broker.broker_id} is not the controller (the controller is {current})")
    return link.controller


async def alter_isr(env: HandlerEnv, correlation_id: int, request: AlterIsrRequest, _: memoryview) -> Reply:
    record = await call_controller(
        _controller(env).alter_isr(
            request.stream, request.partition, request.leader_id, request.leader_epoch, tuple(request.isr)
        )
    )
    return Reply(encode_message(correlation_id, AlterIsrResponse(record.leader_epoch, tuple(record.isr))))


async def report_unreachable(
    env: HandlerEnv, correlation_id: int, request: ReportUnreachableRequest, _: memoryview
) -> Reply:
    await call_controller(_controller(env).report_unreachable(request.reporter_id, request.broker_id))
    return Reply(encode_message(correlation_id, ReportUnreachableResponse()))


async def controlled_shutdown(
    env: HandlerEnv, correlation_id: int, request: ControlledShutdownRequest, _: memoryview
) -> Reply:
    remaining = await call_controller(_controller(env).controlled_shutdown(request.broker_id))
    return Reply(encode_message(correlation_id, ControlledShutdownResponse(int(remaining))))


async def suspend_partition(
    env: HandlerEnv, correlation_id: int, request: SuspendPartitionRequest, _: memoryview
) -> Reply:
    await call_controller(
        _controller(env).suspend_partition(
            request.stream, request.partition, request.leader_id, request.leader_epoch, request.reason
        )
    )
    return Reply(encode_message(correlation_id, SuspendPartitionResponse()))


ROUTES: dict[int, Route] = {
    Op.ALTER_ISR: route(AlterIsrRequest, alter_isr),
    Op.REPORT_UNREACHABLE: route(ReportUnreachableRequest, report_unreachable),
    Op.CONTROLLED_SHUTDOWN: route(ControlledShutdownRequest, controlled_shutdown),
    Op.SUSPEND_PARTITION: route(SuspendPartitionRequest, suspend_partition),
}
