"""The APPEND op: transactional appends over the wire protocol (issue 5; Gazette's append RPC, seed 002).

A client sends an append as frames sharing an ``append_id`` of its choosing (unique among its open appends on
the connection): BEGIN (partition, expectations, register changes, optionally the first records), any number
of CHUNKs of records, then COMMIT or ABORT; or, when the records fit in one frame, a single WHOLE frame. Every
frame is answered (:class:`AppendResponse`), in order like all replies on a connection, so a client may send
the whole append without waiting and read the answers after; the COMMIT (or WHOLE) answer is the outcome.
Several appends may be open at once on one connection — begun, streamed and committed interleaved — and commits
to one partition are written in the order they arrive.

Handlers do the part that must follow frame order — opening the append, spooling a chunk — synchronously, before
their first ``await``: the session starts handler tasks in frame order, and each runs up to its first await
before the next starts, so chunks reach the spool in the order they were sent without a lock.

Outcomes travel in ``status`` rather than as error frames, so that INCORRECT_OFFSET and REGISTER_MISMATCH can
carry the log end and registers the client needs to decide again. Only a frame that cannot be tied to an
append (an unknown stream or partition at BEGIN, this broker not leading it, an unknown ``append_id``) is an
error frame.
"""

from __future__ import annotations

import functools
import time

from tidelog.api.wire.handlers import HandlerEnv, Reply, Route, route
from tidelog.broker.appends.commit import AppendRefused, Expectations, committer_of
from tidelog.broker.appends.spool import Declared
from tidelog.broker.appends.streamed import AppendLimits, OpenAppend
from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import BrokerContext
from tidelog.protocol.errors import InvalidArgumentError
from tidelog.protocol.frames import Op
from tidelog.protocol.labels import (
    EMPTY,
    MAX_REGISTER_BYTES,
    RegisterError,
    decode_labels,
    decode_selector,
    encode_labels,
)
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.messages import AppendPhase, AppendRequest, AppendResponse
from tidelog.protocol.records import HEADER_SIZE, REGISTERS_LENGTH
from tidelog.storage.batch_check import ProduceLimits

SPOOL_DIRECTORY = ".appends"
REGISTERS_ROOM = REGISTERS_LENGTH.size + MAX_REGISTER_BYTES  # an append is one batch: it must fit a segment


def limits_of(broker: BrokerContext) -> AppendLimits:
    """The broker's append limits; the spool directory is made on first use."""
    return _limits(broker.config)


@functools.lru_cache(maxsize=8)
def _limits(config: BrokerConfig) -> AppendLimits:
    """Once per configuration: no ``mkdir`` on every BEGIN (a compare-and-set append's critical path)."""
    directory = config.data_dir / SPOOL_DIRECTORY
    directory.mkdir(parents=True, exist_ok=True)
    max_bytes = min(config.max_append_bytes, config.segment_max_bytes - HEADER_SIZE - REGISTERS_ROOM)
    records = ProduceLimits.of(config.max_message_bytes, max_bytes, config.max_timestamp_ahead_ms)
    return AppendLimits(
        directory,
        max_bytes,
        config.append_min_rate_bytes,
        config.append_rate_window_ms / 1000,
        records,
        config.max_open_appends_per_connection,
        config.max_open_append_bytes_per_connection,
    )


def expectations_of(request: AppendRequest) -> Expectations:
    """The expectations a BEGIN frame carries; bad encodings are INVALID_ARGUMENT naming the field."""
    try:
        return Expectations(
            expected_offset=None if request.expected_offset < 0 else request.expected_offset,
            check_registers=decode_selector(request.check_registers) if request.check_registers else None,
            union_registers=decode_labels(request.union_registers) if request.union_registers else EMPTY,
            subtract_registers=decode_labels(request.subtract_registers) if request.subtract_registers else EMPTY,
        )
    except RegisterError as exc:
        raise InvalidArgumentError(f"append {request.append_id}: {exc}") from None


def declared_of(request: AppendRequest) -> Declared | None:
    """The client's description of a frame's records, when it gave all of it."""
    if request.records < 0 or request.crc < 0 or request.max_timestamp < 0:
        return None
    return Declared(request.records, request.crc, request.max_timestamp)


def _reply(correlation_id: int, response: AppendResponse) -> Reply:
    return Reply(encode_message(correlation_id, response))


def _status(append: OpenAppend) -> AppendResponse:
    """The answer to a BEGIN or CHUNK: success so far, with the partition's log end and registers as this leader
    knows them now (every append response carries them; the COMMIT answer's are the ones that count)."""
    failure = append.failure
    if failure is None:
        registers = committer_of(append.partition).registers.latest_known()
        return AppendResponse(
            append.append_id,
            log_end=append.partition.log.end_offset,
            registers=encode_labels(registers) if registers else b"",
        )
    return _refusal(append.append_id, failure)


def _refusal(append_id: int, refused: AppendRefused) -> AppendResponse:
    return AppendResponse(
        append_id,
        status=int(refused.code),
        message=refused.message,
        log_end=refused.log_end,
        registers=encode_labels(refused.registers) if refused.registers else b"",
    )


async def append(env: HandlerEnv, correlation_id: int, request: AppendRequest, payload: memoryview) -> Reply:
    """Serve one frame of an append (see the module docstring)."""
    phase = request.phase
    if phase is AppendPhase.BEGIN or phase is AppendPhase.WHOLE:
        if not request.stream:
            raise InvalidArgumentError(f"append {request.append_id}: BEGIN needs a stream")
        partition = await env.broker.writable(request.stream, request.partition)
        timeout = request.timeout_ms / 1000 if request.timeout_ms else env.broker.ack_timeout
        first_timestamp = request.first_timestamp or time.time_ns()
        limits = limits_of(env.broker)
        if phase is AppendPhase.BEGIN:  # before anything is spooled (WHOLE is never held open)
            env.appends.admit(request.append_id, len(payload), limits)
        opened = OpenAppend(
            request.append_id,
            partition,
            expectations_of(request),
            first_timestamp,
            request.acks,
            timeout,
            limits,
        )
        opened.precheck()
        opened.add(payload, declared_of(request))
        if phase is AppendPhase.WHOLE:  # one frame, one task, one answer: what a compare-and-set costs
            return await _commit(correlation_id, opened)
        env.appends.begin(opened)
        return _reply(correlation_id, _status(opened))
    if phase is AppendPhase.CHUNK:
        chunked = env.appends.get(request.append_id)
        env.appends.add(chunked, payload, declared_of(request))
        return _reply(correlation_id, _status(chunked))
    if phase is AppendPhase.ABORT:
        env.appends.finish(request.append_id).abort()
        return _reply(correlation_id, AppendResponse(request.append_id))
    env.appends.add(env.appends.get(request.append_id), payload, declared_of(request))
    finishing = env.appends.finish(request.append_id)
    return await _commit(correlation_id, finishing)


async def _commit(correlation_id: int, append: OpenAppend) -> Reply:
    committed = await append.commit()
    if isinstance(committed, AppendRefused):
        return _reply(correlation_id, _refusal(append.append_id, committed))
    return _reply(
        correlation_id,
        AppendResponse(
            append.append_id,
            base_offset=committed.base_offset,
            last_offset=committed.last_offset,
            log_end=committed.log_end,
            registers=encode_labels(committed.registers) if committed.registers else b"",
        ),
    )


ROUTES: dict[int, Route] = {Op.APPEND: route(AppendRequest, append)}
