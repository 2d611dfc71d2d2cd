"""``PublishAsync`` in a front: the broker's batching (:mod:`tidelog.api.rpc.publish_batches`), each run sent as
one wire protocol produce straight to its partition's leader.

Everything per message stays as on the broker: the checks, the ack with the message's own offset once the leader
has answered the produce (never before: a front acknowledges only what a leader stored per the ack policy), the
ack published on the ack inbox, the copy on the partition's NATS subject (tagged, so the stream's own ingest
leaves it out). A front has no partitions, so where the broker would write locally it forwards, as a broker does
for a partition it does not lead.

What the front does not know for certain it does not decide: a run for a stream its metadata does not hold (yet),
a partition without a leader, or a stream with optimistic concurrency control (whose expected offsets are checked
where the leader assigns offsets), a partition paused, read-only or suspended, and messages expecting an offset of
a partition another broker leads go to the broker whole, as one ``PublishAsync`` call on the loopback port, and
their responses, errors included, are the broker's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from tidelog.api.rpc.publish_batches import ForwardTarget, PublishBatches, Target, async_error
from tidelog.broker.context import BrokerContext
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.errors import UnavailableError
from tidelog.protocol.messages import Acks

MIRROR_WAIT = 0.5
"""Seconds a run for a partition the front's metadata does not know yet waits for it, once per call."""

Request = api_pb2.PublishRequest
Response = api_pb2.PublishResponse


class FrontBatches(PublishBatches):
    """One ``PublishAsync`` call in a front (module docstring). ``ctx`` holds the front's metadata mirror, its
    connections to the brokers (``peers``) and its NATS connection; ``broker`` is the broker's own service."""

    def __init__(self, ctx: BrokerContext, broker: api_pb2_grpc.APIStub) -> None:
        super().__init__(ctx)
        self._broker = broker
        self._awaited: set[tuple[str, int]] = set()

    async def _run(self, run: list[Request]) -> list[Response]:
        first = run[0]
        key = (first.stream, first.partition)
        snap = self._ctx.mirror.snapshot
        if not _leads(snap, key) and key not in self._awaited:
            # Just created (through this front, a moment ago)? The mirror follows etcd a little behind the
            # broker's: wait for it once per partition and call, briefly, before giving the run to the broker.
            self._awaited.add(key)
            with contextlib.suppress(TimeoutError):
                snap = await self._ctx.mirror.wait_for(lambda s: _leads(s, key), MIRROR_WAIT)
        if self._broker_decides(snap, run):
            return await self._relay(run)
        return await super()._run(run)

    def _broker_decides(self, snap: MetadataSnapshot, run: list[Request]) -> bool:
        """Whether the run goes to the broker whole (module docstring): what the front's metadata cannot settle,
        and the rare states whose answers the broker words (paused: resumed by the write; read-only; suspended),
        and expected offsets for a partition another broker leads (the broker refuses those, NOT_LEADER)."""
        first = run[0]
        stream = snap.stream(first.stream)
        meta = snap.partition(first.stream, first.partition)
        if stream is None or meta is None or not meta.leader or stream.config.optimistic_concurrency_control:
            return True
        if meta.paused or meta.readonly or meta.suspended:
            return True
        return meta.leader != self._ctx.broker_id and any(each.expectedOffset not in (-1, 0) for each in run)

    async def _target(self, first: Request, places: Sequence[Any]) -> Target | None:
        snap = self._ctx.mirror.snapshot
        stream = snap.stream(first.stream)
        meta = snap.partition(first.stream, first.partition)
        assert stream is not None and meta is not None and meta.leader  # _run relays runs without them
        subject = stream.partition_subject(first.partition)
        return ForwardTarget(self._ctx, stream.name, first.partition, stream.group, subject, meta.leader)

    async def _relay(self, run: list[Request]) -> list[Response]:
        """The run through the broker's own ``PublishAsync``: its answers, in order, exactly as it gives them."""
        answers: list[Response] = []
        try:
            async for response in self._broker.PublishAsync(_each(run), timeout=self._ctx.ack_timeout + 5.0):
                answers.append(response)
        except grpc.aio.AioRpcError as exc:
            if answers:  # some were answered: the broker's call broke after them, the rest are unknown
                answered = {each.correlationId for each in answers}
                unanswered = [each for each in run if each.correlationId not in answered]
            else:
                unanswered = run
            failure = UnavailableError(f"the broker did not answer: {exc.code().name} {exc.details() or ''}".strip())
            answers.extend(async_error(each, failure) for each in unanswered if int(each.ackPolicy) != Acks.NONE)
        return answers


def _leads(snap: MetadataSnapshot, key: tuple[str, int]) -> bool:
    """The mirror knows the partition's stream and leader."""
    meta = snap.partition(*key)
    return meta is not None and bool(meta.leader) and snap.stream(key[0]) is not None


async def _each(run: list[Request]) -> AsyncIterator[Request]:
    for request in run:
        yield request


async def front_publish_async(
    ctx: BrokerContext, broker: api_pb2_grpc.APIStub, requests: AsyncIterator[Request]
) -> AsyncIterator[Response]:
    """``PublishAsync`` served by a front."""
    async for response in FrontBatches(ctx, broker).serve(requests):
        yield response
