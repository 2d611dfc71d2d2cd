"""Wire request handlers: what every handler shares, and the produce handler.

A handler is a coroutine ``(env, correlation_id, request_header, payload) -> Reply``. It only turns a request
into reply buffers or raises; the session (:mod:`tidelog.api.wire.session`) owns the socket, the order of
replies, and turning exceptions into error frames through the one error table. Handlers are thin (Gazette's
rule): the rules of writing and reading live in :class:`~tidelog.broker.partitions.partition.Partition`, stream
administration in :class:`~tidelog.broker.streams.StreamAdmin`. One module per family: produce here, reads in
:mod:`tidelog.api.wire.fetch`, administration and metadata in :mod:`tidelog.api.wire.admin`; the server
(:mod:`tidelog.api.wire.server`) assembles the op → handler table from the three.

Every produced batch is checked before anything is stored
(:func:`~tidelog.storage.batch_check.check_produced`: records that decode, none above ``max_message_bytes``,
timestamps within ``max_timestamp_ahead_ms`` of the broker's clock): an invalid batch is INVALID_ARGUMENT, a
record too large MESSAGE_TOO_LARGE, and nothing of the request is written. A batch too irregular to check
quickly is checked off the loop, the connection's later produces to the partition waiting their turn
(:mod:`tidelog.api.wire.produce_turns`).

Produce and the ack policies:

- ``LEADER`` / ``ALL``: the response is built once :meth:`Partition.write` returns, i.e. once the policy is met
  (``ALL``: below the high watermark, which under flush ``always`` also means fsynced). A refusal
  (:class:`~tidelog.broker.partitions.write_path.WriteRefused`) is the error frame of its code; so is any failure,
  including a TIMEOUT after the write. With ``ALL`` on a replicated partition the response is usually
  written from inside the follower acknowledgement that commits the batches (:class:`_CommittedReply`, through
  the session's ``reply_now``), a turn of the loop before the handler's task would resume and write it.
- Idempotent producers (batches carrying a producer id): a retry of batches already written is answered like
  the first attempt, with the original offsets (for ``ALL`` once they are committed), and writes nothing; a
  gap, an older epoch or an unknown producer is an error frame (:meth:`Partition.write` decides).
- ``NONE``: the partition is looked up and the batches checked first (an unknown stream, a follower or an
  invalid batch still gets an error frame), then the append is *started* and the response (offsets -1) is sent
  without waiting for the write. Appends start in request order, so a producer's batches still land in the
  order it sent them; a failure after that point (read-only partition, full disk) is logged on the broker and
  never reported. That is Kafka's ``acks=0`` contract, except that a frame still comes back: correlation ids
  and the in-order reply queue work the same for every policy, and the producer learns about unknown streams
  and invalid batches at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from tidelog.api.principals import ANONYMOUS, ConnectionIdentity
from tidelog.api.wire.produce_turns import ProduceTurns
from tidelog.broker.appends.streamed import ConnectionAppends
from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.write_path import WriteRefused
from tidelog.protocol.errors import NotLeaderError, PartitionPausedError
from tidelog.protocol.frames import BODY_FIXED_SIZE, PREFIX, WIRE_VERSION, BytesLike, Kind, Op
from tidelog.protocol.message_codec import encode_header, encode_message
from tidelog.protocol.messages import Acks, Header, ProduceRequest, ProduceResponse
from tidelog.storage.batch_check import ProduceLimits
from tidelog.storage.log import Log
from tidelog.storage.log_read import FileRange

log = logging.getLogger(__name__)

# -- what handlers share ----------------------------------------------------------------------------------------


class Reply(NamedTuple):
    """What a handler answers: frame buffers for ``writelines``, then optionally a file range.

    When ``file`` is set, ``buffers`` hold a frame whose declared length already counts ``file.length`` payload
    bytes (see :func:`frame_with_file`), and the session sends those bytes straight from the segment file
    (``os.sendfile``). The session owns the range's descriptor from then on and closes it once sent, or when
    the connection fails first.
    """

    buffers: list[BytesLike]
    file: FileRange | None = None

    def close(self) -> None:
        """Release the file range, if any (a reply sent, or one that never will be)."""
        if self.file is not None:
            self.file.close()


def _never_now(_slot: asyncio.Future[Any], _reply: Reply) -> bool:
    return False


SENT = Reply([])
"""What a handler returns once its reply went out through :attr:`HandlerEnv.reply_now`."""


ReplyNow = Callable[["asyncio.Future[Any]", Reply], bool]
"""Write the reply of a request at once, given its slot (its handler task, or the future a ``park`` hook
returned), from outside that task; False when the session cannot (see
:meth:`~tidelog.api.wire.session.Session.reply_now`): the reply then goes the usual way."""


@dataclass(frozen=True, slots=True)
class HandlerEnv:
    """What handlers may use besides the request: the broker, and what the server and session own."""

    broker: BrokerContext
    winding_down: asyncio.Future[None]  # resolved once the session takes no more requests: long-polls answer now
    zero_copy: bool  # plain TCP: a fetch may reply with a file range for os.sendfile
    background: set[asyncio.Task[Any]] = field(default_factory=set)  # acks NONE appends; the server awaits them
    appends: ConnectionAppends = field(default_factory=ConnectionAppends)  # its uncommitted transactional appends
    produce_turns: ProduceTurns = field(default_factory=ProduceTurns)  # its produces checked off the loop
    reply_now: ReplyNow = _never_now  # the session's, for a reply produced outside its handler task
    identity: ConnectionIdentity = field(default_factory=lambda: ConnectionIdentity(ANONYMOUS))  # who it is


H = TypeVar("H", bound=Header)
Handler = Callable[[HandlerEnv, int, Any, memoryview], Coroutine[Any, Any, Reply]]


Admit = Callable[[HandlerEnv, Any], None]
Park = Callable[[HandlerEnv, int, Any], "asyncio.Future[Reply] | None"]


@dataclass(frozen=True, slots=True)
class Route:
    """The request header type of an op, the coroutine that serves it, and optionally what to do the moment
    the request is read (``admit``), before its handler task first runs a turn of the loop later, and a way
    to serve it with no task at all (``park``: the future of its reply, or None for the handler to serve it)."""

    request: type[Header]
    handle: Handler
    admit: Admit | None = None
    park: Park | None = None


def route(
    request: type[H],
    handle: Callable[[HandlerEnv, int, H, memoryview], Coroutine[Any, Any, Reply]],
    admit: Callable[[HandlerEnv, H], None] | None = None,
    park: Callable[[HandlerEnv, int, H], asyncio.Future[Reply] | None] | None = None,
) -> Route:
    """A :class:`Route`, checked by mypy to pair a header type with a handler (and an ``admit`` hook: it must
    not raise, and the handler must not depend on it having run; and a ``park`` hook, run after ``admit``: it
    must not raise, and the future it returns is settled exactly once, with the reply or the error to answer)
    taking exactly that type."""
    return Route(request, handle, admit, park)


def frame_with_file(op: int, correlation_id: int, header: Header, file: FileRange) -> Reply:
    """A response frame whose payload is ``file``'s byte range, sent later without passing through Python.

    :func:`~tidelog.protocol.frames.encode_frame` needs the payload in memory to count it; here only its
    length is known, so the 16-byte prefix is packed with the same layout and that length.
    """
    encoded = encode_header(header)
    length = BODY_FIXED_SIZE + len(encoded) + file.length
    prefix = PREFIX.pack(length, WIRE_VERSION, Kind.RESPONSE, op, correlation_id, len(encoded))
    return Reply([prefix, encoded], file)


def batches_reply(
    env: HandlerEnv, op: int, correlation_id: int, header: Header, log: Log, offset: int, max_bytes: int, limit: int
) -> Reply:
    """``header`` with whole batches of ``log`` from ``offset`` below ``limit``: a file range for ``os.sendfile``
    on a plain TCP session, the bytes read into memory otherwise (TLS); just the header when there are none."""
    if env.zero_copy:
        file = log.read_range(offset, max_bytes, max_offset=limit)
        if file is None:
            return Reply(encode_message(correlation_id, header))
        return frame_with_file(op, correlation_id, header, file)
    return Reply(encode_message(correlation_id, header, log.read(offset, max_bytes, max_offset=limit)))


# -- produce ------------------------------------------------------------------------------------------------------

_NO_OFFSETS = ProduceResponse(-1, -1)


async def produce(env: HandlerEnv, correlation_id: int, request: ProduceRequest, payload: memoryview) -> Reply:
    """Append the payload's batches to the partition; answer once the ack policy is met (see module doc)."""
    try:
        partition = env.broker.manager.leader_of(request.stream, request.partition)
    except (PartitionPausedError, NotLeaderError):  # a produce resumes a paused partition (not on the hot path)
        partition = await env.broker.writable(request.stream, request.partition)
    config = env.broker.config
    limits = ProduceLimits.of(
        config.max_message_bytes, partition.log.config.max_batch_bytes, config.max_timestamp_ahead_ms
    )
    key = (request.stream, request.partition)
    # Before anything is stored, whatever the ack policy; in request order (see produce_turns).
    turn = await env.produce_turns.check(key, payload, limits, time.time_ns())
    try:
        timeout = request.timeout_ms / 1000 if request.timeout_ms else env.broker.ack_timeout
        if request.acks is Acks.NONE:
            task = asyncio.get_running_loop().create_task(partition.append(payload, request.acks, timeout))
            env.produce_turns.release(key, turn)
            env.background.add(task)
            task.add_done_callback(_unacknowledged_done)
            task.add_done_callback(env.background.discard)
            return Reply(encode_message(correlation_id, _NO_OFFSETS))
        if request.acks is Acks.ALL:
            reply = _CommittedReply(env, correlation_id)
            writing = partition.write(payload, request.acks, timeout, on_committed=reply)
            env.produce_turns.release(key, turn)  # those behind wake after this append has placed its batches
            status = await writing
            if reply.sent:
                return SENT
        else:
            writing = partition.write(payload, request.acks, timeout)
            env.produce_turns.release(key, turn)
            status = await writing
    finally:
        env.produce_turns.release(key, turn)
    if isinstance(status, WriteRefused):
        raise status.error()  # the session answers it with the error frame of its code
    return Reply(encode_message(correlation_id, ProduceResponse(status.base_offset, status.last_offset)))


