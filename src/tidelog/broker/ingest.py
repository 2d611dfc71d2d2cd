"""NATS ingest: the partition leader's subscription to its subject, appending what arrives in batches.

The NATS callback does almost nothing — it queues the message and wakes the ingest loop. The loop takes
everything queued since its last turn (up to a record and byte limit), turns it into *one* record batch and
appends it; while that append waits for its fsync the next messages are already being gathered, and up to
``max_inflight`` appends overlap, so one fsync (group commit in the log) covers many batches under load. A
message is never appended on its own unless it arrived alone. A batch never exceeds what the partition's log
accepts in one batch (its ``max_batch_bytes``, at most a segment): a batch the log refused would lose every
message in it.

Acks go to the Liftbridge ack inbox of enveloped messages per their policy: ``LEADER`` once the batch is in the
leader's log, ``ALL`` once it is committed, ``NONE`` never. Plain NATS messages carry no ack inbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from tidelog.api.envelope import MessageType, encode_envelope
from tidelog.api.errors import TidelogError
from tidelog.api.liftbridge import AckRequest, build_ack, record_from_nats
from tidelog.api.wire.messages import Acks
from tidelog.broker.partition import Partition
from tidelog.storage.batch import HEADER_SIZE, NewRecord, build_batch

log = logging.getLogger(__name__)

_Pending = tuple[str, str, bytes, Any, int]

_RECORD_OVERHEAD = 128
"""Bytes a record may need beyond its payload, subject and reply: varint framing, reserved header names."""


def _encoded_size_bound(subject: str, reply: str, data: bytes, headers: Any) -> int:
    """An upper bound on the bytes one NATS message takes as a record (an envelope only ever shrinks)."""
    size = len(data) + len(subject) + len(reply) + _RECORD_OVERHEAD
    if headers:
        size += sum(len(k) + len(v) + 20 for k, v in headers.items())
    return size


class NatsIngest:
    """Feeds one partition from its NATS subject."""

    def __init__(
        self,
        nc: Any,
        partition: Partition,
        *,
        max_batch_records: int = 4096,
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_inflight: int = 4,
        ack_timeout: float = 5.0,
    ) -> None:
        self._nc = nc
        self._partition = partition
        self._max_records = max_batch_records
        log_config = partition.log.config
        log_limit = min(log_config.max_batch_bytes, log_config.segment_max_bytes)
        self._max_bytes = min(max_batch_bytes, log_limit) - HEADER_SIZE
        self._slots = asyncio.Semaphore(max_inflight)
        self._ack_timeout = ack_timeout
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()
        self._sub: Any = None
        self._loop_task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.appended = 0
        self.failed = 0

    async def start(self) -> None:
        stream = self._partition.stream
        self._sub = await self._nc.subscribe(
            self._partition.subject,
            queue=stream.group,
            cb=self._on_message,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        self._loop_task = asyncio.create_task(self._run(), name=f"ingest-{self._partition.name}")
        # Wait until the NATS server has processed the subscription: a client that creates a stream and then
        # publishes to its subject at once must not lose what it published before our SUB took effect. Twice,
        # because nats-py writes a flush's PING straight to the socket while the SUB still waits in its pending
        # buffer for the flusher task: the first round trip guarantees the SUB has been written, the second that
        # the server has processed it (it handles a connection's commands in order).
        await self._nc.flush()
        await self._nc.flush()

    async def _on_message(self, msg: Any) -> None:
        self._pending.append((msg.subject, msg.reply, msg.data, msg.headers, time.time_ns()))
        self._wake.set()

    async def stop(self) -> None:
        """Unsubscribe, append what was already received, and wait for in-flight appends."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        self._stopping = True
        self._wake.set()
        if self._loop_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                chunk = self._take()
                await self._slots.acquire()
                task = asyncio.create_task(self._append(chunk))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
            if self._stopping:
                return

    def _take(self) -> list[_Pending]:
        """The oldest pending messages that fit one batch (at least one, which fits: NATS caps its size)."""
        pending = self._pending
        count = 0
        size = 0
        limit = min(len(pending), self._max_records)
        while count < limit:
            subject, reply, data, headers, _ = pending[count]
            size += _encoded_size_bound(subject, reply, data, headers)
            if size > self._max_bytes and count > 0:
                break
            count += 1
        chunk = pending[:count]
        del pending[:count]
        return chunk

    async def _append(self, chunk: list[_Pending]) -> None:
        try:
            partition = self._partition
            psubject = partition.subject
            records: list[NewRecord] = []
            acks: list[tuple[int, AckRequest]] = []
            for i, (subject, reply, data, headers, ts) in enumerate(chunk):
                record, ack = record_from_nats(subject, reply, data, headers, psubject, ts)
                records.append(record)
                if ack is not None and ack.ack_policy != Acks.NONE:
                    acks.append((i, ack))
            batch = build_batch(records, timestamp=chunk[0][4])
            try:
                appended = await partition.append(batch, Acks.LEADER, self._ack_timeout)
            except TidelogError as exc:
                self.failed += len(chunk)
                log.warning("could not store %d NATS messages on %s: %s", len(chunk), partition.name, exc)
                return
            self.appended += len(chunk)
            if acks:
                await self._send_acks(appended.base_offset, appended.received_ns, acks)
        except Exception:
            self.failed += len(chunk)
            log.exception("NATS ingest failed on %s", self._partition.name)
        finally:
            self._slots.release()

    async def _send_acks(self, base_offset: int, received_ns: int, acks: list[tuple[int, AckRequest]]) -> None:
        partition = self._partition
        if any(a.ack_policy == Acks.ALL for _, a in acks):
            last = base_offset + max(i for i, a in acks if a.ack_policy == Acks.ALL)
            await partition.wait_committed(last, self._ack_timeout)
        committed = time.time_ns()
        for i, ack in acks:
            message = build_ack(
                stream=partition.stream.name,
                partition_subject=partition.subject,
                msg_subject=ack.msg_subject,
                offset=base_offset + i,
                ack_inbox=ack.ack_inbox,
                correlation_id=ack.correlation_id,
                ack_policy=ack.ack_policy,
                received_ns=received_ns,
                committed_ns=committed,
            )
            payload = encode_envelope(MessageType.ACK, message.SerializeToString())
            await self._nc.publish(ack.ack_inbox, payload)
