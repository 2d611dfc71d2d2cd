"""NATS ingest: the partition leader's subscription to its subject, appending what arrives in batches.

How a message travels, and what each step costs (the broker's event loop is the bottleneck, so per-message Python
and per-byte copies are what count; on this class of machine copying a kilobyte costs about as much as parsing it):

1. **Receive** — :class:`~tidelog.broker.ingest.nats_reader.NatsReader`, a subscriber connection the broker's
   ingests share (:class:`~tidelog.broker.ingest.nats_pool.IngestPool`: a few per broker, one subscription per
   partition), parses each socket read in one pass and calls :meth:`NatsIngest._on_read` once per read that holds
   this partition's messages, the payloads as views of the read (not copies): a fraction of nats-py's per-message
   Python (its parser, a ``Msg`` object, a queue and a task wake-up each; docs/performance.md). nats-py remains the
   way in for URLs the reader does not speak (``tls://``, websockets) and for tests that stand in for the NATS
   client.
2. **Encode** — :class:`~tidelog.broker.ingest.encoder.IngestEncoder` turns the read into record batches at once, all
   in one buffer (byte-identical to :func:`~tidelog.protocol.records.build_batch`; a plain message is a few table
   lookups and concatenations, its payload copied once, into the buffer). The messages of one read share its
   reception time, plus 1 ns per message so that timestamps stay distinct and increasing (see that module).
   Batches respect the log's batch limit (``max_batch_bytes``, at most a segment): a batch the log refused would
   lose every message in it.
3. **Append** — the read's buffer goes straight to :meth:`~tidelog.broker.partitions.partition.Partition.write` in a
   task of its own, as a read-only view the log does not copy, as long as fewer than ``max_inflight`` appends are in
   flight. Beyond that, reads wait, and the next free slot takes all of them (up to ``max_append_bytes``) in one
   append — that is when appends wait for an fsync, and one fsync (group commit in the log) then covers everything
   that piled up. Appends start in the order the reads arrived, and the log writes each before it suspends, so
   records keep NATS's order.
4. **Ack** — to the Liftbridge ack inbox of enveloped messages per their policy: ``LEADER`` once the batch is in
   the leader's log, ``ALL`` once it is committed, ``NONE`` never. Plain NATS messages carry no ack inbox. Acks
   are published through the broker's nats-py client, each on its own: one that cannot be sent is counted
   (:attr:`NatsIngest.ack_failures`) and logged, and the others still go.

**Refused messages.** A message the encoder cannot take — a Liftbridge envelope whose ack policy is outside the
enum or whose ack inbox is no valid NATS subject, or one that fails to encode for any other reason — is left out
alone, never its neighbours of the same read: counted (:attr:`NatsIngest.refused`), logged (one warning per read,
naming the subject and what was wrong), and, when the envelope named a usable ack inbox, answered there with an
``Ack`` whose ``ackError`` is UNKNOWN and offset -1 (Liftbridge's ack has no field for a reason).

**Deduplication** (JetStream's, on this partition): a message whose ``Nats-Msg-Id`` header this partition stored
within ``duplicate_window_ms`` is not stored again (:mod:`tidelog.broker.ingest.msg_id_window`: which id counts, the
memory bound, what failover does). The encoder leaves it out; an enveloped duplicate that asks for an ack gets one
for its original's offset once that is known (a retry after a lost ack must not wait in vain), and none while the
original's append is still in flight (its own ack answers the same correlation id). On :meth:`NatsIngest.start` —
a new leader, or a restart — the window is first rebuilt from the log's last ``duplicate_window_ms``, before the
subscription: no message is judged against an incomplete window.

**Bounded memory, per partition.** What was received but is not yet stored is bounded by ``max_pending_bytes``:
past it this partition's subscription is paused (UNSUB of its sid on the shared connection) until appends catch up
(to half), then subscribed again; the other partitions on the connection keep receiving meanwhile. NATS core keeps
nothing for a paused subscriber, so what is published on the subject in that time is not received here (a queue
group's other members take it; otherwise it is lost, and the resume logs the gap). See the reader's notes on
back-pressure for how this compares with pausing the socket, which would stop every partition behind the slow one.

**Stop** unsubscribes, stores everything the server had already sent (the reader drains up to a PONG after the
UNSUB), and waits for the appends in flight.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from tidelog.broker.ingest.copies import copy_tag
from tidelog.broker.ingest.encoder import Decoded, Encoded, IngestEncoder, Message, Refused
from tidelog.broker.ingest.expectations import (
    WRONG_LAST_MSG_ID,
    WRONG_LAST_SEQUENCE,
    Check,
    Unmet,
    ack_reply,
    error_reply,
    last_msg_id,
)
from tidelog.broker.ingest.msg_id_window import PENDING, Entry, MsgIdWindow, rebuild
from tidelog.broker.ingest.nats_connection import UnsupportedServerError, supports
from tidelog.broker.ingest.nats_pool import IngestPool
from tidelog.broker.ingest.nats_reader import NatsReader, Subscription
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.partitions.write_path import Appended, WriteRefused
from tidelog.clock import Clock, SystemClock
from tidelog.protocol._gen import api_pb2
from tidelog.protocol.envelope import MessageType, encode_envelope
from tidelog.protocol.errors import ErrorCode, InvalidArgumentError, TidelogError
from tidelog.protocol.liftbridge import AckRequest, build_ack
from tidelog.protocol.messages import Acks
from tidelog.protocol.subjects import quote

log = logging.getLogger(__name__)

MiB = 1024 * 1024


def _wrong_last(check: Check, log_end: int) -> tuple[int, str]:
    """JetStream's refusal when the log did not end where ``check`` expected (the log end is the last sequence)."""
    if check.last_sequence is not None:
        return WRONG_LAST_SEQUENCE, f"wrong last sequence: {log_end}"
    return WRONG_LAST_MSG_ID, "wrong last msg ID: the partition changed while it was checked"


