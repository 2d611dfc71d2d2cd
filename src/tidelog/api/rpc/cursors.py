"""SetCursor and FetchCursor: Liftbridge's cursor RPCs over :class:`~tidelog.broker.cursors.CursorStore`.

Answered only by the leader of the cursor's ``__cursors`` partition: elsewhere ``FAILED_PRECONDITION``, as
Liftbridge answers (its clients look the leader up and retry). Bad input is ``INVALID_ARGUMENT`` (empty or
over-long cursor id, offset below -1) or ``NOT_FOUND`` (no such stream or partition), on any broker, and nothing
is stored. ``FetchCursor`` of a cursor never set answers offset -1.
"""

from __future__ import annotations

from typing import Any

from tidelog.api.rpc.publish import request_timeout
from tidelog.broker.context import BrokerContext
from tidelog.broker.cursors import CursorStore
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.errors import UnsupportedError


def _store(ctx: BrokerContext) -> CursorStore:
    if ctx.cursors is None:
        raise UnsupportedError("this broker was assembled without cursors")
    return ctx.cursors


async def set_cursor(ctx: BrokerContext, request: api_pb2.SetCursorRequest, context: Any) -> api_pb2.SetCursorResponse:
    await _store(ctx).set(
        request.stream, request.partition, request.cursorId, request.offset, request_timeout(ctx, context)
    )
    return api_pb2.SetCursorResponse()


async def fetch_cursor(
    ctx: BrokerContext, request: api_pb2.FetchCursorRequest, context: Any
) -> api_pb2.FetchCursorResponse:
    offset = await _store(ctx).fetch(request.stream, request.partition, request.cursorId, request_timeout(ctx, context))
    return api_pb2.FetchCursorResponse(offset=offset)
