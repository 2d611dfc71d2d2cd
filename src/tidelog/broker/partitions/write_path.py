"""The leader's write path as a state machine: one :class:`LeaderWrite` per append, run state by state.

Every way in (wire produce, gRPC Publish, NATS ingest, transactional commits) reaches
:meth:`~tidelog.broker.partitions.partition.Partition.write`, which makes a :class:`LeaderWrite` and runs it to
:attr:`WriteState.DONE`. One handler per state (``_on_<state>``), each opening with a guard on the current state
(:meth:`LeaderWrite._must_state`), and a driver (:meth:`LeaderWrite.run_to`) that runs handlers until the write
reaches a target state, so a test can stop a write after any step and look (Gazette's ``append_fsm.go``).

The states, in order (a write may skip ahead, never go back)::

    ADMIT ─▶ DEDUPE ─▶ PLACE ─▶ DURABLE ─▶ COMMITTED ─▶ ANSWER ─▶ DONE
      │        │  └──── duplicate ───────────▲  (acks ALL)  ▲
      └────────┴──── refused ──────────────────────────────────────▶ DONE

- ADMIT: the partition takes writes (not suspended, not closing, its log not failed, not read-only, holding its
  data keys when its stream is encrypted, enough in-sync replicas for ``ALL``). A paused partition is not open
  (:mod:`tidelog.broker.pausing`): writes never reach it.
- DEDUPE: batches carrying a producer id are reserved in the producer table; a retry of written batches goes
  straight to COMMITTED (or ANSWER) with its original offsets, and writes nothing.
- PLACE: an encrypted stream's batches are sealed (:mod:`tidelog.storage.encryption`: one AES-GCM pass
  per batch, no await), then the log checks the expectations (the expected offset, and a transactional
  append's registers through its ``on_placed`` hook) where it assigns offsets, under its lock with no await
  before the write — checked any earlier, another write could take the offset meanwhile — then writes and
  meets the flush policy. From DEDUPE to the log's lock there is no await, so producers' batches reach the log
  in the order they were reserved. Hook: the log's tail listener pushes the batches to replica fetches parked
  at the log end from inside the write (:meth:`Partition.park_at_log_end`).
- DURABLE: the log returned (written, flushed per policy): the leader counts its own copy toward the high
  watermark, up to this write's end (a concurrent write may be written but not yet flushed).
- COMMITTED: with acks ``ALL``, wait until the high watermark passes the write. Hooks: ack polling for a lone
  waiting write (:mod:`tidelog.replication.leader.ack_poll`, started by :meth:`Partition.wait_committed`), and the
  committed reply (``on_committed``), run from inside the acknowledgement that commits the write.
- ANSWER: the status value for the caller (:class:`Appended`).

Routable outcomes are :class:`WriteRefused` values, not exceptions; the protocol edges map them to their
error frames or codes through the one error table (:func:`tidelog.protocol.errors.make_error`). Exceptions are
real failures (a timeout waiting for the commit, a poisoned log, the partition closing under a waiting write);
each carries a note naming the state it failed in.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from tidelog import telemetry
from tidelog.protocol.errors import ErrorCode, RequestTimeoutError, TidelogError, make_error
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import BatchHeader, iter_batches
from tidelog.protocol.records.producers import NO_PRODUCER_ID
from tidelog.replication.idempotence.producer_state import (
    Duplicate,
    Fenced,
    InFlight,
    Invalid,
    New,
    OutOfOrder,
    UnknownProducer,
    Verdict,
)
from tidelog.storage.encryption import SEAL_OVERHEAD, seal_batches
from tidelog.storage.errors import OffsetMismatchError
from tidelog.storage.file_writes import FileSlice
from tidelog.storage.flush import FlushFailedError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tidelog.broker.partitions.partition import Partition
    from tidelog.storage.log_append import AppendResult


class TransactionalWrite(NamedTuple):
    """How a transactional append's batch is written: its own size limit, and a hook run where the log places
    it (under the log's lock, before the write) to record the registers it sets."""

    max_batch_bytes: int
    on_placed: Callable[[int], None]
    source: FileSlice | None = None  # the batch in the append's spool file, copied from there


class WriteState(enum.IntEnum):
    """Where one leader write is (the module docstring draws the transitions)."""

    ADMIT = 0
    DEDUPE = 1
    PLACE = 2
    DURABLE = 3
    COMMITTED = 4
    ANSWER = 5
    DONE = 6


# The states as module constants: the handlers read them on every write, and a global is several times faster
# to read than an enum class's attribute.
_ADMIT, _DEDUPE, _PLACE, _DURABLE, _COMMITTED, _ANSWER, _DONE = WriteState
_ALL = Acks.ALL
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk refuses a write and takes nothing down (storage.disk_full)


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an append landed: the status of a write that was stored (or was already, for a retry)."""

    base_offset: int
    last_offset: int
    received_ns: int
    committed_ns: int
    duplicate: bool = False
    """A producer's retry of batches written before: nothing was written now, the offsets are the originals."""


@dataclass(frozen=True, slots=True)
class WriteRefused:
    """A write the partition routed back, storing nothing of it: the status a caller answers with its own error
    frame or code. ``code`` is one of:

    - ``PARTITION_SUSPENDED``: appends are suspended (fail to safety, :mod:`tidelog.broker.partitions.safety`).
    - ``UNAVAILABLE``: the partition is closing or changing leader, or its log failed a write or an fsync
      (refused before the producer check, whose state that failure rolled back; the leader steps down:
      :mod:`~tidelog.broker.partitions.failed_logs`); retry on the new leader.
    - ``READONLY``: the partition is read-only.
    - ``NOT_ENOUGH_REPLICAS``: acks ``ALL`` with fewer in-sync replicas than ``min_isr``.
    - ``OUT_OF_ORDER_SEQUENCE``, ``PRODUCER_FENCED``, ``DUPLICATE_IN_FLIGHT``, ``UNKNOWN_PRODUCER``,
      ``INVALID_ARGUMENT``: the producer table refused a batch
      (:class:`~tidelog.replication.idempotence.producer_state.Verdict`).
    - ``INCORRECT_OFFSET``: the log does not end at the expected offset; ``log_end`` is where it ends, and it is
      committed (a refusal never rests on records a failover may truncate).
    """

    code: ErrorCode
    message: str
    log_end: int = -1
    """INCORRECT_OFFSET: the log end the expected offset was compared with; -1 otherwise."""

    def error(self) -> TidelogError:
        """The refusal as the error of its code (for edges that answer with an exception)."""
        return make_error(self.code, self.message)

    def __str__(self) -> str:
        return self.message


class LeaderWrite:
    """One append to a partition this broker leads, carried from ADMIT to DONE (see the module docstring).

    The partition's own helper: it reads and updates the partition's write-side state (the HW tracker, the
    producer table, the receive stamps) as :class:`~tidelog.broker.partitions.partition.Partition` itself would.
    """

    __slots__ = (
        "_acks",
        "_data",
        "_expected_offset",
        "_headers",
        "_partition",
        "_reply",
        "_timeout",
        "_transactional",
        "base_offset",
        "duplicate",
        "last_offset",
        "received_ns",
        "state",
        "status",
    )

    def __init__(
        self,
        partition: Partition,
        data: bytes | bytearray | memoryview,
        acks: Acks,
        timeout: float,
        expected_offset: int | None,
        transactional: TransactionalWrite | None,
        on_committed: Callable[[int, int], None] | None,
    ) -> None:
        self._partition = partition
        self._data = data
        self._acks = acks
        self._timeout = timeout
        self._expected_offset = expected_offset
        self._transactional = transactional
        self._reply = on_committed  # the committed reply hook (acks ALL)
        self._headers: list[BatchHeader] | None = None  # the producer batches reserved at DEDUPE
        self.state = _ADMIT
        self.status: Appended | WriteRefused | None = None  # set on reaching DONE
        self.received_ns = 0
        self.base_offset = -1
        self.last_offset = -1
        self.duplicate = False

    async def run_to(self, target: WriteState) -> Appended | WriteRefused | None:
        """Run the handlers until the write reaches ``target`` (or DONE, when refused early); return its status,
        which is set once it is DONE (None before)."""
        try:
            while self.state < target:
                step = _STEPS[self.state](self)
                if step is not None:
                    await step
        except Exception as exc:
            if not getattr(exc, "__notes__", None):
                exc.add_note(f"leader write to {self._partition.name}: failed at {self.state.name}")
            raise
        return self.status

    def _must_state(self, state: WriteState) -> None:
        if self.state is not state:
            raise AssertionError(f"leader write: expected state {state.name}, is {self.state.name}")

    def _refuse(self, code: ErrorCode, message: str, log_end: int = -1) -> None:
        self.status = WriteRefused(code, message, log_end)
        self.state = _DONE

    # ------------------------------------------------------------------------------------------ states

    def _on_admit(self) -> None:
        self._must_state(_ADMIT)
        partition = self._partition
        try:
            partition.check_appendable()
        except TidelogError as exc:
            self._refuse(exc.code, exc.message)
            return None
        record = partition.record
        failed = partition.log.flusher.failed
        if partition._closed:
            self._refuse(ErrorCode.UNAVAILABLE, f"partition {partition.name} is closing")
        elif failed is not None:  # before dedupe: a failed fsync released reservations of bytes it may have kept
            partition.log_failed()
            self._refuse(
                ErrorCode.UNAVAILABLE,
                f"partition {partition.name}: its log failed a write or an fsync ({failed}); it refuses appends while "
                "its leadership moves to another in-sync replica (or, with none, until the broker restarts)",
            )
        elif record.readonly:
            self._refuse(ErrorCode.READONLY, f"partition {partition.name} is read-only")
        elif partition.stream.config.encryption and partition.log.keyring is None:
            self._refuse(ErrorCode.ENCRYPTION, partition.keyless_reason())
        elif self._acks is _ALL and len(record.isr or (partition.broker_id,)) < partition.min_isr:
            self._refuse(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"partition {partition.name} has {len(record.isr)} in-sync replicas, min_isr is {partition.min_isr}",
            )
        else:
            self.received_ns = partition.clock.now_ns()
            self.state = _DEDUPE
        return None

    def _on_dedupe(self) -> None:
        self._must_state(_DEDUPE)
        self.state = _PLACE
        if self._transactional is not None:
            return  # a transactional append carries no producer id
        headers = _producer_headers(self._data)
        if headers is None:
            return
        verdict = self._partition.producers.reserve_all(headers)
        if isinstance(verdict, New):
            self._headers = headers
        elif isinstance(verdict, Duplicate):
            self.base_offset, self.last_offset, self.duplicate = verdict.base_offset, verdict.last_offset, True
            self.state = _COMMITTED if self._acks is _ALL else _ANSWER
        else:
            code, message = _refusal(verdict, self._partition.name)
            if isinstance(verdict, UnknownProducer | OutOfOrder):  # rare: the producer re-initializes after it
                first = next(h for h in headers if h.producer_id != NO_PRODUCER_ID)
                log.info(
                    "%s (producer %d, epoch %d, sequence %d; log end %d)",
                    message,
                    first.producer_id,
                    first.producer_epoch,
                    first.base_sequence,
                    self._partition.log.end_offset,
                )
            self._refuse(code, message)

    async def _on_place(self) -> None:
        self._must_state(_PLACE)
        partition = self._partition
        transactional = self._transactional
        data = self._data
        source = None if transactional is None else transactional.source
        keyring = partition.log.keyring
        limit = None  # the log's own batch size limit
        if keyring is not None and partition.stream.config.encryption:
            data, source = seal_batches(data, keyring), None  # once, here: followers store these very bytes
            limit = partition.log.config.max_batch_bytes + SEAL_OVERHEAD  # a batch the client fitted still fits
        result: AppendResult
        try:
            if transactional is not None:
                result = await partition.log.append(
                    data,
                    partition.record.leader_epoch,
                    expected_offset=self._expected_offset,
                    max_batch_bytes=transactional.max_batch_bytes + (SEAL_OVERHEAD if limit else 0),
                    registers=True,
                    on_placed=transactional.on_placed,
                    source=source,
                )
            elif self._headers is None:
                result = await partition.log.append(
                    data, partition.record.leader_epoch, expected_offset=self._expected_offset, max_batch_bytes=limit
                )
            else:
                result = await partition._append_reserved(data, self._headers, self._expected_offset, limit)
        except OffsetMismatchError as exc:
            await partition.confirm_end(exc.actual, self._timeout)
            self._refuse(ErrorCode.INCORRECT_OFFSET, f"{partition.name}: {exc}", exc.actual)
            return
        except asyncio.CancelledError:
            partition._settle_after_cancel()
            raise
        except (FlushFailedError, OSError) as exc:
            if getattr(exc, "errno", None) in _DISK_FULL:
                raise
            partition.log_failed(exc)  # a failing disk: poisoned, the leader steps down
            # In doubt, and retriable: the bytes may be on the followers, and the next leader may commit them. An
            # idempotent producer's retry (same sequence) is then answered with their offsets, or written.
            raise RequestTimeoutError(
                f"{partition.name}: the leader's disk failed while writing ({exc}): the write may be stored on "
                "the followers; retry on the next leader"
            ) from exc
        self.base_offset = result.base_offset
        self.last_offset = result.last_offset
        self.state = _DURABLE

    def _on_durable(self) -> None:
        self._must_state(_DURABLE)
        partition = self._partition
        partition._hw.replica_caught_up_to(partition.broker_id, self.last_offset + 1)
        if not partition.first_received_ns:
            partition.first_received_ns = self.received_ns
        partition.latest_received_ns = self.received_ns
        partition.records_in += self.last_offset - self.base_offset + 1  # read by the metrics at scrape time
        partition.bytes_in += len(self._data)
        self.state = _COMMITTED if self._acks is _ALL else _ANSWER

    def _on_committed(self) -> Awaitable[None] | None:
        self._must_state(_COMMITTED)
        if self.last_offset < self._partition.high_watermark:
            self.state = _ANSWER  # committed already (always, with one replica): no wait, no reply hook
            return None
        return self._wait_committed()

    async def _wait_committed(self) -> None:
        then = None if self._reply is None else self._reply_committed
        try:
            await self._partition.wait_committed(self.last_offset, self._timeout, then)
        except asyncio.CancelledError:
            if self.duplicate:  # as a cancelled placement: count what the log holds (Partition._settle_after_cancel)
                self._partition._settle_after_cancel()
            raise
        self.state = _ANSWER

    def _reply_committed(self) -> None:
        """Hook of COMMITTED: run from inside the acknowledgement that moves the high watermark past the write,
        before the write's own task resumes (the wire produce answers from here)."""
        assert self._reply is not None
        self._reply(self.base_offset, self.last_offset)

    def _on_answer(self) -> None:
        self._must_state(_ANSWER)
        now = self._partition.clock.now_ns()
        if self._acks is _ALL and not self.duplicate:
            telemetry.write_committed((now - self.received_ns) / 1e9)  # Rama's apply latency
        self.status = Appended(self.base_offset, self.last_offset, self.received_ns, now, self.duplicate)
        self.state = _DONE

    def _on_done(self) -> None:
        raise AssertionError("leader write: nothing runs after DONE")


_STEPS: tuple[Callable[[LeaderWrite], Awaitable[None] | None], ...] = (
    LeaderWrite._on_admit,
    LeaderWrite._on_dedupe,
    LeaderWrite._on_place,
    LeaderWrite._on_durable,
    LeaderWrite._on_committed,
    LeaderWrite._on_answer,
    LeaderWrite._on_done,
)
"""The handler of each state, indexed by :class:`WriteState`."""


def _producer_headers(data: bytes | bytearray | memoryview) -> list[BatchHeader] | None:
    """The batch headers of an append when any batch is a producer's, else None (the plain path, no table).

    Headers only (no CRC, no records): :meth:`Log.append` verifies everything before writing.
    """
    headers = [header for _, header in iter_batches(data, verify=False)]
    return headers if any(h.producer_id != NO_PRODUCER_ID for h in headers) else None


def _refusal(verdict: Verdict, name: str) -> tuple[ErrorCode, str]:
    """The refusal of a batch the producer table refused (every verdict but New and Duplicate)."""
    if isinstance(verdict, OutOfOrder):
        return ErrorCode.OUT_OF_ORDER_SEQUENCE, f"{name}: out-of-order sequence; expected {verdict.expected_sequence}"
    if isinstance(verdict, Fenced):
        return (
            ErrorCode.PRODUCER_FENCED,
            f"{name}: producer fenced; its id has written with epoch {verdict.current_epoch}",
        )
    if isinstance(verdict, InFlight):
        return ErrorCode.DUPLICATE_IN_FLIGHT, f"{name}: the same batch is being written; retry after a backoff"
    if isinstance(verdict, Invalid):
        return ErrorCode.INVALID_ARGUMENT, f"{name}: {verdict.reason}"
    return ErrorCode.UNKNOWN_PRODUCER, f"{name}: no state for this producer id; re-initialize the producer"
