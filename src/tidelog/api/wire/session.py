"""One client connection of the wire server: frames in, handlers run concurrently, replies out in order.

Two halves per connection:

- **reading** happens in the transport's callback (:meth:`Session.feed`, called by the server's protocol with
  each chunk the socket delivers): it cuts the byte stream into frames (:class:`FrameDecoder`, which refuses an
  oversized frame from its length prefix alone), starts a handler task for each request *as it arrives*, and
  appends a :class:`_Slot` for it to a FIFO. A request is admitted only while fewer than ``max_in_flight``
  requests and at most ``max_in_flight_bytes`` request bytes are unanswered (one request alone is always
  admitted): the frames a read completes beyond that wait, decoded, in arrival order, and the transport's
  reading is paused until replies leave and they are all admitted. That is the connection's backpressure,
  passed on to the client through TCP. The server's :class:`~tidelog.api.wire.admission.TurnBudget` also
  bounds what all its connections admit in one turn of the loop: the rest waits for a later turn, so one read
  of thousands of tiny pipelined frames never runs thousands of handlers before other connections and the
  etcd lease keep-alive get their turn. No task reads:
  with a reader task every request cost one more turn of the loop (the task woken by the stream, then the
  handler started), and a replicated acks-ALL write has two requests on its critical path (the produce and the
  second follower's acknowledgement).
- the **writer** task writes, in FIFO order, the replies the fast path below does not. Requests therefore
  run in parallel (a produce waiting for its fsync does not hold up the next one, and appends start in
  arrival order) while replies leave in request order, so a producer's acks come back in the order it sent
  batches. It sleeps until the first slot's reply is ready and still unwritten (a done-callback on each
  reply tells it), not on every request: woken per request and again per reply, it cost two turns of the
  loop for each request the fast path then answered anyway (numbers in docs/performance.md).

Fast path. A request whose reply is ready while its slot is first in the FIFO, the writer is not sending and
the transport's buffer is empty, writes its reply itself, from its handler task, and leaves the FIFO: that
saves the loop turn of waking the writer, which matters for one request at a time (a producer awaiting every
ack). Order is kept (only the first slot may take it, and only while nothing else is being written) and so is
backpressure (a non-empty transport buffer sends replies through the writer, which drains). A reply with a
file range (a fetch) takes the fast path too: that is a replica fetch woken by a write, on the replicated
write's critical path. A small range (:data:`SMALL_FILE_BYTES`) is copied into the frame's single ``writev``
rather than sent with ``os.sendfile`` after it.

Admission. A route may have an ``admit`` hook that runs as the request is read, before the handler's task
gets its first turn of the loop: a replica fetch's acknowledgement moves the high watermark from there
(:func:`tidelog.api.wire.replica.acknowledge`), and the acks-ALL produce it commits answers from there too
(:class:`tidelog.api.wire.handlers._CommittedReply`). A route may also have a ``park`` hook, run right after:
the request is then served with no task at all, its slot being the future the hook returned (a replica fetch
waiting at the log end, :func:`tidelog.api.wire.replica.park_at_tail`).

Winding down. When the peer closes its side (EOF), the stream breaks, or the server stops, no further request
will come: long-polling fetches in progress answer at once (empty) instead of holding the connection open
until their deadline, the replies still owed are written, and the connection closes.

Idleness. :meth:`Session.idle_since` tells the server's idle sweep when the connection last read or replied,
while it has nothing in flight; the server closes it (:meth:`Session.stop_reading`) past ``wire_idle_timeout_ms``.

Authorization. With ACLs on, the server gives the session an ``authorize`` check: each request is checked, by
the connection's principal at that moment (:class:`~tidelog.api.principals.ConnectionIdentity`, which a SCRAM
login changes), right after its header decodes and before its ``admit`` hook or handler; a refusal is the
request's PERMISSION_DENIED error frame, and the connection goes on.

Errors. A handler's exception becomes an ERROR frame through the one error table, and the connection goes
on; so do an unknown op (UNSUPPORTED), a non-request frame and a header that does not decode
(INVALID_ARGUMENT). A :class:`FrameError` means the byte stream itself is lost: the replies already owed are
written, then one ERROR frame (correlation id 0: the broken frame's own cannot be trusted), then the
connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

from tidelog import telemetry
from tidelog.api.principals import ANONYMOUS, ConnectionIdentity
from tidelog.api.wire.admission import TurnBudget
from tidelog.api.wire.handlers import HandlerEnv, Reply, Route
from tidelog.api.wire.zerocopy import ShortFileError, send_range
from tidelog.broker.context import BrokerContext
from tidelog.broker.translate import as_tidelog_error
from tidelog.protocol.errors import (
    DiskFullError,
    MessageTooLargeError,
    TidelogError,
    UnavailableError,
    UnsupportedError,
)
from tidelog.protocol.frames import Frame, FrameDecoder, FrameError, FrameTooLargeError, Kind, Op, ProtocolError
from tidelog.protocol.message_codec import decode_as, encode_error

log = logging.getLogger(__name__)

SMALL_FILE_BYTES = 16 * 1024  # a file range up to this size is copied into the reply's writev, not sendfile'd

_OBSERVERS: dict[int, Callable[[float], None]] = {}  # op -> its request latency histogram's observe


def _observer(op: int) -> Callable[[float], None]:
    observe = _OBSERVERS.get(op)
    if observe is None:
        name = Op(op).name.lower() if op in Op._value2member_map_ else str(op)
        observe = _OBSERVERS[op] = telemetry.request_observer("wire", name)
    return observe


@dataclass(slots=True)
class _Slot:
    """One request's place in the reply order."""

    correlation_id: int
    op: int
    nbytes: int  # request bytes held until the reply is written (the backpressure budget)
    reply: asyncio.Future[Reply]


