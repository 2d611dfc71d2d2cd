"""Transactional appends from the client: all or nothing, with expectations and registers (issue 5).

``await appender.append(stream, partition, records, ...)`` writes ``records`` as one append: every record or
none, at one contiguous range of offsets, visible to readers only once all of it is committed. Options:

- ``expected_offset``: only if the partition's log ends exactly there (else :class:`IncorrectOffsetError`).
- ``check_registers``: only if the partition's registers match this selector (else
  :class:`RegisterMismatchError`); empty registers match any selector, as in Gazette.
- ``subtract_registers`` then ``union_registers``: how the registers change, only when records are appended.

A refusal leaves nothing written; the raised error carries the partition's ``log_end`` and ``registers`` as
the broker saw them (:func:`refusal_details`), so a client that lost a race can decide again at once.

Records are encoded as they are consumed from the iterable (sync or async) and streamed in chunks of
``chunk_bytes``, pipelined: the append costs one round trip whatever its size, plus the time to send it, and
neither side holds it whole in memory. Many appends may run concurrently over one connection.

Retries: an append that failed before its COMMIT reached the broker wrote nothing, so it is retried (with fresh
metadata) when it was refused for a retriable reason — this broker no longer leads the partition, the partition
has no leader right now — and its records are a sequence that can be read again. A connection lost after the
COMMIT was sent leaves the outcome unknown: that raises :class:`ConnectionClosedError`, and only an append with
an ``expected_offset`` (or a register check) can be retried safely — the retry is refused if the first landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl as ssl_
import time
from collections.abc import AsyncIterable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import crc32c
import msgspec

from tidelog.client.cluster import DEFAULT_BOOTSTRAP, Cluster
from tidelog.protocol.connection import Connection, ConnectionClosedError, Response
from tidelog.protocol.errors import (
    ErrorCode,
    NotLeaderError,
    TidelogError,
    UnavailableError,
    make_error,
)
from tidelog.protocol.labels import (
    EMPTY,
    LabelSelector,
    LabelSet,
    decode_labels,
    encode_labels,
    encode_selector,
)
from tidelog.protocol.messages import Acks, AppendPhase, AppendRequest, AppendResponse
from tidelog.protocol.records import BatchBuilder, EncodedRecords, NewRecord

DEFAULT_CHUNK_BYTES = 1024 * 1024
RETRY_DELAYS = (0.05, 0.2, 0.5)

_REFUSED_AT_BEGIN = frozenset(
    {ErrorCode.UNKNOWN_STREAM, ErrorCode.UNKNOWN_PARTITION, ErrorCode.NOT_LEADER, ErrorCode.INVALID_ARGUMENT}
)
_append_ids = itertools.count(1)  # process-wide: appenders sharing a connection never reuse an id

RecordLike = NewRecord | bytes | EncodedRecords
"""A record (a plain value, or a :class:`NewRecord`), or records encoded in bulk (an append's whole sequence of
those, the first from offset delta 0: :meth:`BatchBuilder.extend <tidelog.protocol.records.BatchBuilder.extend>`)."""


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """A committed append: its first and last offsets (-1 when it had no records), the partition's log end
    after it, and the partition's registers after it."""

    base_offset: int
    last_offset: int
    log_end: int
    registers: LabelSet


@dataclass(frozen=True, slots=True)
class RefusalDetails:
    """What the broker reported with a refused append: its log end and registers at that moment."""

    log_end: int
    registers: LabelSet


def refusal_details(error: BaseException) -> RefusalDetails | None:
    """The log end and registers a refused append reported, or None for other errors."""
    details = getattr(error, "append_refusal", None)
    return details if isinstance(details, RefusalDetails) else None


