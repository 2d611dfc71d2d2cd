"""INIT_PRODUCER: an idempotent producer's id and epoch, before its first batch.

Any broker answers: the allocator (:mod:`tidelog.metadata.producer_ids`) takes ids and epochs from etcd by
compare-and-swap, so neither the controller nor the partition leaders take part. The batches that follow carry
the id, the epoch and per-partition sequence numbers, and each partition leader dedupes them
(:mod:`tidelog.replication.idempotence.producer_state`).
"""

from __future__ import annotations

import asyncio

from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.protocol.errors import UnsupportedError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.messages import InitProducerRequest, InitProducerResponse


async def init_producer(
    env: HandlerEnv, correlation_id: int, request: InitProducerRequest, _payload: memoryview
) -> Reply:
    """A fresh id (anonymous) or the name's id with its next epoch (fencing older instances of the name)."""
    allocator = env.broker.producer_ids
    if allocator is None:
        raise UnsupportedError("this broker was assembled without a producer id allocator")
    timeout = request.timeout_ms / 1000 if request.timeout_ms else env.broker.ack_timeout
    async with asyncio.timeout(timeout):  # a TimeoutError answers TIMEOUT through the error table
        producer_id, epoch = await allocator.init_producer(request.name)
    return Reply(encode_message(correlation_id, InitProducerResponse(producer_id, epoch)))


ROUTES: dict[int, Route] = {Op.INIT_PRODUCER: route(InitProducerRequest, init_producer)}
