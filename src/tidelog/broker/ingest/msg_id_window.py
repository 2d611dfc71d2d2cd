"""JetStream-style deduplication on NATS ingest: the ``Nats-Msg-Id`` ids a partition stored recently.

A NATS publisher that may publish a message twice (a retry after a lost ack, a restarted job) names it with a
``Nats-Msg-Id`` header, as it would for JetStream; the ingest stores a message whose id it already stored within
the **duplicate window** (JetStream's ``duplicate_window``, two minutes by default) at most once per partition.

**Which id.** The id is the first header named exactly ``Nats-Msg-Id`` (case-sensitive, as in JetStream) *of the
record as stored*, its value's surrounding whitespace trimmed (:func:`msg_id_of`). For a plain NATS message that
is its NATS header (NATS headers are kept as record headers); for a Liftbridge envelope it is the envelope's own
header (an envelope's headers replace the NATS ones, see :func:`tidelog.protocol.liftbridge.record_from_nats`). An
empty value, or one longer than :data:`MAX_ID_BYTES`, is no id: the message is stored as any other. Defining the
id by what is stored is what lets the window be rebuilt from the log alone.

**State.** :class:`MsgIdWindow` maps id → :class:`Entry` (offset, timestamp), with a deque in arrival order for
expiry. An id is entered when its message is *encoded*, before its offset is known (``offset`` is
:data:`PENDING`), so a copy arriving while the original's append is still in flight is caught too; the ingest then
fills in the offset (:meth:`MsgIdWindow.stored`) or, when the append failed, takes the id out again
(:meth:`MsgIdWindow.forget`), so a retry of a message that was never stored is not mistaken for a duplicate.
Times are record timestamps (the ingest's wall clock at reception), so the live window and one rebuilt from the
log agree.

**Bounded memory.** At most ``max_entries`` ids are held (about 200 bytes each plus the id). Beyond that the oldest
ids are forgotten early: the window is then shorter than configured for that partition, and a duplicate of a
forgotten id is stored again (at-least-once, never a lost message). Each such eviction is counted
(:attr:`MsgIdWindow.evicted`) and the first of a run is logged.

**Failover and restart.** A new leader (or a restarted broker) calls :func:`rebuild`: it scans the partition's
log from the first offset stamped within the window to its end and enters every record that carries an id.
Batches written by the fast path (no headers) are skipped with one ``bytes.find`` each, without decoding. Records
that reached the log another way (a gRPC ``Publish`` carrying the header) are entered too: a record carrying the
id is in the stream, whichever way it came.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from tidelog.protocol.records import HEADER_SIZE, BatchHeader, Codec, decode_records, iter_batches
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.storage.encryption import open_batches
from tidelog.storage.errors import CorruptSegmentError, KeyUnavailableError, OffsetDamagedError, OffsetOutOfRangeError
from tidelog.storage.log import Log

log = logging.getLogger(__name__)

MSG_ID_HEADER = "Nats-Msg-Id"
_MSG_ID_BYTES = MSG_ID_HEADER.encode()

MAX_ID_BYTES = 1024
"""Longer ids are no id: they would make the window's memory bound meaningless."""

PENDING = -1
"""The offset of an entry whose message is encoded but not yet appended."""

_REBUILD_READ_BYTES = 8 * 1024 * 1024  # log bytes read per step of a rebuild, between yields to the event loop


def msg_id_of(headers: Iterable[tuple[str, bytes]]) -> bytes | None:
    """The message id a record's headers carry, or None (no header, an empty value, or one too long)."""
    for name, value in headers:
        if name == MSG_ID_HEADER:
            value = value.strip()
            return value if 0 < len(value) <= MAX_ID_BYTES else None
    return None


@dataclass(slots=True, eq=False)
class Entry:
    """One id in the window: where its message was stored (:data:`PENDING` until known) and when it arrived."""

    msg_id: bytes
    timestamp: int
    offset: int = PENDING


