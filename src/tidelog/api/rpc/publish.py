"""Publish and PublishToSubject, and the per-message publish that ``PublishAsync`` falls back on
(:mod:`tidelog.api.rpc.publish_batches` batches the rest).

``Publish`` answers once the request's ack policy is met, with the ``Ack`` carrying the offset, and within the
request's deadline (or the broker's default ack timeout when it has none). A request that asks for an ack inbox
also gets its ack published there, as Liftbridge does. ``NONE`` still stores the message before answering: it
only means the response carries no ack.

``ackInbox``, ``ackPolicy`` and ``PublishToSubject``'s ``subject`` are checked before anything is stored or sent
(:mod:`tidelog.protocol.subjects`): a bad one is INVALID_ARGUMENT naming the field, never an error after the write that
would make the client retry and store a duplicate.

A publish that reaches a broker which does not lead the partition is forwarded to the leader over the wire
protocol (Liftbridge clients talking to one seed broker keep working through failovers); only an
``expectedOffset`` publish is not, since its check belongs with the leader's log: it answers NOT_LEADER. On
the leader the check is atomic with the append: :meth:`Log.append` compares the expected offset with the log end
while it assigns offsets, under its lock, so two publishes expecting the same offset never both succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from tidelog.broker.context import BrokerContext
from tidelog.broker.ingest.copies import copy_tag, publish_copy
from tidelog.broker.partitions.write_path import WriteRefused
from tidelog.metadata.namespace import queue_group
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, encode_envelope, parse_envelope
from tidelog.protocol.errors import (
    ErrorCode,
    IncorrectOffsetError,
    MessageTooLargeError,
    NotLeaderError,
    RequestTimeoutError,
    from_error_body,
)
from tidelog.protocol.liftbridge import build_ack, check_user_headers, record_for_publish
from tidelog.protocol.messages import Acks, ProduceRequest, ProduceResponse
from tidelog.protocol.records import build_batch
from tidelog.protocol.subjects import check_ack, check_subject

log = logging.getLogger(__name__)


def request_timeout(ctx: BrokerContext, grpc_context: Any) -> float:
    """Seconds left of the call's deadline (a little less, to answer in time), or the broker's ack timeout."""
    remaining = grpc_context.time_remaining() if grpc_context is not None else None
    return ctx.ack_timeout if remaining is None else max(0.0, remaining - 0.01)


def check_size(ctx: BrokerContext, key: bytes, value: bytes, headers: Any) -> int:
    """The message's size (key, value and headers); raises MESSAGE_TOO_LARGE above the broker's limit."""
    size = len(key) + len(value) + (sum(len(k) + len(v) for k, v in headers.items()) if headers else 0)
    if size > ctx.config.max_message_bytes:
        raise MessageTooLargeError(
            f"message of {size} bytes is above the broker's limit of {ctx.config.max_message_bytes} bytes"
        )
    return size


async def publish(ctx: BrokerContext, request: api_pb2.PublishRequest, timeout: float) -> api_pb2.PublishResponse:
    """Store one message and acknowledge it per its ack policy."""
    check_ack(request.ackInbox, int(request.ackPolicy))  # before anything is stored: an ack that cannot be sent
    try:
        partition = await ctx.writable(request.stream, request.partition)  # a publish resumes a paused one
    except NotLeaderError:
        if ctx.peers is None or request.expectedOffset not in (-1, 0):
            raise
        return await _forward(ctx, request, timeout)
    check_user_headers(request.headers.keys())
    check_size(ctx, request.key, request.value, request.headers)
    expected: int | None = None
    if partition.stream.config.optimistic_concurrency_control and request.expectedOffset not in (-1,):
        expected = request.expectedOffset
    record = record_for_publish(
        key=request.key,
        value=request.value,
        headers=request.headers,
        timestamp=time.time_ns(),
        ack_inbox=request.ackInbox,
        correlation_id=request.correlationId,
        ack_policy=int(request.ackPolicy),
    )
    batch = build_batch([record], timestamp=record.timestamp or time.time_ns())
    policy = Acks(int(request.ackPolicy))
    # The log compares the expected offset where it assigns offsets, under its lock (see broker.write_path): a
    # check here followed by the append would let a concurrent publish take the offset in between.
    appended = await partition.write(
        batch, Acks.ALL if policy is Acks.ALL else Acks.LEADER, timeout, expected_offset=expected
    )
    if isinstance(appended, WriteRefused):  # the one place a refused publish becomes its ack or gRPC status
        if appended.code is ErrorCode.INCORRECT_OFFSET and expected is not None:
            return api_pb2.PublishResponse(
                correlationId=request.correlationId,
                ack=partition_ack(partition, request, partition.log_end - 1, 0, 0, error=api_pb2.Ack.INCORRECT_OFFSET),
            )
        raise appended.error()
    await copy_to_nats(ctx, partition.stream.name, partition.stream.group, request, partition.subject)
    if policy is Acks.NONE:
        return api_pb2.PublishResponse(correlationId=request.correlationId)
    ack = partition_ack(partition, request, appended.base_offset, appended.received_ns, appended.committed_ns)
    if request.ackInbox:
        await ack_to_inbox(ctx, request.ackInbox, ack)
    return api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId)


_VIEW_WAIT = 2.0
"""Seconds a publish forwarded by this broker waits for its metadata to name the partition's leader: right after a
stream is created or its leader moves, this broker's published view may lag what etcd (and the client) saw."""