class _CommittedReply:
    """Answers an acks-ALL produce from inside the acknowledgement that commits it (:meth:`Partition.write`'s
    ``on_committed``): the second follower's fetch is read, the high watermark passes the batches, and the
    response goes to the producer's socket there and then, instead of after the handler's task resumes through
    the append's awaits (a loop turn and some Python on a replicated write's critical path; see
    docs/performance.md).

    Made in the handler's task, which is the session's slot for the request. ``sent`` says whether the reply
    went; if not (the session could not write at once), the handler answers as usual when it resumes."""

    __slots__ = ("_correlation_id", "_env", "_task", "sent")

    def __init__(self, env: HandlerEnv, correlation_id: int) -> None:
        self._env = env
        self._correlation_id = correlation_id
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.sent = False

    def __call__(self, base_offset: int, last_offset: int) -> None:
        reply = Reply(encode_message(self._correlation_id, ProduceResponse(base_offset, last_offset)))
        self.sent = self._env.reply_now(self._task, reply)


def _unacknowledged_done(task: asyncio.Task[Any]) -> None:
    """Nobody awaits an acks-NONE append: without this its failure would vanish without a trace."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("unacknowledged produce (acks NONE) failed: %s", exc)


ROUTES: dict[int, Route] = {Op.PRODUCE: route(ProduceRequest, produce)}
