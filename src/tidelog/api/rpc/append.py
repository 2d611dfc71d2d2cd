"""The ``tidelog.v1`` Append RPC: transactional appends over gRPC, for clients in other languages (issue 5).

It is the wire protocol's APPEND op (:mod:`tidelog.api.wire.append`) in another framing, driven through the
same :class:`~tidelog.broker.appends.streamed.OpenAppend` with the same limits (:func:`limits_of`): the expected
offset prechecked when the header arrives, records spooled as they arrive, the minimum-rate flow control, and
the commit in the partition's write turn. ``tidelog/v1/append.proto`` is the client's description; on this side:

- One RPC is one append. The header rides on the first message, records on any message, ``commit`` on the last.
  Records arrive as protobuf messages and are encoded here by one
  :class:`~tidelog.protocol.records.BatchBuilder` per append, so offset deltas run on across messages exactly as
  the wire client's chunks do (the proto file says why the API takes records rather than encoded bytes).
- A failure decided while the append streams (an expected offset the log has passed, a header on a later
  message, a client below the minimum rate, an append above ``max_append_bytes``) is answered at once: the
  RPC ends with that status and the client's further sends fail, rather than streaming on for nothing.
- The stream ending without ``commit`` aborts: nothing is written and no offset is used. Why not "the client
  half-closing commits": grpc.aio ends the request iterator the same way for a half-close, a cancelled call
  and a dropped connection, and the cancellation reaches the handler only at its next ``await`` — inside a
  commit, possibly after the log has placed the batch. Only an explicit marker keeps "a cancelled append
  writes nothing" true (Gazette's Append requires a final empty chunk before EOF for the same reason).

Outcomes of the append are statuses in the response, with the log end and registers, as on the wire. Errors
that cannot be tied to an append — an unknown stream or partition, a broker that does not lead it, a malformed
header — are raised, and the servicer turns them into gRPC statuses through the one error table
(:mod:`tidelog.api.rpc.service`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar, cast

from tidelog.api.wire.append import limits_of
from tidelog.broker.appends.commit import AppendRefused, Committed, Expectations, committer_of
from tidelog.broker.appends.streamed import OpenAppend
from tidelog.broker.context import BrokerContext
from tidelog.protocol._gen.tidelog.v1 import append_pb2 as pb
from tidelog.protocol.errors import ErrorCode, InvalidArgumentError
from tidelog.protocol.labels import (
    LabelSelector,
    LabelSet,
    RegisterError,
    encode_labels,
    encode_selector,
)
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import BatchBuilder

T = TypeVar("T")
M = TypeVar("M")

_ACKS = {pb.ACKS_UNSPECIFIED: Acks.ALL, pb.ACKS_LEADER: Acks.LEADER, pb.ACKS_ALL: Acks.ALL}

_append_ids = itertools.count(1)  # broker-wide: ids name appends in messages and in GrpcAppends


class GrpcAppends:
    """The Append RPCs of one broker, and the appends they have open, which tests and operators can watch."""

    def __init__(self, ctx: BrokerContext) -> None:
        self._ctx = ctx
        self._open: dict[int, OpenAppend] = {}
        self._progress = asyncio.Event()  # set and replaced whenever an append opens, receives a message or ends

    def in_flight(self) -> tuple[OpenAppend, ...]:
        """The appends begun and not yet committed or dropped."""
        return tuple(self._open.values())

    async def wait_for(self, condition: Callable[[tuple[OpenAppend, ...]], bool]) -> None:
        """Return once ``condition(in_flight())`` holds, checking it at each change rather than on a timer."""
        while True:
            progress = self._progress
            if condition(self.in_flight()):
                return
            await progress.wait()

    def _changed(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    async def append(self, requests: AsyncIterator[pb.AppendRequest], context: Any) -> pb.AppendResponse:
        """Serve one Append RPC (see the module docstring); ``context`` is the call's ``ServicerContext``."""
        first = await anext(requests, None)
        if first is None or not first.HasField("header"):
            raise InvalidArgumentError("append: the first message must carry the header")
        header = first.header
        if not header.stream:
            raise InvalidArgumentError("append: the header needs a stream")
        expectations = expectations_of(header)
        acks = _ACKS.get(header.acks)
        if acks is None:
            raise InvalidArgumentError(f"append: unknown acks {header.acks}")
        partition = await self._ctx.writable(header.stream, header.partition)
        first_timestamp = time.time_ns()
        opened = OpenAppend(
            next(_append_ids),
            partition,
            expectations,
            first_timestamp,
            acks,
            self._ack_timeout(header.timeout_ms, context.time_remaining()),
            limits_of(self._ctx),
        )
        self._open[opened.append_id] = opened
        try:
            return await self._stream(opened, BatchBuilder(first_timestamp), first, requests)
        finally:
            del self._open[opened.append_id]
            self._changed()

    async def _stream(
        self,
        opened: OpenAppend,
        records: BatchBuilder,
        first: pb.AppendRequest,
        requests: AsyncIterator[pb.AppendRequest],
    ) -> pb.AppendResponse:
        """Spool the messages of ``opened`` (encoded by ``records``, one encoder for the whole append, so offset
        deltas run on) until its commit, a failure, or the end of the stream."""
        committing = False
        try:
            opened.precheck()
            message: pb.AppendRequest | None = first
            while message is not None and opened.failure is None:
                if message is not first and message.HasField("header"):
                    opened.fail(_invalid(opened, "only the first message may carry a header"))
                    break
                opened.add(memoryview(_encode(records, message.records)))
                if message.commit:
                    committing = True
                    outcome = await opened.commit()
                    return _refusal(outcome) if isinstance(outcome, AppendRefused) else _committed(outcome)
                self._changed()
                message = await _next(requests, opened.failed)
            if opened.failure is None:  # the stream ended: a cancel, a lost connection, or a client that forgot
                opened.fail(_invalid(opened, "the stream ended without a message setting commit; nothing was written"))
            assert opened.failure is not None
            return _refusal(opened.failure)
        finally:
            if not committing:
                opened.abort()  # nothing was written; the spool goes now

    def _ack_timeout(self, timeout_ms: int, remaining: float | None) -> float:
        """The header's timeout or the broker's default, cut to the call's deadline (a little less, to answer)."""
        timeout = timeout_ms / 1000 if timeout_ms else self._ctx.ack_timeout
        return timeout if remaining is None else max(0.0, min(timeout, remaining - 0.01))