class MsgIdWindow:
    """The ids one partition stored within the last ``window_ns`` nanoseconds, at most ``max_entries`` of them."""

    def __init__(self, window_ns: int, *, max_entries: int = 100_000) -> None:
        if window_ns <= 0:
            raise ValueError(f"window_ns must be positive, got {window_ns}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        self.window_ns = window_ns
        self.max_entries = max_entries
        self._entries: dict[bytes, Entry] = {}
        # Arrival order, for expiry. May hold entries no longer in the map (forgotten, or replaced after expiring
        # out of order); popping one of those removes nothing.
        self._order: collections.deque[Entry] = collections.deque()
        self.evicted = 0  # ids forgotten before their time because of max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def duplicate_of(self, msg_id: bytes, timestamp: int) -> Entry | None:
        """The live entry ``msg_id`` duplicates, as of ``timestamp``; None when the message is new."""
        self._expire(timestamp - self.window_ns)
        entry = self._entries.get(msg_id)
        if entry is not None and entry.timestamp > timestamp - self.window_ns:
            return entry
        return None

    def add(self, msg_id: bytes, timestamp: int, offset: int = PENDING) -> Entry:
        """Enter ``msg_id`` (replacing an expired entry for it), evicting the oldest ids beyond ``max_entries``."""
        entry = Entry(msg_id, timestamp, offset)
        self._entries[msg_id] = entry
        self._order.append(entry)
        if len(self._entries) > self.max_entries:
            self._evict()
        return entry

    def stored(self, entry: Entry, offset: int) -> None:
        """The append of ``entry``'s message succeeded at ``offset``."""
        entry.offset = offset

    def forget(self, entry: Entry) -> None:
        """The append of ``entry``'s message failed: a retry of it is new (its deque slot goes stale)."""
        if self._entries.get(entry.msg_id) is entry:
            del self._entries[entry.msg_id]

    def clear(self) -> None:
        self._entries.clear()
        self._order.clear()

    def _expire(self, cutoff: int) -> None:
        order = self._order
        entries = self._entries
        while order and order[0].timestamp <= cutoff:
            entry = order.popleft()
            if entries.get(entry.msg_id) is entry:
                del entries[entry.msg_id]

    def _evict(self) -> None:
        if not self.evicted:
            log.warning(
                "more than %d Nats-Msg-Id ids within the duplicate window: forgetting the oldest early "
                "(their duplicates are stored again)",
                self.max_entries,
            )
        order = self._order
        entries = self._entries
        while len(entries) > self.max_entries:
            entry = order.popleft()
            if entries.get(entry.msg_id) is entry:
                del entries[entry.msg_id]
                self.evicted += 1


async def rebuild(window: MsgIdWindow, log_: Log, now_ns: int) -> int:
    """Refill ``window`` from ``log_``: every id stored at or after ``now_ns - window_ns``; returns how many.

    Reads the whole tail of the log, beyond the high watermark too: a new leader's log is the stream's truth, its
    tail will be committed. Yields to the event loop between reads, as the window may span much data.

    A batch that cannot be read is skipped, with a warning naming its offsets, and the rebuild goes on after it:
    the window then lacks that batch's ids (a duplicate of one of them is stored again), which is better than no
    ingest at all. When the damage gives no way past it, the rebuild ends there with what it found.
    """
    window.clear()
    cutoff = now_ns - window.window_ns
    try:
        offset = log_.offset_for_timestamp(cutoff + 1)
    except CorruptSegmentError as exc:  # the lookup met a batch it cannot decode: the window starts there or later
        offset = exc.first_offset
    found = 0
    max_bytes = _REBUILD_READ_BYTES
    careful_until = -1  # after a damaged read: batch by batch up to this offset, to keep the good ones before it
    while offset is not None and offset < log_.end_offset:
        if offset > careful_until:
            max_bytes = _REBUILD_READ_BYTES
        try:
            data = log_.read(offset, max_bytes)
        except OffsetOutOfRangeError:  # retention removed the start meanwhile: go on from the new start
            if offset >= log_.start_offset:
                raise
            offset = log_.start_offset
            continue
        except OffsetDamagedError as exc:  # a range the log already knows is damaged: go on after it
            log.warning(
                "Nats-Msg-Id window of %s: skipping damaged offsets %d..%d (%s); duplicates of ids stored there are "
                "not detected",
                log_.directory,
                exc.first,
                exc.last,
                exc.reason,
            )
            offset = exc.next_offset
            continue
        except CorruptSegmentError as exc:
            if max_bytes > 1:  # somewhere in this read: find it batch by batch
                max_bytes, careful_until = 1, max(exc.last_offset, offset)
                continue
            if exc.last_offset < offset:
                log.warning(
                    "Nats-Msg-Id window of %s: cannot read past offset %d (%s); the window holds the %d ids "
                    "found before it",
                    log_.directory,
                    offset,
                    exc.reason,
                    found,
                )
                break
            log.warning(
                "Nats-Msg-Id window of %s: skipping unreadable offsets %d..%d (%s); duplicates of ids stored "
                "there are not detected",
                log_.directory,
                offset,
                exc.last_offset,
                exc.reason,
            )
            offset = exc.last_offset + 1
            continue
        if not data:
            break
        if log_.keyring is not None:  # an encrypted stream's batches: the ids are inside the sealed records
            try:
                data = open_batches(data, log_.keyring)
            except KeyUnavailableError as exc:
                log.warning("Nats-Msg-Id window of %s: cannot read past offset %d (%s)", log_.directory, offset, exc)
                break
        try:
            for position, header in iter_batches(data):
                offset = header.next_offset
                found += _enter(window, data, position, header, cutoff, log_)
        except CorruptBatchError as exc:  # a header past the log's own checks: no way to find the next batch
            log.warning(
                "Nats-Msg-Id window of %s: cannot read past offset %d (%s); the window holds the %d ids found "
                "before it",
                log_.directory,
                offset,
                exc,
                found,
            )
            break
        await asyncio.sleep(0)
    return found


def _enter(window: MsgIdWindow, data: bytes, position: int, header: BatchHeader, cutoff: int, log_: Log) -> int:
    """Enter the ids the batch at ``position`` carries after ``cutoff``; how many. Skips it if it does not
    decode (logged with its offsets)."""
    if header.max_timestamp <= cutoff:
        return 0
    body = (position + HEADER_SIZE, position + header.size)
    if header.codec is Codec.NONE and data.find(_MSG_ID_BYTES, *body) < 0:
        return 0  # no record of it carries the header (the fast path's batches never do)
    try:
        records = decode_records(data, position, header=header)
    except CorruptBatchError as exc:
        log.warning(
            "Nats-Msg-Id window of %s: skipping offsets %d..%d, whose records do not decode (%s); duplicates of "
            "ids stored there are not detected",
            log_.directory,
            header.base_offset,
            header.last_offset,
            exc,
        )
        return 0
    found = 0
    for record in records:
        if record.timestamp <= cutoff:
            continue
        msg_id = msg_id_of(record.headers)
        if msg_id is not None:
            window.add(msg_id, record.timestamp, record.offset)
            found += 1
    return found
