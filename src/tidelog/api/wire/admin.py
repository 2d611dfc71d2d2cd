"""The administration family of the wire protocol: METADATA, CREATE_STREAM, DELETE_STREAM, LIST_STREAMS,
SET_STREAM_STATE (pause, resume, read-only), RESET_HEAD (fail to safety, :mod:`tidelog.broker.head_reset`) and
SKIP_DAMAGED (an operator confirms skipping offsets damaged on the leader's disk, :mod:`tidelog.storage.damage`;
answered by the partition's leader, whose disk it is), and the reshaping ops ADD_PARTITIONS, ALTER_STREAM and
ELECT_LEADERS (:mod:`tidelog.broker.stream_reshape`), and the replica moves REASSIGN_PARTITIONS,
DECOMMISSION_BROKER and LIST_REASSIGNMENTS (:mod:`tidelog.broker.partition_moves`).

Metadata comes from this broker's mirror of the etcd keyspace (:class:`~tidelog.metadata.mirror.MetadataMirror`),
so any broker answers it; watermarks are only known to a partition's leader, so a partition led elsewhere reports
zeros there and the client asks its leader (``Admin.describe_stream`` does). Changes go through
:class:`~tidelog.broker.streams.StreamAdmin`, which validates them, writes etcd and waits until this broker has
applied them: a client may produce to a stream as soon as its CREATE_STREAM is answered.

Per-stream settings travel as strings by name (``CreateStreamRequest.config``) so that a new setting never
changes the header. A name may be written as the field of
:class:`~tidelog.metadata.records.StreamConfig` (``retention_max_bytes``), dotted or dashed
(``retention.max.bytes``) or in Liftbridge's camel case (``retentionMaxBytes``); values are converted to the
field's type, and an unknown name or a bad value is INVALID_ARGUMENT rather than silently ignored.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.broker.context import BrokerContext
from tidelog.broker.head_reset import reset_head as confirm_head
from tidelog.broker.partition_moves import PartitionMoves
from tidelog.broker.stream_reshape import StreamReshape
from tidelog.metadata.records import PartitionRecord, StreamConfig, StreamRecord
from tidelog.protocol.errors import InvalidArgumentError, UnavailableError, UnknownStreamError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.messages import (
    BrokerInfo,
    CreateStreamRequest,
    CreateStreamResponse,
    DamagedSpan,
    DeleteStreamRequest,
    DeleteStreamResponse,
    ListStreamsRequest,
    ListStreamsResponse,
    MetadataRequest,
    MetadataResponse,
    PartitionInfo,
    ResetHeadRequest,
    SetStreamStateRequest,
    SetStreamStateResponse,
    SkipDamagedRequest,
    SkipDamagedResponse,
    StreamInfo,
    StreamSummary,
)
from tidelog.protocol.reassign_messages import (
    DecommissionBrokerRequest,
    ListReassignmentsRequest,
    ReassignPartitionsRequest,
)
from tidelog.protocol.reshape_messages import (
    RESET,
    AddPartitionsRequest,
    AlterStreamRequest,
    ElectLeadersRequest,
)

_CONFIG_FIELDS = frozenset(StreamConfig.__struct_fields__)
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _field(name: str) -> str:
    """The :class:`StreamConfig` field a setting's name means, in any of its spellings (module docstring)."""
    field = _CAMEL_BOUNDARY.sub("_", name).replace(".", "_").replace("-", "_").lower()
    if field not in _CONFIG_FIELDS:
        raise InvalidArgumentError(f"unknown stream setting {name!r}; known: {', '.join(sorted(_CONFIG_FIELDS))}")
    return field