async def _next(requests: AsyncIterator[pb.AppendRequest], failed: asyncio.Future[None]) -> pb.AppendRequest | None:
    """The client's next message, or None when the stream ended or the append failed first."""
    read = asyncio.ensure_future(anext(requests, None))
    try:
        await asyncio.wait((read, failed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not read.done():
            read.cancel()  # the append failed, or this RPC is being cancelled: nothing more will be read
    return read.result() if read.done() and not read.cancelled() else None


def _encode(builder: BatchBuilder, records: Iterable[pb.Record]) -> bytes:
    """Encode one message's records after the append's earlier ones (unset key or value: null)."""
    for record in records:
        builder.append(
            record.value if record.HasField("value") else None,
            record.key if record.HasField("key") else None,
            [(header.name, header.value) for header in record.headers],
            record.timestamp or None,
        )
    return builder.drain()


# ------------------------------------------------------------------------------------------ conversions


def expectations_of(header: pb.AppendHeader) -> Expectations:
    """The expectations an ``AppendHeader`` carries, under the wire protocol's register limits;
    INVALID_ARGUMENT names the field that breaks them."""
    expected = header.expected_offset if header.HasField("expected_offset") else None
    if expected is not None and expected < 0:
        raise InvalidArgumentError(f"append: expected_offset {expected} is negative")
    checked = header.HasField("check_registers")  # an unset selector is no check; an empty one selects all
    return Expectations(
        expected_offset=expected,
        check_registers=_field("check_registers", _selector_of, header.check_registers) if checked else None,
        union_registers=_field("union_registers", _labels_of, header.union_registers),
        subtract_registers=_field("subtract_registers", _labels_of, header.subtract_registers),
    )


def _field(name: str, convert: Callable[[M], T], message: M) -> T:
    try:
        return convert(message)
    except RegisterError as exc:
        raise InvalidArgumentError(f"append: {name}: {exc}") from None


def _labels_of(message: pb.LabelSet) -> LabelSet:
    labels = LabelSet((label.name, label.value) for label in message.labels)
    encode_labels(labels)  # the wire protocol's limits: at most MAX_REGISTER_LABELS and MAX_REGISTER_BYTES
    return labels


def _selector_of(message: pb.LabelSelector) -> LabelSelector:
    selector = LabelSelector(_labels_of(message.include), _labels_of(message.exclude))
    encode_selector(selector)
    return selector


def label_set(labels: LabelSet) -> pb.LabelSet:
    """``labels`` as a ``tidelog.v1.LabelSet``."""
    return pb.LabelSet(labels=[pb.Label(name=label.name, value=label.value) for label in labels])


def _committed(committed: Committed) -> pb.AppendResponse:
    return pb.AppendResponse(
        status=pb.STATUS_OK,
        base_offset=committed.base_offset,
        last_offset=committed.last_offset,
        log_end=committed.log_end,
        registers=label_set(committed.registers),
    )


def _refusal(refused: AppendRefused) -> pb.AppendResponse:
    return pb.AppendResponse(
        status=cast("pb.Status", int(refused.code)),  # numbers are ErrorCode's (tests/protocol/test_append_proto.py)
        message=refused.message,
        base_offset=-1,
        last_offset=-1,
        log_end=refused.log_end,
        registers=label_set(refused.registers),
    )


def _invalid(opened: OpenAppend, reason: str) -> AppendRefused:
    """An INVALID_ARGUMENT outcome of ``opened``, with the partition's log end and registers as they are."""
    partition = opened.partition
    return AppendRefused(
        ErrorCode.INVALID_ARGUMENT,
        f"append {opened.append_id} to {partition.name}: {reason}",
        partition.log.end_offset,
        committer_of(partition).registers.latest_known(),
    )