class Appender:
    """Transactional appends over the wire protocol (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        cluster: Cluster | None = None,
        ssl: ssl_.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        acks: Acks = Acks.ALL,
        timeout_ms: int = 10_000,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        """``cluster`` shares connections and metadata with other client objects (``close`` leaves it open).
        ``timeout_ms``: how long the broker waits for the ack policy after writing."""
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._owns_cluster = cluster is None
        self._cluster = Cluster(bootstrap, ssl=ssl, credentials=credentials) if cluster is None else cluster
        self._acks = acks
        self._timeout_ms = timeout_ms
        self._chunk_bytes = chunk_bytes

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    async def append(
        self,
        stream: str,
        partition: int,
        records: Iterable[RecordLike] | AsyncIterable[RecordLike],
        *,
        expected_offset: int | None = None,
        check_registers: LabelSelector | None = None,
        union_registers: LabelSet = EMPTY,
        subtract_registers: LabelSet = EMPTY,
    ) -> AppendOutcome:
        """Append ``records`` all or nothing; see the module docstring for the options and failures."""
        begin = AppendRequest(
            0,
            AppendPhase.BEGIN,
            stream,
            partition,
            -1 if expected_offset is None else expected_offset,
            encode_selector(check_registers) if check_registers is not None else b"",
            encode_labels(union_registers) if union_registers else b"",
            encode_labels(subtract_registers) if subtract_registers else b"",
            0,
            self._acks,
            self._timeout_ms,
        )
        retriable = isinstance(records, Sequence)
        for delay in (*RETRY_DELAYS, None):
            try:
                return await self._append_once(begin, records)
            except _NothingWritten as failed:
                error = failed.error
                if not (retriable and error.retriable) or delay is None:
                    raise error from None
                self._cluster.forget(stream)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def registers(self, stream: str, partition: int) -> AppendOutcome:
        """The partition's current registers and log end (an append of no records, which changes nothing)."""
        return await self.append(stream, partition, ())

    async def _append_once(
        self, begin: AppendRequest, records: Iterable[RecordLike] | AsyncIterable[RecordLike]
    ) -> AppendOutcome:
        try:
            connection = await self._cluster.leader_connection(begin.stream, begin.partition)
        except (NotLeaderError, UnavailableError, ConnectionClosedError) as exc:
            raise _NothingWritten(exc) from None
        append_id = next(_append_ids)
        first_timestamp = time.time_ns()
        builder = BatchBuilder(first_timestamp)
        replies: list[asyncio.Future[Response]] = []
        sender = _ChunkSender(connection, append_id, replies)
        header: AppendRequest | None = _with(begin, append_id=append_id, first_timestamp=first_timestamp)
        chunk_bytes = self._chunk_bytes

        async def spill() -> bool:
            """Send the records encoded since the last chunk; True once the broker has refused the append
            already (the rest need not be sent: the commit will say why)."""
            nonlocal header
            await sender.send(header, builder)
            header = None
            return sender.failed()

        try:
            if isinstance(records, AsyncIterable):
                async for record in records:
                    _encode(builder, record)
                    if builder.size - sender.sent >= chunk_bytes and await spill():
                        break
            else:  # no await per record: a list of a million values is encoded in one tight loop
                append = builder.append
                for record in records:
                    if type(record) is bytes:
                        append(record)
                    else:
                        _encode(builder, record)
                    if builder.size - sender.sent >= chunk_bytes and await spill():
                        break
            if header is not None:  # nothing sent yet: the whole append goes in one frame
                await sender.send(msgspec.structs.replace(header, phase=AppendPhase.WHOLE), builder)
            else:
                await sender.send(None, builder)
                await sender.send(AppendRequest(append_id, AppendPhase.COMMIT), None)
        except BaseException:
            if not connection.closed:
                sender.abort()
            raise
        responses = await asyncio.gather(*replies, return_exceptions=True)
        if isinstance(first := responses[0], TidelogError) and (len(responses) > 1 or first.code in _REFUSED_AT_BEGIN):
            # Refused at BEGIN (unknown stream, not the leader): nothing was spooled. A WHOLE frame's error may
            # also come after its write (the broker stopping mid-commit): only these codes prove it never began.
            raise _NothingWritten(first)
        last = responses[-1]
        if isinstance(last, BaseException):
            raise last  # e.g. the connection was lost after the COMMIT went out: the outcome is unknown
        outcome = last.header
        assert isinstance(outcome, AppendResponse)
        if outcome.status:
            raise _refused(outcome)
        return AppendOutcome(
            outcome.base_offset,
            outcome.last_offset,
            outcome.log_end,
            decode_labels(outcome.registers) if outcome.registers else EMPTY,
        )

    async def close(self) -> None:
        if self._owns_cluster:
            await self._cluster.close()

    async def __aenter__(self) -> Appender:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class _NothingWritten(Exception):
    """An append failed before the broker could write any of it: a retry cannot duplicate it."""

    def __init__(self, error: TidelogError) -> None:
        super().__init__(str(error))
        self.error = error