class NatsIngest:
    """Feeds one partition from its NATS subject.

    ``pool`` holds the broker's shared ingest connections; ``urls`` instead give this ingest a pool of its own (one
    connection, closed on stop). Without either (or when the reader cannot use them) it subscribes through ``nc``,
    the broker's nats-py client. ``duplicate_window_ms`` is the
    ``Nats-Msg-Id`` duplicate window (0: no deduplication); ``max_msg_ids`` bounds the ids it holds.
    """

    def __init__(
        self,
        nc: Any,
        partition: Partition,
        *,
        pool: IngestPool | None = None,
        urls: Sequence[str] = (),
        clock: Clock | None = None,
        max_batch_records: int = 4096,
        max_batch_bytes: int = 4 * MiB,
        max_append_bytes: int = 8 * MiB,
        max_inflight: int = 4,
        max_pending_bytes: int = 64 * MiB,
        ack_timeout: float = 5.0,
        reader_options: dict[str, Any] | None = None,
        duplicate_window_ms: int = 120_000,
        max_msg_ids: int = 100_000,
        queue: str | None = None,
    ) -> None:
        """``queue``: the NATS queue group to subscribe in (the stream's group, named for the cluster's
        namespace: :func:`tidelog.metadata.namespace.queue_group`); None: the stream's group as it is."""
        self._queue = queue if queue is not None else (partition.stream.group or None)
        self._nc = nc
        self._partition = partition
        self._clock: Clock = clock or SystemClock()
        self._own_pool = pool is None and bool(urls) and supports(urls)
        if pool is None and self._own_pool:
            pool = IngestPool(urls, size=1, clock=self._clock, reader_options=reader_options)
        self._pool = pool
        log_config = partition.log.config
        log_limit = min(log_config.max_batch_bytes, log_config.segment_max_bytes)
        if duplicate_window_ms < 0:
            raise ValueError(f"duplicate_window_ms must not be negative, got {duplicate_window_ms}")
        self.window = (
            MsgIdWindow(duplicate_window_ms * 1_000_000, max_entries=max_msg_ids) if duplicate_window_ms else None
        )
        self._encoder = IngestEncoder(
            partition.subject,
            max_batch_bytes=min(max_batch_bytes, log_limit),
            max_batch_records=max_batch_records,
            window=self.window,
            copy_tag=copy_tag(partition.stream.name, partition.record.id, self._queue),
            stream=partition.stream.name,
        )
        self._max_append_bytes = max_append_bytes
        self._max_inflight = max_inflight
        self._max_pending_bytes = max_pending_bytes
        self._ack_timeout = ack_timeout
        self._pending: collections.deque[Encoded] = collections.deque()  # reads encoded, waiting for a slot
        self._pending_bytes = 0  # encoded and not yet stored: waiting or in flight
        self._next_timestamp = 0  # the earliest timestamp the next message may get (keeps them increasing)
        self._inflight: set[asyncio.Task[None]] = set()
        self._acking: set[asyncio.Task[None]] = set()  # acks for duplicates (they hold no append slot)
        self.reader: NatsReader | None = None  # the shared connection carrying this partition's subscription
        self.subscription: Subscription | None = None
        self._sub: Any = None  # the nats-py subscription, when that is the way in
        self._received: list[Message] = []  # nats-py deliveries of the current loop turn
        self.appended = 0
        self.failed = 0
        self.pauses = 0  # times the subscription was paused because too much waited to be stored
        self.duplicates = 0  # messages not stored because their Nats-Msg-Id was within the window
        self.refused = 0  # messages not stored because they could not be taken (e.g. a refused envelope)
        self.copies = 0  # API publishes' NATS copies left out (this partition stored them directly)
        self.ack_failures = 0  # acks that could not be published
        self.acks_published = 0  # acks sent to ack inboxes (these counters are read by the metrics at scrape time)

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Rebuild the duplicate window from the log, then subscribe (see the module's notes)."""
        partition = self._partition
        if self.window is not None:
            found = await rebuild(self.window, partition.log, self._clock.now_ns())
            if found:
                log.info("NATS ingest %s: %d Nats-Msg-Id ids within the duplicate window", partition.name, found)
        if self._pool is not None:
            try:
                self.reader, self.subscription = await self._pool.subscribe(
                    partition.subject, self._on_read, self._queue
                )
            except UnsupportedServerError as exc:
                log.info("NATS ingest %s: %s; subscribing through nats-py instead", partition.name, exc)
            else:
                return
        self._sub = await self._nc.subscribe(
            partition.subject,
            queue=self._queue or "",
            cb=self._on_nats_py_message,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=512 * MiB,
        )
        # Wait until the NATS server has processed the subscription: a client that creates a stream and then
        # publishes to its subject at once must not lose what it published before our SUB took effect. Twice,
        # because nats-py writes a flush's PING straight to the socket while the SUB still waits in its pending
        # buffer for the flusher task: the first round trip guarantees the SUB has been written, the second that
        # the server has processed it (it handles a connection's commands in order).
        await self._nc.flush()
        await self._nc.flush()

    def publish_copy(self, command: bytes) -> bool:
        """Send an API publish's NATS copy on this ingest's own connection (:mod:`tidelog.broker.ingest.copies`);
        False when it has none that can take it."""
        reader, sub = self.reader, self.subscription
        return reader is not None and sub is not None and reader.publish(command, sub)

    async def stop(self) -> None:
        """Unsubscribe, append what was already received, and wait for the appends."""
        reader, sub = self.reader, self.subscription
        if reader is not None and sub is not None:
            await reader.unsubscribe(sub)
        if self._own_pool and self._pool is not None:
            await self._pool.close()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        self._take_received()
        while self._inflight:  # an append that ends starts the next one, if reads are waiting
            await asyncio.gather(*self._inflight, return_exceptions=True)
        await asyncio.gather(*self._acking, return_exceptions=True)

    # ------------------------------------------------------------------------------------------ receiving

    def _on_read(self, messages: Sequence[Message], received_ns: int) -> None:
        """One read's messages: encode them now, and append them as soon as a slot is free."""
        while True:
            stopped = self._encode(messages, received_ns)
            if stopped is None:
                break
            # A message with expectations on the log: alone, in its own append, after everything before it.
            i = next(i for i, m in enumerate(messages) if m is stopped)
            self._encode([stopped], received_ns, single=True)
            messages = messages[i + 1 :]
        reader, sub = self.reader, self.subscription
        if reader is not None and sub is not None and self._pending_bytes > self._max_pending_bytes and not sub.paused:
            log.warning(
                "NATS ingest %s: %d MiB received and not yet stored; pausing its subscription (messages published "
                "on %r until it resumes are not received here)",
                self._partition.name,
                self._pending_bytes // MiB,
                self._partition.subject,
            )
            reader.pause(sub)
            self.pauses += 1

    def _encode(self, messages: Sequence[Message], received_ns: int, *, single: bool = False) -> Message | None:
        """Encode and queue ``messages``; the message with log expectations that stopped the encoding, if any."""
        timestamp = max(received_ns, self._next_timestamp)
        encoded = self._encoder.encode(messages, timestamp, single=single)
        records = encoded.records
        self._next_timestamp = timestamp + records
        if encoded.duplicates:
            self._on_duplicates(encoded.duplicates)
        if encoded.refused:
            self._on_refused(encoded.refused)
        if encoded.unmet:
            self._answer([(reply, error_reply(exc.err_code, exc.description)) for reply, exc in encoded.unmet])
        self.copies += encoded.copies
        if encoded.too_large:
            self.failed += len(encoded.too_large)
            log.warning(
                "NATS ingest %s: %d messages (up to %d bytes) are larger than this log's batch limit; not stored",
                self._partition.name,
                len(encoded.too_large),
                max(encoded.too_large),
            )
        if records:
            self._pending_bytes += len(encoded.data)
            self._pending.append(encoded)
            self._start_appends()
        return encoded.stopped_at

    def _answer(self, replies: list[tuple[str, bytes]]) -> None:
        """JetStream-style answers to publishers' reply subjects (those without one get none)."""
        replies = [(subject, data) for subject, data in replies if subject]
        if replies:
            task = asyncio.get_running_loop().create_task(self._publish_replies(replies))
            self._acking.add(task)  # stop() waits for it
            task.add_done_callback(self._acking.discard)

    async def _publish_replies(self, replies: list[tuple[str, bytes]]) -> None:
        for subject, data in replies:
            try:
                await self._nc.publish(subject, data)
            except Exception as exc:
                self.ack_failures += 1
                log.warning("NATS ingest %s: could not answer on %s: %r", self._partition.name, quote(subject), exc)

    def _on_duplicates(self, duplicates: list[tuple[Entry, AckRequest | None]]) -> None:
        self.duplicates += len(duplicates)
        log.debug("NATS ingest %s: %d duplicate messages not stored", self._partition.name, len(duplicates))
        acks = [(entry, ack) for entry, ack in duplicates if ack is not None and ack.ack_policy != Acks.NONE]
        if acks:
            task = asyncio.get_running_loop().create_task(self._ack_duplicates(acks))
            self._acking.add(task)  # stop() waits for it
            task.add_done_callback(self._acking.discard)

    def _on_refused(self, refused: list[Refused]) -> None:
        """Messages the encoder could not take: counted, logged (one line per read), answered where possible."""
        self.refused += len(refused)
        first = refused[0]
        log.warning(
            "NATS ingest %s: %d message(s) refused and not stored; the first, on subject %s: %s",
            self._partition.name,
            len(refused),
            quote(first.subject),
            first.reason,
        )
        acks = [r.ack for r in refused if r.ack is not None]
        if acks:
            task = asyncio.get_running_loop().create_task(self._ack_refused(acks))
            self._acking.add(task)  # stop() waits for it
            task.add_done_callback(self._acking.discard)

    async def _ack_refused(self, acks: list[AckRequest]) -> None:
        """An error ack (``ackError`` UNKNOWN, offset -1) for each refused envelope that named a usable inbox."""
        now = self._clock.now_ns()
        error = int(InvalidArgumentError().spec.ack_error)
        await self._publish_acks([self._ack(ack, -1, now, now, error) for ack in acks])

    async def _ack_duplicates(self, acks: list[tuple[Entry, AckRequest]]) -> None:
        """Ack each duplicate with its original's offset (skipped while the original's append is in flight)."""
        try:
            for entry, ack in acks:
                if entry.offset != PENDING:
                    await self._send_acks(entry.offset, entry.timestamp, [(0, ack)])
        except Exception:
            log.exception("NATS ingest %s: acking duplicates failed", self._partition.name)

    async def _on_nats_py_message(self, msg: Any) -> None:
        """nats-py path: collect this loop turn's messages and encode them together, as one read."""
        if not msg.reply and not msg.headers and msg.subject == self._partition.subject:
            self._received.append(memoryview(msg.data))
        else:
            headers = [(k, v.encode()) for k, v in msg.headers.items()] if msg.headers else []
            self._received.append(Decoded(msg.subject, msg.reply, msg.data, headers))
        if len(self._received) == 1:
            asyncio.get_running_loop().call_soon(self._take_received)

    def _take_received(self) -> None:
        received, self._received = self._received, []
        if received:
            self._on_read(received, self._clock.now_ns())

    # ------------------------------------------------------------------------------------------ storing

    def _start_appends(self) -> None:
        """Start an append for what waits, while there are free slots (in order: tasks run as they were made)."""
        pending = self._pending
        while pending and len(self._inflight) < self._max_inflight:
            group = [pending.popleft()]
            size = len(group[0].data)
            alone = group[0].check is not None  # a message with expectations is appended on its own
            while (
                pending
                and not alone
                and pending[0].check is None
                and size + len(pending[0].data) <= self._max_append_bytes
            ):
                size += len(pending[0].data)
                group.append(pending.popleft())
            task = asyncio.get_running_loop().create_task(self._append(group))
            self._inflight.add(task)
            task.add_done_callback(self._append_done)

    def _append_done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._start_appends()

    async def _append(self, group: list[Encoded]) -> None:
        size = sum(len(read.data) for read in group)
        count = sum(read.records for read in group)
        partition = self._partition
        try:
            # One read's buffer goes to the log as it is: read-only, so the log need not copy it (nothing writes
            # to it after encoding). Reads that waited for a slot are joined: one copy, one append.
            data = memoryview(group[0].data).toreadonly() if len(group) == 1 else b"".join(r.data for r in group)
            check = group[0].check
            try:
                expected = None if check is None else self._expected_offset(check)
                appended: Appended | WriteRefused | TidelogError = await partition.write(
                    data, Acks.LEADER, self._ack_timeout, expected_offset=expected
                )
            except TidelogError as exc:
                appended = exc
            except Unmet as exc:
                assert check is not None
                self._answer([(check.reply, error_reply(exc.err_code, exc.description))])
                self._forget_ids(group)
                return
            finally:
                self._stored(size)
            if check is not None and isinstance(appended, WriteRefused) and appended.code is ErrorCode.INCORRECT_OFFSET:
                self._answer([(check.reply, error_reply(*_wrong_last(check, appended.log_end)))])
                self._forget_ids(group)
                return
            if check is not None and isinstance(appended, Appended):
                self._answer([(check.reply, ack_reply(partition.stream.name, appended.base_offset))])
            if not isinstance(appended, Appended):  # refused or failed: the one place either is reported
                self.failed += count
                log.warning("could not store %d NATS messages on %s: %s", count, partition.name, appended)
                self._forget_ids(group)
                return
            self.appended += count
            acks: list[tuple[int, AckRequest]] = []
            first = 0
            window = self.window
            for read in group:
                acks += ((first + i, ack) for i, ack in read.acks)
                if window is not None:
                    for i, entry in read.ids:
                        window.stored(entry, appended.base_offset + first + i)
                first += read.records
            if acks:
                await self._send_acks(appended.base_offset, appended.received_ns, acks)
        except Exception:
            self.failed += count
            log.exception("NATS ingest failed on %s", partition.name)

    def _expected_offset(self, check: Check) -> int | None:
        """Where the log must end for ``check`` to hold (sequence = offset + 1, so a last sequence is a log end;
        None: anywhere); raises :class:`Unmet` when the last record's ``Nats-Msg-Id`` is not the one expected."""
        if check.last_sequence is None and check.last_msg_id is None:
            return None
        log_end = self._partition.log_end
        expected = log_end if check.last_sequence is None else check.last_sequence
        if check.last_msg_id is not None and expected == log_end:
            found = last_msg_id(self._partition.log, log_end)
            if found != check.last_msg_id:
                raise Unmet(WRONG_LAST_MSG_ID, f"wrong last msg ID: {(found or b'').decode(errors='replace')}")
        return expected

    def _forget_ids(self, group: list[Encoded]) -> None:
        """Messages that were not stored leave the window: their retries are new messages, not duplicates."""
        if self.window is not None:
            for read in group:
                for _, entry in read.ids:
                    self.window.forget(entry)

    def _stored(self, size: int) -> None:
        self._pending_bytes -= size
        reader, sub = self.reader, self.subscription
        if (
            reader is not None
            and sub is not None
            and sub.paused
            and self._pending_bytes <= self._max_pending_bytes // 2
        ):
            reader.resume(sub)  # logs the gap

    async def _send_acks(self, base_offset: int, received_ns: int, acks: list[tuple[int, AckRequest]]) -> None:
        partition = self._partition
        if any(a.ack_policy == Acks.ALL for _, a in acks):
            last = base_offset + max(i for i, a in acks if a.ack_policy == Acks.ALL)
            await partition.wait_committed(last, self._ack_timeout)
        committed = self._clock.now_ns()
        await self._publish_acks([self._ack(ack, base_offset + i, received_ns, committed) for i, ack in acks])

    def _ack(
        self, ack: AckRequest, offset: int, received_ns: int, committed_ns: int, error: int = 0
    ) -> tuple[str, api_pb2.Ack]:
        """The Liftbridge ack of one enveloped message of this partition, with the inbox it goes to."""
        partition = self._partition
        return ack.ack_inbox, build_ack(
            stream=partition.stream.name,
            partition_subject=partition.subject,
            msg_subject=ack.msg_subject,
            offset=offset,
            ack_inbox=ack.ack_inbox,
            correlation_id=ack.correlation_id,
            ack_policy=ack.ack_policy,
            received_ns=received_ns,
            committed_ns=committed_ns,
            error=error,
        )

    async def _publish_acks(self, messages: list[tuple[str, api_pb2.Ack]]) -> None:
        """Publish each ack on its own: one that fails is counted and logged (once per call), never stopping the
        others. Ack inboxes were checked where the messages entered, so a failure here is the NATS connection's."""
        failed = 0
        first: Exception | None = None
        for inbox, ack in messages:
            try:
                await self._nc.publish(inbox, encode_envelope(MessageType.ACK, ack.SerializeToString()))
            except Exception as exc:
                failed += 1
                first = first or exc
        self.acks_published += len(messages) - failed
        if failed:
            self.ack_failures += failed
            log.warning(
                "NATS ingest %s: %d of %d acks could not be sent (the messages are stored); the first: %r",
                self._partition.name,
                failed,
                len(messages),
                first,
            )
