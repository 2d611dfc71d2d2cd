"""Stream administration and metadata RPCs: request → domain call, domain state → Liftbridge messages.

Liftbridge reports ``highWatermark`` and ``newestOffset`` as the offsets of the last committed and the newest
record (-1 when there are none), not as "next offset" the way tidelog tracks them internally.
"""

from __future__ import annotations

from tidelog.api.rpc.groups import group_metadata
from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamConfig, StreamRecord
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.errors import NotLeaderError, PartitionPausedError

_NULLABLE_FIELDS = {
    "retentionMaxBytes": "retention_max_bytes",
    "retentionMaxMessages": "retention_max_messages",
    "retentionMaxAge": "retention_max_age_ms",
    "cleanerInterval": "cleaner_interval_ms",
    "segmentMaxBytes": "segment_max_bytes",
    "segmentMaxAge": "segment_max_age_ms",
    "compactMaxGoroutines": "compact_max_goroutines",
    "compactEnabled": "compact_enabled",
    "autoPauseTime": "auto_pause_time_ms",
    "autoPauseDisableIfSubscribers": "auto_pause_disable_if_subscribers",
    "minIsr": "min_isr",
    "optimisticConcurrencyControl": "optimistic_concurrency_control",
    "encryption": "encryption",
}


def stream_config_from(request: api_pb2.CreateStreamRequest) -> StreamConfig:
    """The overrides a CreateStreamRequest sets (unset wrappers keep the broker default)."""
    values = {
        ours: getattr(request, theirs).value for theirs, ours in _NULLABLE_FIELDS.items() if request.HasField(theirs)
    }
    return StreamConfig(**values)


async def create_stream(ctx: BrokerContext, request: api_pb2.CreateStreamRequest) -> api_pb2.CreateStreamResponse:
    await ctx.admin.create_stream(
        name=request.name,
        subject=request.subject,
        group=request.group,
        partitions=request.partitions,
        replication_factor=request.replicationFactor,
        config=stream_config_from(request),
        exists_ok=False,  # Liftbridge answers ALREADY_EXISTS whenever the name is taken
    )
    return api_pb2.CreateStreamResponse()


async def delete_stream(ctx: BrokerContext, request: api_pb2.DeleteStreamRequest) -> api_pb2.DeleteStreamResponse:
    await ctx.admin.delete_stream(request.name)
    return api_pb2.DeleteStreamResponse()


async def pause_stream(ctx: BrokerContext, request: api_pb2.PauseStreamRequest) -> api_pb2.PauseStreamResponse:
    await ctx.admin.set_paused(request.name, list(request.partitions), True, resume_all=request.resumeAll)
    return api_pb2.PauseStreamResponse()


async def set_stream_readonly(
    ctx: BrokerContext, request: api_pb2.SetStreamReadonlyRequest
) -> api_pb2.SetStreamReadonlyResponse:
    await ctx.admin.set_readonly(request.name, list(request.partitions), request.readonly)
    return api_pb2.SetStreamReadonlyResponse()


def _last(next_offset: int) -> int:
    return next_offset - 1  # -1 for an empty partition, as Liftbridge reports


def partition_metadata(record: PartitionRecord, local: Partition | None) -> api_pb2.PartitionMetadata:
    meta = api_pb2.PartitionMetadata(
        id=record.id,
        leader=record.leader,
        replicas=list(record.replicas),
        isr=list(record.isr),
        paused=record.paused,
        readonly=record.readonly,
        highWatermark=-1,
        newestOffset=-1,
    )
    if record.paused_ns or record.resumed_ns:
        meta.pauseTimestamps.firstTimestamp = record.paused_ns
        meta.pauseTimestamps.latestTimestamp = record.resumed_ns
    if record.readonly_ns:
        meta.readonlyTimestamps.firstTimestamp = record.readonly_ns
        meta.readonlyTimestamps.latestTimestamp = record.readonly_ns
    if local is not None:
        meta.highWatermark = _last(local.high_watermark)
        meta.newestOffset = _last(local.log_end)
        meta.messagesReceivedTimestamps.firstTimestamp = local.first_received_ns
        meta.messagesReceivedTimestamps.latestTimestamp = local.latest_received_ns
    return meta


def stream_metadata(ctx: BrokerContext, stream: StreamRecord) -> api_pb2.StreamMetadata:
    snap = ctx.mirror.snapshot
    out = api_pb2.StreamMetadata(name=stream.name, subject=stream.subject, creationTimestamp=stream.created_ns)
    for record in snap.partitions_of(stream.name):
        local = ctx.manager.local(record.stream, record.id)
        out.partitions[record.id].CopyFrom(partition_metadata(record, local))
    return out


async def fetch_metadata(ctx: BrokerContext, request: api_pb2.FetchMetadataRequest) -> api_pb2.FetchMetadataResponse:
    snap = ctx.mirror.snapshot
    response = api_pb2.FetchMetadataResponse()
    leaders: dict[str, int] = {}
    hosted: dict[str, int] = {}
    for p in snap.partitions.values():
        leaders[p.leader] = leaders.get(p.leader, 0) + 1
        for r in p.replicas:
            hosted[r] = hosted.get(r, 0) + 1
    for broker in sorted(snap.brokers.values(), key=lambda b: b.id):
        response.brokers.append(
            api_pb2.Broker(
                id=broker.id,
                host=broker.host,
                port=broker.port,
                partitionCount=hosted.get(broker.id, 0),
                leaderCount=leaders.get(broker.id, 0),
            )
        )
    names = list(request.streams) or sorted(snap.streams)
    for name in names:
        stream = snap.stream(name)
        if stream is None:
            response.streamMetadata.append(
                api_pb2.StreamMetadata(name=name, error=api_pb2.StreamMetadata.UNKNOWN_STREAM)
            )
        else:
            response.streamMetadata.append(stream_metadata(ctx, stream))
    for group in request.groups:
        response.groupMetadata.append(group_metadata(ctx, group))
    return response


async def fetch_partition_metadata(
    ctx: BrokerContext, request: api_pb2.FetchPartitionMetadataRequest
) -> api_pb2.FetchPartitionMetadataResponse:
    """Answered by the partition leader only (it alone knows the high watermark), as in Liftbridge; for a paused
    partition (closed) with the offsets it had when paused here, -1 when unknown (paused before a restart)."""
    try:
        local = ctx.manager.leader_of(request.stream, request.partition)
    except PartitionPausedError:
        local = None
    record = ctx.mirror.snapshot.partition(request.stream, request.partition)
    if record is None:
        raise NotLeaderError(f"{request.stream}/{request.partition} has no metadata on this broker")
    if local is None and record.leader != ctx.broker_id:
        raise NotLeaderError(f"this broker ({ctx.broker_id}) does not lead {record.stream}/{record.id}")
    meta = partition_metadata(record, local)
    bounds = ctx.manager.paused_bounds(request.stream, request.partition) if local is None else None
    if bounds is not None:
        meta.highWatermark, meta.newestOffset = _last(bounds[0]), _last(bounds[1])
    return api_pb2.FetchPartitionMetadataResponse(metadata=meta)