async def _leader_known(
    ctx: BrokerContext, stream: str, partition: int, wait: float
) -> tuple[StreamRecord | None, PartitionRecord | None]:
    """The stream and partition records once this broker's view names a leader, or as they are after ``wait``."""

    def known(snap: MetadataSnapshot) -> bool:
        meta = snap.partition(stream, partition)
        return snap.stream(stream) is not None and meta is not None and bool(meta.leader)

    snap = ctx.mirror.snapshot
    if not known(snap):
        with contextlib.suppress(TimeoutError):
            snap = await ctx.mirror.wait_for(known, wait)
    return snap.stream(stream), snap.partition(stream, partition)


async def _forward(ctx: BrokerContext, request: api_pb2.PublishRequest, timeout: float) -> api_pb2.PublishResponse:
    """Publish through the partition's leader (this broker follows it or holds no replica)."""
    check_user_headers(request.headers.keys())
    check_size(ctx, request.key, request.value, request.headers)
    stream, meta = await _leader_known(ctx, request.stream, request.partition, min(timeout, _VIEW_WAIT))
    if stream is None or meta is None or not meta.leader:
        raise NotLeaderError(f"{request.stream}/{request.partition} has no leader right now")
    now = time.time_ns()
    record = record_for_publish(
        key=request.key,
        value=request.value,
        headers=request.headers,
        timestamp=now,
        ack_inbox=request.ackInbox,
        correlation_id=request.correlationId,
        ack_policy=int(request.ackPolicy),
    )
    policy = Acks(int(request.ackPolicy))
    acks = Acks.ALL if policy is Acks.ALL else Acks.LEADER
    produce = ProduceRequest(request.stream, request.partition, acks, max(1, int(timeout * 1000)))
    assert ctx.peers is not None
    response = await ctx.peers.request(meta.leader, produce, build_batch([record], timestamp=now), timeout=timeout)
    header = response.header
    assert isinstance(header, ProduceResponse)
    if header.error is not None:
        raise from_error_body(header.error)
    subject = stream.partition_subject(request.partition)
    await copy_to_nats(ctx, stream.name, stream.group, request, subject)
    if policy is Acks.NONE:
        return api_pb2.PublishResponse(correlationId=request.correlationId)
    ack = build_publish_ack(stream.name, subject, request, header.base_offset, now, time.time_ns())
    if request.ackInbox:
        await ack_to_inbox(ctx, request.ackInbox, ack)
    return api_pb2.PublishResponse(ack=ack, correlationId=request.correlationId)


async def copy_to_nats(
    ctx: BrokerContext, stream: str, group: str, request: api_pb2.PublishRequest, subject: str
) -> None:
    """The stored message's copy on its partition's subject, for every other stream and subscriber there
    (:mod:`tidelog.broker.ingest.copies`: the target's own ingest leaves it out)."""
    tag = copy_tag(stream, request.partition, queue_group(ctx.config.namespace, group))
    ingest = ctx.manager.ingest_of(stream, request.partition)
    await publish_copy(
        ctx.nc,
        subject,
        tag,
        direct=None if ingest is None else ingest.publish_copy,
        key=request.key,
        value=request.value,
        headers=request.headers,
        correlation_id=request.correlationId,
    )