def stream_config(overrides: Mapping[str, str]) -> StreamConfig:
    """Parse ``name → string value`` overrides into a :class:`StreamConfig` (see the module docstring)."""
    values = {_field(name): value for name, value in overrides.items()}
    try:
        return msgspec.convert(values, StreamConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise InvalidArgumentError(f"bad stream setting: {exc}") from None


def setting_changes(settings: Mapping[str, str]) -> dict[str, Any]:
    """Parse ``name → string value`` changes of ALTER_STREAM into field → typed value (None for
    :data:`~tidelog.protocol.reshape_messages.RESET`: the broker default)."""
    reset = {_field(name) for name, value in settings.items() if value == RESET}
    config = stream_config({name: value for name, value in settings.items() if value != RESET})
    changes: dict[str, Any] = {field: None for field in reset}
    for name in settings:
        field = _field(name)
        if field not in reset:
            changes[field] = getattr(config, field)
    return changes


async def create_stream(env: HandlerEnv, correlation_id: int, request: CreateStreamRequest, _: memoryview) -> Reply:
    config = stream_config(request.config)
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        await env.broker.admin.create_stream(
            name=request.name,
            subject=request.subject,
            group=request.group,
            partitions=request.partitions,
            replication_factor=request.replication_factor,
            config=config,
            forwarded=request.forwarded,
        )
    return Reply(encode_message(correlation_id, CreateStreamResponse()))


async def delete_stream(env: HandlerEnv, correlation_id: int, request: DeleteStreamRequest, _: memoryview) -> Reply:
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        await env.broker.admin.delete_stream(request.name, forwarded=request.forwarded)
    return Reply(encode_message(correlation_id, DeleteStreamResponse()))


async def set_stream_state(
    env: HandlerEnv, correlation_id: int, request: SetStreamStateRequest, _: memoryview
) -> Reply:
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        if request.paused is not None:
            await env.broker.admin.set_paused(
                request.name,
                request.partitions,
                request.paused,
                resume_all=request.resume_all,
                forwarded=request.forwarded,
            )
        if request.readonly is not None:
            await env.broker.admin.set_readonly(
                request.name, request.partitions, request.readonly, forwarded=request.forwarded
            )
        if request.rotate_key:
            await env.broker.admin.rotate_key(request.name, forwarded=request.forwarded)
    return Reply(encode_message(correlation_id, SetStreamStateResponse()))


def reshape_of(ctx: BrokerContext) -> StreamReshape:
    """The broker's stream reshaping (the wire ops here and ``tidelog.v1.Admin`` both go through it)."""
    reshape = ctx.reshape
    if reshape is None:
        raise UnavailableError("this broker cannot reshape streams (it runs without metadata)")
    return reshape


async def add_partitions(env: HandlerEnv, correlation_id: int, request: AddPartitionsRequest, _: memoryview) -> Reply:
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        answer = await reshape_of(env.broker).add_partitions(
            request.name, request.partitions, forwarded=request.forwarded
        )
    return Reply(encode_message(correlation_id, answer))


async def alter_stream(env: HandlerEnv, correlation_id: int, request: AlterStreamRequest, _: memoryview) -> Reply:
    changes = setting_changes(request.settings)
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        answer = await reshape_of(env.broker).alter(request.name, changes, forwarded=request.forwarded)
    return Reply(encode_message(correlation_id, answer))


async def elect_leaders(env: HandlerEnv, correlation_id: int, request: ElectLeadersRequest, _: memoryview) -> Reply:
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        answer = await reshape_of(env.broker).elect_leaders(forwarded=request.forwarded)
    return Reply(encode_message(correlation_id, answer))


def moves_of(ctx: BrokerContext) -> PartitionMoves:
    """The broker's replica moves (the wire ops here and ``tidelog.v1.Admin`` both go through them)."""
    moves = ctx.moves
    if moves is None:
        raise UnavailableError("this broker cannot move replicas (it runs without a controller)")
    return moves


async def reassign_partitions(
    env: HandlerEnv, correlation_id: int, request: ReassignPartitionsRequest, _: memoryview
) -> Reply:
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        answer = await moves_of(env.broker).reassign(request)
    return Reply(encode_message(correlation_id, answer))


async def decommission_broker(
    env: HandlerEnv, correlation_id: int, request: DecommissionBrokerRequest, _: memoryview
) -> Reply:
    async with asyncio.timeout(request.timeout_ms / 1000 if request.timeout_ms else None):
        answer = await moves_of(env.broker).decommission(request)
    return Reply(encode_message(correlation_id, answer))


async def list_reassignments(
    env: HandlerEnv, correlation_id: int, request: ListReassignmentsRequest, _: memoryview
) -> Reply:
    return Reply(encode_message(correlation_id, moves_of(env.broker).list(request)))


async def reset_head(env: HandlerEnv, correlation_id: int, request: ResetHeadRequest, _: memoryview) -> Reply:
    return Reply(encode_message(correlation_id, await confirm_head(env.broker, request)))


async def skip_damaged(env: HandlerEnv, correlation_id: int, request: SkipDamagedRequest, _: memoryview) -> Reply:
    """List the leader's damaged ranges of a partition; with ``first`` ≥ 0 confirm skipping one first."""
    damage = env.broker.manager.leader_of(request.stream, request.partition).log.damage
    if request.first >= 0:
        try:
            damage.confirm(request.first, request.last)
        except KeyError as exc:
            raise InvalidArgumentError(f"{request.stream}/{request.partition}: {exc.args[0]}") from None
    spans = tuple(DamagedSpan(r.first, r.last, r.confirmed, r.reason) for r in damage.ranges)
    return Reply(encode_message(correlation_id, SkipDamagedResponse(spans, damage.found_total, damage.repaired_total)))


async def list_streams(env: HandlerEnv, correlation_id: int, request: ListStreamsRequest, _: memoryview) -> Reply:
    streams = env.broker.mirror.snapshot.streams
    summaries = tuple(
        StreamSummary(s.name, s.subject, s.partitions, s.replication_factor)
        for name, s in sorted(streams.items())
        if name.startswith(request.prefix)
    )
    return Reply(encode_message(correlation_id, ListStreamsResponse(summaries)))


async def metadata(env: HandlerEnv, correlation_id: int, request: MetadataRequest, _: memoryview) -> Reply:
    return Reply(encode_message(correlation_id, build_metadata(env.broker, request.streams)))


def build_metadata(ctx: BrokerContext, names: tuple[str, ...]) -> MetadataResponse:
    """Brokers (with their wire ports) and the requested streams, every stream when ``names`` is empty."""
    snap = ctx.mirror.snapshot
    brokers = tuple(BrokerInfo(b.id, b.host, b.wire_port) for _, b in sorted(snap.brokers.items()))
    streams: list[StreamInfo] = []
    for name in names or tuple(sorted(snap.streams)):
        stream = snap.stream(name)
        if stream is None:
            missing = UnknownStreamError(f"no stream named {name!r}").to_error_body()
            streams.append(StreamInfo(name, "", (), missing))
            continue
        partitions = tuple(_partition_info(ctx, stream, p) for p in snap.partitions_of(name))
        streams.append(StreamInfo(stream.name, stream.subject, partitions))
    return MetadataResponse(brokers, tuple(streams))


def _partition_info(ctx: BrokerContext, stream: StreamRecord, record: PartitionRecord) -> PartitionInfo:
    local = ctx.manager.local(stream.name, record.id)
    hw = end = start = 0
    suspended = record.suspended
    if local is not None:
        hw, end, start = local.high_watermark, local.log_end, local.log_start
        suspended = local.safety.reason  # the leader's own finding shows before the controller has recorded it
    return PartitionInfo(
        record.id,
        record.leader or None,
        tuple(record.replicas),
        tuple(record.isr),
        record.leader_epoch,
        hw,
        end,
        record.readonly,
        record.paused,
        start,
        suspended,
    )


ROUTES: dict[int, Route] = {
    Op.METADATA: route(MetadataRequest, metadata),
    Op.CREATE_STREAM: route(CreateStreamRequest, create_stream),
    Op.DELETE_STREAM: route(DeleteStreamRequest, delete_stream),
    Op.LIST_STREAMS: route(ListStreamsRequest, list_streams),
    Op.SET_STREAM_STATE: route(SetStreamStateRequest, set_stream_state),
    Op.RESET_HEAD: route(ResetHeadRequest, reset_head),
    Op.SKIP_DAMAGED: route(SkipDamagedRequest, skip_damaged),
    Op.ADD_PARTITIONS: route(AddPartitionsRequest, add_partitions),
    Op.ALTER_STREAM: route(AlterStreamRequest, alter_stream),
    Op.ELECT_LEADERS: route(ElectLeadersRequest, elect_leaders),
    Op.REASSIGN_PARTITIONS: route(ReassignPartitionsRequest, reassign_partitions),
    Op.DECOMMISSION_BROKER: route(DecommissionBrokerRequest, decommission_broker),
    Op.LIST_REASSIGNMENTS: route(ListReassignmentsRequest, list_reassignments),
}
