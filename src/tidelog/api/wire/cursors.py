"""The cursor family of the wire protocol: SET_CURSOR and FETCH_CURSOR, so the native client commits and reads
consumer positions without gRPC. Same store, same rules and same errors as Liftbridge's ``SetCursor`` and
``FetchCursor`` (:mod:`tidelog.broker.cursors`): answered by the leader of the cursor's ``__cursors``
partition, NOT_LEADER elsewhere (the client looks the leader up again and retries).

A request carrying a ``group`` context is a consumer group member's: a commit is fenced by the group epoch (refused,
nothing stored, unless the member owns the partition at the group's current epoch) and a read waits until this
broker knows the member's epoch (:mod:`tidelog.broker.groups.fencing`). Without one, both are Liftbridge's.

LIST_CURSORS lists every cursor of one id in one ``__cursors`` partition, answered by that partition's leader: a
consumer group's committed offsets, for ``tidelog group describe`` (a client asks every partition).
"""

from __future__ import annotations

from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.broker.context import BrokerContext
from tidelog.broker.cursors import CursorStore
from tidelog.broker.groups.service import GroupService
from tidelog.protocol.cursor_messages import (
    CursorPosition,
    FetchCursorRequest,
    FetchCursorResponse,
    ListCursorsRequest,
    ListCursorsResponse,
    SetCursorRequest,
    SetCursorResponse,
)
from tidelog.protocol.errors import UnsupportedError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message


def store_of(ctx: BrokerContext) -> CursorStore:
    if ctx.cursors is None:
        raise UnsupportedError("this broker was assembled without cursors")
    return ctx.cursors


def groups_of(ctx: BrokerContext) -> GroupService:
    if ctx.groups is None:
        raise UnsupportedError(f"broker {ctx.broker_id} runs without consumer groups")
    return ctx.groups


async def set_cursor(env: HandlerEnv, correlation_id: int, request: SetCursorRequest, _: memoryview) -> Reply:
    timeout = request.timeout_ms / 1000
    store = store_of(env.broker)
    fence = None
    if request.group is not None:
        store.check(request.stream, request.partition, request.cursor_id, request.offset)  # bad input first
        fence = await groups_of(env.broker).commit_fence(
            request.group, request.cursor_id, request.stream, request.partition
        )
    await store.set(request.stream, request.partition, request.cursor_id, request.offset, timeout, fence=fence)
    return Reply(encode_message(correlation_id, SetCursorResponse()))


async def fetch_cursor(env: HandlerEnv, correlation_id: int, request: FetchCursorRequest, _: memoryview) -> Reply:
    timeout = request.timeout_ms / 1000
    store = store_of(env.broker)
    if request.group is not None:
        store.check(request.stream, request.partition, request.cursor_id)
        await groups_of(env.broker).catch_up(request.group)
    offset = await store.fetch(request.stream, request.partition, request.cursor_id, timeout)
    return Reply(encode_message(correlation_id, FetchCursorResponse(offset)))


async def list_cursors(env: HandlerEnv, correlation_id: int, request: ListCursorsRequest, _: memoryview) -> Reply:
    store = store_of(env.broker)
    found = await store.cursors_of(request.cursor_id, request.cursors_partition, request.timeout_ms / 1000)
    response = ListCursorsResponse(tuple(CursorPosition(*position) for position in found))
    return Reply(encode_message(correlation_id, response))


ROUTES: dict[int, Route] = {
    Op.SET_CURSOR: route(SetCursorRequest, set_cursor),
    Op.FETCH_CURSOR: route(FetchCursorRequest, fetch_cursor),
    Op.LIST_CURSORS: route(ListCursorsRequest, list_cursors),
}