async def copy_run_to_nats(
    ctx: BrokerContext,
    stream: str,
    group: str,
    partition: int,
    subject: str,
    requests: Sequence[api_pb2.PublishRequest],
) -> None:
    """The copies of a run of stored messages of one partition, in order: :func:`copy_to_nats` with the copy tag
    and the target's ingest looked up once for the run. On the ingest's own connection the copies leave in one
    write (it holds commands for a moment); through nats-py they wait in its buffer for one flush."""
    tag = copy_tag(stream, partition, queue_group(ctx.config.namespace, group))
    ingest = ctx.manager.ingest_of(stream, partition)
    direct = None if ingest is None else ingest.publish_copy
    for request in requests:
        await publish_copy(
            ctx.nc,
            subject,
            tag,
            direct=direct,
            key=request.key,
            value=request.value,
            headers=request.headers,
            correlation_id=request.correlationId,
        )


async def ack_to_inbox(ctx: BrokerContext, inbox: str, ack: api_pb2.Ack) -> None:
    """Also publish the ack on the request's inbox, as Liftbridge does. The message is stored and the response
    carries the ack, so a failure here is logged, not answered: an error would make the client store it again."""
    try:
        await ctx.nc.publish(inbox, encode_envelope(MessageType.ACK, ack.SerializeToString()))
    except Exception as exc:
        log.warning("could not publish the ack of %s offset %d to its ack inbox: %r", ack.stream, ack.offset, exc)


def partition_ack(
    partition: Any, request: api_pb2.PublishRequest, offset: int, received: int, committed: int, error: int = 0
) -> api_pb2.Ack:
    return build_publish_ack(partition.stream.name, partition.subject, request, offset, received, committed, error)


def build_publish_ack(
    stream: str,
    subject: str,
    request: api_pb2.PublishRequest,
    offset: int,
    received: int,
    committed: int,
    error: int = 0,
) -> api_pb2.Ack:
    return build_ack(
        stream=stream,
        partition_subject=subject,
        msg_subject=subject,
        offset=offset,
        ack_inbox=request.ackInbox,
        correlation_id=request.correlationId,
        ack_policy=int(request.ackPolicy),
        received_ns=received,
        committed_ns=committed,
        error=error,
    )


async def publish_to_subject(
    ctx: BrokerContext, request: api_pb2.PublishToSubjectRequest, timeout: float
) -> api_pb2.PublishToSubjectResponse:
    """Publish a Liftbridge envelope to a NATS subject; wait for the stream's ack unless the policy is NONE."""
    check_subject(request.subject, "subject", wildcards=False)
    check_ack(request.ackInbox, int(request.ackPolicy))
    check_user_headers(request.headers.keys())
    check_size(ctx, request.key, request.value, request.headers)
    policy = int(request.ackPolicy)
    inbox = request.ackInbox
    if policy != Acks.NONE and not inbox:
        inbox = f"_INBOX.tidelog.{secrets.token_hex(8)}"
    message = api_pb2.Message(
        key=request.key,
        value=request.value,
        subject=request.subject,
        ackInbox=inbox,
        correlationId=request.correlationId,
        ackPolicy=request.ackPolicy,
    )
    for k, v in request.headers.items():
        message.headers[k] = v
    payload = encode_envelope(MessageType.PUBLISH, message.SerializeToString())
    if policy == Acks.NONE:
        await ctx.nc.publish(request.subject, payload)
        return api_pb2.PublishToSubjectResponse()
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def on_ack(msg: Any) -> None:
        if not got.done():
            got.set_result(msg.data)

    sub = await ctx.nc.subscribe(inbox, cb=on_ack, max_msgs=1)
    try:
        await ctx.nc.publish(request.subject, payload)
        try:
            data = await asyncio.wait_for(got, timeout)
        except TimeoutError:
            raise RequestTimeoutError(
                f"no stream acknowledged the message on subject {request.subject!r} within {timeout:.3f}s"
            ) from None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    env = parse_envelope(data)
    ack = api_pb2.Ack()
    if env is not None and env.msg_type is MessageType.ACK:
        ack.ParseFromString(bytes(env.payload))
    if ack.ackError == api_pb2.Ack.INCORRECT_OFFSET:
        raise IncorrectOffsetError("the stream refused the message's expected offset")
    return api_pb2.PublishToSubjectResponse(ack=ack)
