"""SESSION_FETCH, leader side: one follower broker copies every partition it follows from this broker at once.

A follower broker sends one :class:`~tidelog.protocol.session_messages.SessionFetchRequest` at a time on one
connection, naming each partition it follows from this broker (the follower's side:
:mod:`tidelog.replication.follower.session`). Per partition, exactly what a REPLICA_FETCH does
(:mod:`tidelog.api.wire.replica`): fencing by leader epoch and replica set, the offset checked against
``[log_start, log_end]`` (OFFSET_OUT_OF_RANGE, or PARTITION_SUSPENDED beyond the end), and the offset recorded as
the follower's acknowledgement (:meth:`Partition.replica_fetched`, which moves the high watermark and the ISR),
as the request is read (:func:`acknowledge`, the route's ``admit`` hook). A refusal is that partition's entry
in the answer; the other partitions are served.

The budget. ``max_bytes`` is shared: partitions are served in request order, each at most
``partition_max_bytes``, until the budget is spent; the first batch of the answer comes whole even when it is
larger (else a batch over the budget could never be copied), later ones only if they fit. The follower rotates
the order each round (:func:`~tidelog.protocol.session_messages.rotated`), so a partition that always has data
cannot keep the others out. A partition with no data and no news (its high watermark is the one the follower
already holds) is left out of the answer: an idle partition costs a few bytes of request per round.

The long-poll. When no partition has anything to say, the fetch waits *parked* (:func:`park_session`, the
route's ``park`` hook): one :class:`_SessionWait` per request, with one timer, placed among the tail waiters of
every partition it names (:meth:`Partition.park_at_log_end`); the first write to any of them (or the timer, or
a partition closing, or the session winding down) answers it from the logs a turn of the loop later. No task,
and one wake-up per round however many partitions the session carries. Batches are read into memory (checked
against their CRC as they are read), never sent with ``os.sendfile``: one frame carries many partitions.

The reassignment throttle (:mod:`~tidelog.api.wire.reassign_throttle`). A partition whose replica is being added
under a throttle is served only once what it was sent before is paid for, and is charged for what it is sent;
held back, it is left for a later round. When held-back partitions are all an answer would carry, the answer
waits until the first is due (at most the request's ``max_wait_ms``), so a throttled copy never spins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from tidelog.api.wire import reassign_throttle
from tidelog.api.wire.fetch import MAX_FETCH_BYTES
from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.api.wire.replica import out_of_range, record_ack
from tidelog.broker.partitions.partition import Partition
from tidelog.protocol.errors import TidelogError, UnavailableError
from tidelog.protocol.frames import Op
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.session_messages import (
    SessionFetchEntry,
    SessionFetchPartition,
    SessionFetchRequest,
    SessionFetchResponse,
)
from tidelog.storage.file_writes import Buffer

log = logging.getLogger(__name__)


def acknowledge(env: HandlerEnv, request: SessionFetchRequest) -> None:
    """The route's ``admit`` hook: record every entry's acknowledgement the moment the request is read (as
    :func:`tidelog.api.wire.replica.acknowledge` does for one partition). A refused entry acknowledges nothing."""
    for entry in request.entries:
        try:
            partition = env.broker.manager.leader_of(entry.stream, entry.partition)
        except TidelogError:
            continue
        record_ack(partition, request.replica_id, entry.leader_epoch, entry.offset)


async def session_fetch(
    env: HandlerEnv, correlation_id: int, request: SessionFetchRequest, _payload: memoryview
) -> Reply:
    """Every partition with something to say, at once; see the module docstring."""
    held: list[float] = []
    parts, chunks = collect(env, request, held)
    if held and not chunks:  # only throttled partitions had data, none of them due yet: wait once
        await asyncio.sleep(min(min(held), request.max_wait_ms / 1000))
        parts, chunks = collect(env, request)
    return Reply(encode_message(correlation_id, SessionFetchResponse(tuple(parts)), chunks))


def answer(env: HandlerEnv, correlation_id: int, request: SessionFetchRequest) -> Reply:
    """The response to ``request`` as the logs stand now, within its shared budget."""
    parts, chunks = collect(env, request)
    return Reply(encode_message(correlation_id, SessionFetchResponse(tuple(parts)), chunks))


def collect(
    env: HandlerEnv, request: SessionFetchRequest, held: list[float] | None = None
) -> tuple[list[SessionFetchPartition], list[bytes]]:
    """The parts of the answer and their batches; ``held`` collects, for each partition the reassignment
    throttle held back, the seconds until it is due."""
    budget = min(request.max_bytes, MAX_FETCH_BYTES)
    per_partition = min(request.partition_max_bytes, budget) if budget else 0
    parts: list[SessionFetchPartition] = []
    chunks: list[bytes] = []
    left = budget
    for entry in request.entries:
        part, data = serve_entry(env, request.replica_id, entry, min(per_partition, left), first=not chunks, held=held)
        if part is None:
            continue
        parts.append(part)
        if data:
            chunks.append(data)
            left = max(0, left - len(data))
    return parts, chunks


def serve_entry(
    env: HandlerEnv,
    replica_id: str,
    entry: SessionFetchEntry,
    max_bytes: int,
    *,
    first: bool,
    held: list[float] | None = None,
) -> tuple[SessionFetchPartition | None, bytes]:
    """One partition's part of the answer and its batches; ``(None, b"")`` when it has nothing to say.

    At most ``max_bytes`` of batches (none when 0), except that the ``first`` batches of the answer come whole."""
    try:
        partition = env.broker.manager.leader_of(entry.stream, entry.partition)
    except TidelogError as exc:
        return SessionFetchPartition(entry.stream, entry.partition, 0, 0, 0, 0, 0, exc.to_error_body()), b""
    try:
        refusal = partition.fence_follower(replica_id, entry.leader_epoch)
        if refusal is not None:
            return _bounds(entry, partition, error=refusal), b""
        offset = entry.offset
        if not partition.local_log_start <= offset <= partition.log_end:
            return _bounds(entry, partition, error=out_of_range(partition, replica_id, offset)), b""
        partition.replica_fetched(replica_id, offset)  # harmless when acknowledge() already did
        end = partition.log_end
        data = b""
        wait = reassign_throttle.held_for(partition, partition.record, replica_id) if offset < end else 0.0
        if wait > 0:
            if held is not None:
                held.append(wait)
        elif offset < end and (max_bytes > 0 or first):
            cap = reassign_throttle.answer_cap(partition.record, replica_id, max(max_bytes, 1))
            data = partition.log.read(offset, cap, max_offset=end)
            if len(data) > max_bytes and not first:
                data = b""  # over what is left of the budget: the next round (the follower rotates)
            reassign_throttle.charge_bytes(partition, partition.record, replica_id, len(data))
        if not data and partition.high_watermark == entry.known_hw and offset == end:
            return None, b""
        return _bounds(entry, partition, size=len(data)), data
    except TidelogError as exc:  # damaged offsets, a partition closing…: this partition's error alone
        return _bounds(entry, partition, error=exc), b""
    except OSError as exc:
        log.warning("session fetch of %s failed reading the log: %s", partition.name, exc)
        error = UnavailableError(f"{partition.name}: reading the log failed: {exc}")
        return _bounds(entry, partition, error=error), b""


def _bounds(
    entry: SessionFetchEntry, partition: Partition, *, size: int = 0, error: TidelogError | None = None
) -> SessionFetchPartition:
    body = None if error is None else error.to_error_body()
    return SessionFetchPartition(
        entry.stream,
        entry.partition,
        partition.high_watermark,
        partition.local_log_start,
        partition.log_end,
        partition.record.leader_epoch,
        size,
        body,
    )


def park_session(env: HandlerEnv, correlation_id: int, request: SessionFetchRequest) -> asyncio.Future[Reply] | None:
    """The route's ``park`` hook: a session fetch where no partition has anything to say waits as one
    :class:`_SessionWait`; None (the handler answers at once) when any has."""
    if not request.max_wait_ms or not request.entries or env.winding_down.done():
        return None
    places: list[tuple[Partition, int]] = []
    for entry in request.entries:
        try:
            partition = env.broker.manager.leader_of(entry.stream, entry.partition)
        except TidelogError:
            return None  # an error to report: answer now
        if (
            entry.offset != partition.log_end
            or partition.high_watermark != entry.known_hw
            or partition.fence_follower(request.replica_id, entry.leader_epoch) is not None
        ):
            return None
        places.append((partition, entry.offset))
    wait = _SessionWait(env, correlation_id, request, places)
    if not wait.park():
        return None
    wait.start(request.max_wait_ms / 1000)
    return wait.reply


class _SessionWait:
    """A session fetch waiting until any of its partitions is written: one timer and one object, placed among
    the tail waiters of each partition (see the module docstring). Whatever ends the wait answers from the logs
    a turn of the loop later, once the write is in."""

    __slots__ = ("_correlation_id", "_env", "_places", "_request", "_scheduled", "_timer", "reply")

    def __init__(
        self,
        env: HandlerEnv,
        correlation_id: int,
        request: SessionFetchRequest,
        places: list[tuple[Partition, int]],
    ) -> None:
        self._env = env
        self._correlation_id = correlation_id
        self._request = request
        self._places = places
        self._timer: asyncio.TimerHandle | None = None
        self._scheduled = False
        self.reply: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

    def park(self) -> bool:
        """Join every partition's tail waiters; False (and none joined) when one is closing."""
        for index, (partition, offset) in enumerate(self._places):
            try:
                partition.park_at_log_end(offset, self)
            except TidelogError:
                for joined, at in self._places[:index]:
                    joined.unpark(at, self)
                return False
        return True

    def start(self, timeout: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(timeout, self._answer)
        self._env.winding_down.add_done_callback(self._wind_down)
        self.reply.add_done_callback(self._leave)

    def written(self, batches: Sequence[Buffer] | None, size: int, log_end: int) -> None:
        self._soon()

    def closed(self, error: TidelogError) -> None:
        self._soon()  # that partition answers with its error; the others are served

    def _soon(self) -> None:
        if not self._scheduled and not self.reply.done():
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._answer)

    def _wind_down(self, _winding_down: asyncio.Future[None]) -> None:
        self._answer()

    def _answer(self) -> None:
        if self.reply.done():
            return
        try:
            reply = answer(self._env, self._correlation_id, self._request)
        except Exception as exc:  # the session answers with the error frame, as for a handler's
            self.reply.set_exception(exc)
            return
        self.reply.set_result(reply)

    def _leave(self, _reply: asyncio.Future[Reply]) -> None:
        """Answered, or dropped by the session: stop the timer, leave every partition's waiters."""
        if self._timer is not None:
            self._timer.cancel()
        self._env.winding_down.remove_done_callback(self._wind_down)
        for partition, offset in self._places:
            partition.unpark(offset, self)


ROUTES: dict[int, Route] = {
    Op.SESSION_FETCH: route(SessionFetchRequest, session_fetch, acknowledge, park_session),
}