class _ChunkSender:
    """Sends the frames of one append, keeping the futures of their answers."""

    def __init__(self, connection: Connection, append_id: int, replies: list[asyncio.Future[Response]]) -> None:
        self._connection = connection
        self._append_id = append_id
        self._replies = replies
        self.sent = 0  # record bytes sent so far
        self._records = 0  # records sent so far

    async def send(self, header: AppendRequest | None, builder: BatchBuilder | None) -> None:
        """Send ``header`` (a CHUNK header when None) with the records ``builder`` encoded since the last
        send, described (count, CRC32C) so that the broker can check it arrived as encoded."""
        chunk = b""
        if builder is not None:
            chunk = builder.drain()
            if header is None and not chunk:
                return
            records, self._records = builder.count - self._records, builder.count
            self.sent = builder.size
            if header is None:
                header = AppendRequest(self._append_id, AppendPhase.CHUNK)
            header = msgspec.structs.replace(
                header, records=records, crc=crc32c.crc32c(chunk), max_timestamp=builder.max_timestamp
            )
        assert header is not None
        await self._connection.wait_writable()
        self._replies.append(self._connection.send(header, chunk))

    def failed(self) -> bool:
        """Whether an answer already refused the append (the rest need not be sent)."""
        for reply in self._replies:
            if reply.done() and not reply.cancelled():
                if reply.exception() is not None:
                    return True
                header = reply.result().header
                if isinstance(header, AppendResponse) and header.status:
                    return True
        return False

    def abort(self) -> None:
        """The caller gave up (cancelled, or the records' iterator raised): tell the broker to forget it."""
        for reply in self._replies:  # nobody will read these answers
            reply.add_done_callback(_ignore)
        if self._replies:
            with contextlib.suppress(ConnectionClosedError):
                self._connection.send(AppendRequest(self._append_id, AppendPhase.ABORT)).add_done_callback(_ignore)


def _with(begin: AppendRequest, *, append_id: int, first_timestamp: int) -> AppendRequest:
    return AppendRequest(
        append_id,
        AppendPhase.BEGIN,
        begin.stream,
        begin.partition,
        begin.expected_offset,
        begin.check_registers,
        begin.union_registers,
        begin.subtract_registers,
        first_timestamp,
        begin.acks,
        begin.timeout_ms,
    )


def _refused(response: AppendResponse) -> TidelogError:
    try:
        code = ErrorCode(response.status)
    except ValueError:
        code = ErrorCode.INTERNAL
    error = make_error(code, response.message or None)
    error.append_refusal = RefusalDetails(  # type: ignore[attr-defined]
        response.log_end, decode_labels(response.registers) if response.registers else EMPTY
    )
    return error


def _encode(builder: BatchBuilder, record: RecordLike) -> None:
    if isinstance(record, bytes):
        builder.append(record)
    elif isinstance(record, EncodedRecords):
        builder.extend(record)
    else:
        builder.append(record.value, record.key, record.headers, record.timestamp)


def _ignore(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