class Session:
    """Serves one connection until the peer leaves, the stream breaks, or the server stops it."""

    def __init__(
        self,
        broker: BrokerContext,
        routes: dict[int, Route],
        writer: asyncio.StreamWriter,
        *,
        zero_copy: bool,
        background: set[asyncio.Task[Any]],
        max_frame_bytes: int,
        max_in_flight: int,
        max_in_flight_bytes: int,
        budget: TurnBudget | None = None,
        authorize: Callable[[int, Any], None] | None = None,
        identity: ConnectionIdentity | None = None,
    ) -> None:
        """``authorize(op, header)``, when given, runs for every request before anything else does (its admit
        hook, its handler): raising PermissionDeniedError answers the request with that error frame."""
        self._authorize = authorize
        self._winding_down: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._env = HandlerEnv(
            broker,
            self._winding_down,
            zero_copy,
            background,
            reply_now=self.reply_now,
            identity=identity if identity is not None else ConnectionIdentity(ANONYMOUS),
        )
        self._routes = routes
        self._writer = writer
        self._transport = cast(asyncio.Transport, writer.transport)  # a socket transport: it can pause reading
        self._decoder = FrameDecoder(max_frame_bytes)
        self._max_in_flight = max_in_flight
        self._max_in_flight_bytes = max_in_flight_bytes
        self._budget = budget if budget is not None else TurnBudget()
        self._slots: deque[_Slot] = deque()
        self._held_bytes = 0
        self._waiting: deque[Frame] = deque()  # read, not yet admitted (no room, or the turn's budget spent)
        self._admit_scheduled = False  # _admit_waiting will run on a later turn
        self._input_over: tuple[FrameError | None] | None = None  # the input ended (how) behind the waiting
        self._writer_wanted = asyncio.Event()  # the first slot's reply is ready and unwritten, or input ended
        self._no_more_slots = False  # no further request will be read: the writer ends once the FIFO is empty
        self._reading_paused = False  # by backpressure
        self._sending = False  # the writer is writing or draining: the fast path must not interleave
        self._writer_task: asyncio.Task[None] | None = None
        self._last_active = time.monotonic()  # a read or a reply leaving: the idle timeout counts from here
        sock = writer.get_extra_info("socket")
        self._socket_fd: int = sock.fileno() if sock is not None else -1
        self.peer = writer.get_extra_info("peername")

    async def serve(self) -> None:
        """Write replies until the connection is closed; never raises for anything the peer does. Requests
        arrive meanwhile through :meth:`feed`."""
        self._writer_task = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            await asyncio.wait((self._writer_task,))
        finally:
            self.abort()

    def idle_since(self) -> float | None:
        """When (``time.monotonic()``) this connection last read bytes or sent a reply, if it has nothing in
        flight or waiting now; None while it has (a long-poll in progress is not idleness)."""
        if self._slots or self._waiting or self._no_more_slots:
            return None
        return self._last_active

    def stop_reading(self) -> None:
        """Take no further requests; the ones already admitted are answered, then the connection closes."""
        self._waiting.clear()
        self._end_input()

    def _wind_down(self) -> None:
        """No more requests will come: long-polls in progress answer now instead of at their deadline."""
        if not self._winding_down.done():
            self._winding_down.set_result(None)

    def abort(self) -> None:
        """Close now: cancel unfinished handlers and the writer, release file ranges, drop uncommitted
        transactional appends, close the transport."""
        self._no_more_slots = True
        self._waiting.clear()
        self._env.appends.abort_all()
        if self._writer_task is not None:
            self._writer_task.cancel()
        while self._slots:
            self._forget(self._slots.popleft())
        self._writer.close()

    # -- reading -------------------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take the bytes the socket delivered: admit the requests they complete, as far as the connection's
        limits and the turn's budget allow; the rest wait, and reading pauses (the module docstring)."""
        if self._no_more_slots or self._input_over is not None:
            return  # stopped reading, or the stream broke: nothing more is answered
        self._last_active = time.monotonic()
        try:
            self._waiting.extend(self._decoder.feed(data))
        except FrameError as exc:
            self._input_over = (exc,)  # answered once the requests read before it are admitted
        self._admit_waiting()

    def end_of_input(self, exc: BaseException | None = None) -> None:
        """The peer closed its side (``exc`` None) or the connection broke: no request will follow."""
        if self._no_more_slots:
            return
        if exc is not None:
            log.debug("wire connection %s: read failed: %s", self.peer, exc)
            self._waiting.clear()  # nobody is left to answer
            self._end_input()
            return
        if self._input_over is not None:
            return
        try:
            self._decoder.eof()
        except FrameError as exc_:
            self._input_over = (exc_,)
        else:
            self._input_over = (None,)
        self._admit_waiting()

    def _admit_waiting(self, share: int | None = None) -> None:
        """Admit the waiting requests in order while the connection has room and the turn has budget (or, called
        by the budget at the start of a turn, up to this session's ``share`` of it); pause reading while any
        still wait, resume it once none do and there is room."""
        self._admit_scheduled = False
        if self._no_more_slots:
            return
        waiting = self._waiting
        budget = self._budget
        admitted = 0
        try:
            while waiting:
                frame = waiting[0]
                nbytes = len(frame.header) + len(frame.payload)
                if not self._has_room(nbytes):
                    break  # _take_first queues the next round as replies leave
                if share is None:
                    if not budget.take(nbytes):
                        self._schedule_admission()
                        break
                elif admitted >= share or (admitted and budget.bytes_left < nbytes):
                    self._schedule_admission()
                    break
                else:
                    budget.spend(nbytes)
                waiting.popleft()
                self._admit(frame, nbytes)
                admitted += 1
        except Exception:  # a bug in an admit hook: this connection's requests can no longer be trusted
            log.exception("wire connection %s: reading a request failed; closing it", self.peer)
            waiting.clear()
            self._end_input()
            return
        if waiting:
            self._pause_reading()
        elif self._input_over is not None:
            error = self._input_over[0]
            if error is not None:
                self._stream_broken(error)
            else:
                self._end_input()
        elif not self._has_room(0):
            self._pause_reading()
        elif self._reading_paused:
            self._reading_paused = False
            with contextlib.suppress(RuntimeError):
                self._transport.resume_reading()

    def _has_room(self, nbytes: int) -> bool:
        """Whether a request of ``nbytes`` fits the connection's in-flight limits (one alone always does)."""
        slots = len(self._slots)
        return slots == 0 or (slots < self._max_in_flight and self._held_bytes + nbytes <= self._max_in_flight_bytes)

    def _schedule_admission(self) -> None:
        """Admit the waiting requests on the next turn, in the budget's queue (fair among connections), and not
        from inside whatever freed the room (a reply written from a handler or another connection's hook)."""
        if not self._admit_scheduled:
            self._admit_scheduled = True
            self._budget.wait_turn(self._admit_waiting)

    def _stream_broken(self, exc: FrameError) -> None:
        """The byte stream lost its framing: the replies owed go out, then one ERROR frame, then the close."""
        log.info("wire connection %s: %s; closing it", self.peer, exc)
        error = MessageTooLargeError(str(exc)) if isinstance(exc, FrameTooLargeError) else as_tidelog_error(exc)
        self._push(0, 0, 0, _done(Reply(encode_error(0, 0, error.to_error_body()))))
        self._end_input()

    def _end_input(self) -> None:
        """No request is read from here on: stop reading, let the writer finish, wake long-polls."""
        self._no_more_slots = True
        self._writer_wanted.set()
        self._wind_down()
        self._pause_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            with contextlib.suppress(RuntimeError):  # the transport is closing already
                self._transport.pause_reading()

    def _take_first(self) -> _Slot:
        """Take the first slot off the FIFO as its reply goes out; resume reading once there is room again."""
        slot = self._slots.popleft()
        self._held_bytes -= slot.nbytes
        self._last_active = time.monotonic()
        self._want_writer_if_due()
        if self._reading_paused and not self._no_more_slots and not self._admit_scheduled:
            if self._waiting:
                first = self._waiting[0]
                if self._has_room(len(first.header) + len(first.payload)):
                    self._schedule_admission()
            elif self._has_room(0):
                self._reading_paused = False
                with contextlib.suppress(RuntimeError):
                    self._transport.resume_reading()
        return slot

    def _admit(self, frame: Frame, nbytes: int) -> None:
        """Start the handler of one request frame (or decide its error reply) and give it its slot."""
        cid, op = frame.correlation_id, frame.op
        try:
            if frame.kind is not Kind.REQUEST:
                raise ProtocolError(f"a client sends request frames, not {frame.kind.name.lower()} frames")
            handler = self._routes.get(op)
            if handler is None:
                raise UnsupportedError(f"this broker does not serve op {op}")
            header = decode_as(handler.request, frame.header)
            if self._authorize is not None:
                self._authorize(op, header)
        except (ProtocolError, TidelogError) as exc:
            self._push(cid, op, 0, _done(self._error_reply(cid, op, exc)))
            return
        if handler.admit is not None:
            handler.admit(self._env, header)
        if handler.park is not None:
            parked = handler.park(self._env, cid, header)
            if parked is not None:  # served without a task: the future is its slot
                self._push(cid, op, nbytes, parked)
                return
        task: asyncio.Task[Reply] = asyncio.get_running_loop().create_task(
            self._handle(op, handler.handle(self._env, cid, header, frame.payload))
        )
        self._push(cid, op, nbytes, task)

    async def _handle(self, op: int, request: Coroutine[Any, Any, Reply]) -> Reply:
        """Run one handler; write its reply at once if nothing comes before it (the fast path, module doc).

        Its time is the request's latency metric (``tidelog_request_duration_seconds``); a parked request (a
        long-poll served without a task) is not timed: its wait is the client's choice, not the broker's speed."""
        started = time.perf_counter()
        reply = await request
        _observer(op)(time.perf_counter() - started)
        task = asyncio.current_task()
        assert task is not None
        if reply.file is None:
            self.reply_now(task, reply)
        elif self._writable_now(task):
            self._take_first()
            try:
                await self._send_file_now(reply)
            except (ConnectionError, OSError, RuntimeError) as exc:
                log.debug("wire connection %s: write failed: %s", self.peer, exc)
                self.abort()
        return reply

    def reply_now(self, slot: asyncio.Future[Any], reply: Reply) -> bool:
        """Write the reply of the request whose slot is ``slot`` (its handler task, or the future its route's
        ``park`` hook returned) now, from wherever this is called, if the fast path allows it (its slot first,
        the writer idle, the transport's buffer empty); True once written (or the connection failed writing it:
        then it is aborted). The slot must then settle with any reply (:data:`~tidelog.api.wire.handlers.SENT`):
        it has left the FIFO.

        A replica fetch waiting at the tail is answered this way from inside the leader's write
        (:meth:`Partition.park_at_log_end`): the batches being written, straight to the follower's socket,
        before the appender's fsync round starts and without the fetch's task running again (what that saves:
        docs/performance.md).
        """
        if reply.file is not None or not self._writable_now(slot):
            return False
        self._take_first()
        try:
            self._writer.writelines(reply.buffers)
        except (ConnectionError, OSError, RuntimeError) as exc:
            log.debug("wire connection %s: write failed: %s", self.peer, exc)
            self.abort()
        return True

    def _writable_now(self, reply: asyncio.Future[Any]) -> bool:
        """Whether the reply of this slot may be written now, ahead of the writer: its slot is first, nothing is
        being sent, and the transport has nothing buffered (what it takes goes straight to the socket)."""
        transport = self._transport
        return (
            not self._sending
            and bool(self._slots)
            and self._slots[0].reply is reply
            and not transport.get_write_buffer_size()
            and not transport.is_closing()
        )

    async def _send_file_now(self, reply: Reply) -> None:
        """The fast path for a reply with a file range (a woken replica fetch): sent from the handler
        task, as the writer would, marked as sending so that no other reply interleaves while it may wait.

        Through the writer it would take one more loop turn, behind the other follower's; here the prefix and a
        small range usually go out at once (uvloop writes straight to an empty socket buffer). See
        docs/performance.md.
        """
        try:
            await self._send_closing(reply)
        finally:
            self._want_writer_if_due()  # a later reply may have got ready meanwhile

    def _push(self, cid: int, op: int, nbytes: int, reply: asyncio.Future[Reply]) -> None:
        self._slots.append(_Slot(cid, op, nbytes, reply))
        self._held_bytes += nbytes
        reply.add_done_callback(self._reply_done)

    def _reply_done(self, reply: asyncio.Future[Reply]) -> None:
        """A reply is ready: the writer is needed only if it is first and the fast path has not written it."""
        if self._slots and self._slots[0].reply is reply:
            self._writer_wanted.set()

    def _want_writer_if_due(self) -> None:
        """Wake the writer when the first reply is ready (it finished while an earlier one was still going out),
        or when the FIFO emptied after the input ended (the writer then finishes)."""
        slots = self._slots
        if (slots and slots[0].reply.done()) or (not slots and self._no_more_slots):
            self._writer_wanted.set()

    # -- writing -------------------------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        try:
            while True:
                if not self._slots and self._no_more_slots:
                    break
                if not self._slots or self._sending or not self._slots[0].reply.done():
                    # Woken by the first reply becoming ready (_reply_done), by a slot leaving the FIFO with a
                    # ready one behind it (_take_first), by a fast-path send ending, or by the end of input.
                    self._writer_wanted.clear()
                    await self._writer_wanted.wait()
                    continue
                slot = self._take_first()
                reply = self._reply_of(slot)
                await self._send_closing(reply)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            log.debug("wire connection %s: write failed: %s", self.peer, exc)
        finally:
            self._end_input()  # nobody would answer what is read from here on

    def _reply_of(self, slot: _Slot) -> Reply:
        """The reply of a finished request: its handler's, or the error frame for what it raised."""
        future = slot.reply
        if future.cancelled():
            return self._error_reply(slot.correlation_id, slot.op, asyncio.CancelledError())
        exc = future.exception()
        if exc is not None:
            return self._error_reply(slot.correlation_id, slot.op, exc)
        return future.result()

    async def _send_closing(self, reply: Reply) -> None:
        """Send ``reply`` marked as sending (no other reply interleaves while it may wait), then close it."""
        self._sending = True
        try:
            await self._send(reply)
        finally:
            self._sending = False
            reply.close()

    async def _send(self, reply: Reply) -> None:
        file = reply.file
        if file is not None and file.length <= SMALL_FILE_BYTES:
            # A small range (a follower or consumer at the tail: one or a few batches) is read and written with
            # its frame in one writev: one segment on the wire and one wake-up of the reader, where the frame
            # then sendfile cost two of each (docs/performance.md). The bytes are in the page cache (just
            # written or just read); zero copy pays off for large ranges only.
            data = os.pread(file.fd, file.length, file.position)
            if len(data) != file.length:
                raise ShortFileError(f"{file.path} ended {file.length - len(data)} bytes before its range")
            self._writer.writelines([*reply.buffers, data])
        else:
            self._writer.writelines(reply.buffers)
            if file is not None:
                await send_range(self._writer, self._socket_fd, file)
        await self._writer.drain()

    def _error_reply(self, cid: int, op: int, exc: BaseException) -> Reply:
        if isinstance(exc, asyncio.CancelledError):  # a handler cancelled under it: the server is stopping
            error: TidelogError = UnavailableError("the broker is shutting down")
        else:
            error = as_tidelog_error(exc)
        if isinstance(error, DiskFullError):  # an operator's matter, not a bug: one line, no traceback
            log.warning("wire op %d from %s refused: %s", op, self.peer, error.message)
        elif not isinstance(exc, TidelogError | ProtocolError | asyncio.CancelledError):
            log.error("wire op %d from %s failed", op, self.peer, exc_info=exc)
        return Reply(encode_error(cid, op, error.to_error_body()))

    def _forget(self, slot: _Slot) -> None:
        """Drop a slot that will never be written: stop its handler, release any file range it produced."""
        reply = slot.reply
        if not reply.done():
            reply.cancel()
            reply.add_done_callback(_close_reply)
        else:
            _close_reply(reply)


def _done(reply: Reply) -> asyncio.Future[Reply]:
    future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
    future.set_result(reply)
    return future


def _close_reply(future: asyncio.Future[Reply]) -> None:
    if not future.cancelled() and future.exception() is None:
        with contextlib.suppress(OSError):
            future.result().close()
