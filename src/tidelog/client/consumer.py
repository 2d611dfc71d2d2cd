"""The asyncio consumer: reads one stream's partitions from a start position, long-polling at the tail.

::

    async with Consumer("127.0.0.1:9293", "orders", start="earliest") as consumer:
        async for record in consumer:                    # ConsumerRecord, decoded
            ...
        async for batch in consumer.fetch_batches():     # FetchedBatch: counted without decoding records
            total += batch.record_count

Start positions: ``"earliest"`` (the log start), ``"latest"`` (only records produced from now on: the high
watermark, Kafka's meaning — Liftbridge's LATEST, the last existing record, is ``"latest"`` minus one), an
``int`` offset, or :class:`AtTimestamp` (the first record at or after a time). They are resolved with one
LIST_OFFSETS request per partition, so fetches are plain offset reads.

How it reads. Each partition has its own connection to its leader (replies on a connection come back in
request order, so one partition's long-poll must not delay another's data) and exactly one fetch in flight:
as soon as a response arrives, the next fetch (from the offset after its last batch) is sent *before* the
batches are handed to the caller, so the broker prepares the next response while Python decodes this one.
Batches are CRC-checked on arrival (hardware CRC: cheap) and records are decoded only when asked for.

Read-only partitions end. A partition set read-only (``SetStreamReadonly``, ``tidelog stream readonly``) that has
been read to its end is not fetched any more (:meth:`Consumer.at_readonly_end` says so), and iteration ends once
every partition read has ended that way (or, with ``stop_at_end``, reached its high watermark): a consumer of a
read-only stream finishes instead of waiting forever, as a Liftbridge subscription ends with "End of readonly
partition". A paused partition is resumed by the consumer's reads (see :mod:`tidelog.broker.pausing`).

Reading from a follower. With ``replica`` (a broker id) each partition is read from that broker's copy while
the broker is in the partition's ISR and not its leader (Liftbridge's ``readISRReplica``, Kafka's follower
fetching): committed records only, up to the high watermark that follower knows, which trails the leader's by
at most one replication round trip. Start positions are still resolved at the leader. When the broker is not
in the ISR, cannot be reached, or is the leader, the partition is read from its leader as usual, and so it is
for good after a fetch from the follower failed (it left the ISR, or stopped).

Failures. Reads are idempotent, so a lost connection or NOT_LEADER is handled by refreshing metadata,
reconnecting and fetching the same offset again. An offset outside the log (retention removed it) resets to
``auto_offset_reset`` (``"earliest"``, ``"latest"``, or ``"error"`` to raise ``OffsetOutOfRangeError``). Other
errors (the stream was deleted, …) are raised to the caller.

Damage on the broker's disk (bit rot) never stalls a consumer. A batch that fails its CRC on arrival is not
delivered: the batches before it are, and the same offset is fetched again with ``verify``, which makes the
broker check the bytes on its disk. Damage found there comes back as OFFSET_DAMAGED naming the damaged offsets;
the consumer moves its position past them and, with ``on_damaged="raise"`` (the default), raises
:class:`~tidelog.protocol.errors.OffsetDamagedError` (``first``, ``last``, ``next_offset``) once: iterating again
continues after the range. With ``on_damaged="skip"`` it logs a warning and reads on. Once an operator has
confirmed skipping the range (``tidelog partition skip-damaged``) the broker passes over it itself.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from tidelog.client.cluster import DEFAULT_BOOTSTRAP, Cluster
from tidelog.client.records import FetchedBatch, batches_before_corruption, batches_of
from tidelog.protocol.connection import Connection, Response
from tidelog.protocol.errors import (
    ErrorCode,
    OffsetDamagedError,
    StaleGroupEpochError,
    TidelogError,
    UnavailableError,
    from_error_body,
)
from tidelog.protocol.messages import (
    FetchRequest,
    FetchResponse,
    GroupContext,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from tidelog.protocol.records.errors import CorruptBatchError
from tidelog.protocol.records.rows import ConsumerRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AtTimestamp:
    """Start at the first record whose timestamp (ns since the Unix epoch) is at or after ``ns``."""

    ns: int


StartPosition = Literal["earliest", "latest"] | int | AtTimestamp
OffsetReset = Literal["earliest", "latest", "error"]
OnDamaged = Literal["raise", "skip"]


class _Partition:
    """One partition being read: where, over which connection, and the fetch in flight."""

    __slots__ = (
        "at_end",
        "connection",
        "ended",
        "fetch",
        "follower",
        "high_watermark",
        "id",
        "position",
        "replica_failed",
        "verify",
    )

    def __init__(self, partition: int) -> None:
        self.id = partition
        self.position = -1
        self.high_watermark = 0
        self.at_end = False  # the last response reached the high watermark
        self.ended = False  # read to the end of a read-only partition: no more fetches
        self.connection: Connection | None = None
        self.fetch: asyncio.Future[Response] | None = None
        self.verify = False  # the last answer failed its CRC here: the next fetch asks the broker to check
        self.follower = False  # the connection is to an in-sync follower (``replica``), not to the leader
        self.replica_failed = False  # a fetch from the follower failed: read the leader from now on


class Consumer:
    """Reads the records of one stream (all partitions, or those given). See the module docstring."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        stream: str = "",
        *,
        partitions: Sequence[int] | None = None,
        start: StartPosition = "earliest",
        cluster: Cluster | None = None,
        ssl: ssl_.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        max_bytes: int = 1024 * 1024,
        max_wait_ms: int = 500,
        auto_offset_reset: OffsetReset = "earliest",
        stop_at_end: bool = False,
        verify_crc: bool = True,
        retry_backoff_ms: int = 100,
        on_damaged: OnDamaged = "raise",
        group: GroupContext | None = None,
        replica: str | None = None,
    ) -> None:
        """``stop_at_end`` ends iteration once every partition has been read up to the high watermark it
        reported (a snapshot read, for scripts); otherwise iteration follows the tail forever. ``on_damaged``:
        what to do at offsets damaged on the broker's disk (see the module docstring). ``group``: fetch as that
        consumer group member (the group consumer's readers); the broker refuses its fetches once the partition
        is no longer the member's at the group's current epoch (``StaleGroupEpochError``). ``replica``: read from that
        broker's copy while it is an in-sync follower (see the module docstring)."""
        if not stream:
            raise ValueError("a consumer reads one stream: pass its name")
        self.stream = stream
        self._group = group  # fetches as this consumer group member (fenced by its epoch on the broker)
        self._replica = replica
        self._owns_cluster = cluster is None
        self._cluster = Cluster(bootstrap, ssl=ssl, credentials=credentials) if cluster is None else cluster
        self._wanted = None if partitions is None else list(partitions)
        self._start = start
        self._max_bytes = max_bytes
        self._max_wait_ms = max_wait_ms
        self._reset = auto_offset_reset
        self._stop_at_end = stop_at_end
        self._verify = verify_crc
        self._backoff = retry_backoff_ms / 1000
        self._on_damaged = on_damaged
        self._damaged: OffsetDamagedError | None = None
        self._partitions: dict[int, _Partition] = {}
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Look up the partitions, connect to their leaders, resolve the start position, send first fetches."""
        if self._started:
            return
        info = await self._cluster.stream(self.stream, refresh=True)
        ids = [p.id for p in info.partitions] if self._wanted is None else self._wanted
        self._partitions = {i: _Partition(i) for i in ids}
        await asyncio.gather(*(self._connect(p) for p in self._partitions.values()))
        await asyncio.gather(*(self._resolve_start(p, self._start) for p in self._partitions.values()))
        for p in self._partitions.values():
            self._send_fetch(p)
        self._started = True

    async def close(self) -> None:
        for p in self._partitions.values():
            fetch, p.fetch = p.fetch, None
            if fetch is not None:
                # The answer to the fetch in flight is no longer wanted; retrieving its outcome keeps asyncio
                # from logging "exception never retrieved" when the connection closing fails it.
                fetch.add_done_callback(_discard)
                fetch.cancel()
            if p.connection is not None:
                await self._cluster.release(p.connection)
                p.connection = None
        if self._owns_cluster:
            await self._cluster.close()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- positions -----------------------------------------------------------------------------------------------

    def position(self, partition: int) -> int:
        """Where the next fetch of ``partition`` starts: one past the last batch handed out (or being handed out)."""
        return self._partitions[partition].position

    def high_watermark(self, partition: int) -> int:
        """The partition's high watermark as of the latest response."""
        return self._partitions[partition].high_watermark

    def at_readonly_end(self, partition: int) -> bool:
        """Whether ``partition`` was read to the end of its log while read-only: nothing more will come, and it
        is not fetched any more (a new consumer reads it again, e.g. once it is writable again)."""
        return self._partitions[partition].ended

    @property
    def partitions(self) -> list[int]:
        return list(self._partitions)

    # -- reading ------------------------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self.records()

    async def records(self) -> AsyncIterator[ConsumerRecord]:
        """Every record from the start position on, decoded (see :meth:`fetch_batches` for the fast path)."""
        async for batch in self.fetch_batches():
            for record in batch.records():
                yield record

    async def fetch_batches(self) -> AsyncIterator[FetchedBatch]:
        """Every batch from the start position on; a batch's records are decoded only if asked for."""
        while True:
            batches = await self.poll()
            if batches is None:
                return
            for batch in batches:
                yield batch

    async def poll(self) -> list[FetchedBatch] | None:
        """Wait for the next fetch responses and return their batches (possibly none after a long-poll
        timeout); None once every partition is at its end under ``stop_at_end``."""
        await self.start()
        if self._damaged is not None:
            damaged, self._damaged = self._damaged, None
            raise damaged
        if all(p.ended or (self._stop_at_end and p.at_end) for p in self._partitions.values()):
            return None
        waiting = {p.fetch: p for p in self._partitions.values() if p.fetch is not None}
        if not waiting:  # a partition at its end (stop_at_end, or read-only) sends no further fetch
            return None
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        out: list[FetchedBatch] = []
        for future in done:
            try:
                out.extend(await self._take(waiting[future], future))
            except OffsetDamagedError as exc:
                self._damaged = exc  # raised once the batches other partitions brought are handed out
        if not out and self._damaged is not None:
            damaged, self._damaged = self._damaged, None
            raise damaged
        return out

    async def _take(self, p: _Partition, future: asyncio.Future[Response]) -> list[FetchedBatch]:
        """Turn one fetch response into batches and send the partition's next fetch."""
        p.fetch = None
        try:
            response = future.result()
        except TidelogError as exc:
            if not exc.retriable or (self._group is not None and isinstance(exc, StaleGroupEpochError)):
                raise  # a fenced member's fetch: its group consumer learns the new epoch and reads again
            log.info("fetch of %s/%d failed (%s); reconnecting", self.stream, p.id, exc)
            p.replica_failed = p.replica_failed or p.follower
            await asyncio.sleep(self._backoff)
            await self._reconnect(p)
            self._send_fetch(p)
            return []
        header = response.header
        assert isinstance(header, FetchResponse)
        p.high_watermark = header.high_watermark
        if header.error is not None:
            if header.error.code == ErrorCode.OFFSET_DAMAGED and header.damaged_last >= 0:
                self._past_damage(p, header)
                return []
            await self._out_of_range(p, header)
            self._send_fetch(p)
            return []
        start = p.position
        try:
            batches = batches_of(response.payload, self.stream, p.id, start, verify=self._verify)
        except CorruptBatchError as exc:
            if p.verify:
                raise  # the broker checked these bytes and found them sound: they changed on the way
            batches = batches_before_corruption(response.payload, self.stream, p.id, start)
            log.warning("a batch of %s/%d failed its CRC (%s); asking the broker to check it", self.stream, p.id, exc)
            p.verify = True
            if batches:
                p.position = batches[-1].header.next_offset
            self._send_fetch(p)
            return batches
        p.verify = False
        if batches:
            p.position = batches[-1].header.next_offset
        p.at_end = p.position >= header.high_watermark
        p.ended = header.readonly and p.at_end and header.high_watermark >= header.log_end
        if not (p.ended or (self._stop_at_end and p.at_end)):
            self._send_fetch(p)
        return batches

    def _send_fetch(self, p: _Partition) -> None:
        assert p.connection is not None
        request = FetchRequest(
            self.stream,
            p.id,
            p.position,
            self._max_bytes,
            self._max_wait_ms,
            verify=p.verify,
            group=self._group,
            isr_read=p.follower,
        )
        try:
            p.fetch = p.connection.send(request)
        except TidelogError as exc:
            failed: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            p.fetch = failed

    def _past_damage(self, p: _Partition, header: FetchResponse) -> None:
        """Move past offsets damaged on the broker's disk, fetch on, and raise them once (or log: ``skip``)."""
        assert header.error is not None
        error = from_error_body(header.error)
        p.verify = False
        p.position = max(p.position, header.damaged_last + 1)
        self._send_fetch(p)
        if self._on_damaged == "raise":
            if isinstance(error, OffsetDamagedError):
                error.first, error.last = header.damaged_first, header.damaged_last
            raise error
        log.warning("%s/%d: %s; reading on from %d", self.stream, p.id, error.message, p.position)

    async def _out_of_range(self, p: _Partition, header: FetchResponse) -> None:
        assert header.error is not None
        if self._reset == "error":
            raise from_error_body(header.error)
        target = header.log_start if self._reset == "earliest" else header.high_watermark
        log.warning("offset %d of %s/%d is out of range; resetting to %d", p.position, self.stream, p.id, target)
        p.position = target

    async def _connect(self, p: _Partition, *, refresh: bool = False) -> None:
        if refresh:
            await self._cluster.stream(self.stream, refresh=True)
        p.follower = False
        if self._replica is not None and not p.replica_failed:
            info = await self._cluster.partition(self.stream, p.id)
            if self._replica in info.isr and self._replica != info.leader:
                try:
                    p.connection = await self._cluster.broker_connection(self._replica)
                    p.follower = True
                    return
                except UnavailableError as exc:  # a lost connection too
                    log.info(
                        "replica %s of %s/%d unreachable (%s); reading the leader",
                        self._replica,
                        self.stream,
                        p.id,
                        exc,
                    )
        p.connection = await self._cluster.leader_connection(self.stream, p.id, dedicated=True)

    async def _reconnect(self, p: _Partition) -> None:
        if p.connection is not None:
            await self._cluster.release(p.connection)
            p.connection = None
        await self._connect(p, refresh=True)

    async def _resolve_start(self, p: _Partition, start: StartPosition) -> None:
        assert p.connection is not None
        timestamp = start.ns if isinstance(start, AtTimestamp) else -1
        request = ListOffsetsRequest(self.stream, p.id, timestamp)
        if p.follower:  # bounds and offsets for a time are the leader's to give
            response = await self._cluster.leader_request(self.stream, p.id, request)
        else:
            response = await p.connection.request(request, timeout=self._cluster.request_timeout)
        bounds = response.header
        assert isinstance(bounds, ListOffsetsResponse)
        p.high_watermark = bounds.high_watermark
        if start == "earliest":
            p.position = bounds.log_start
        elif start == "latest":
            p.position = bounds.high_watermark
        elif isinstance(start, AtTimestamp):
            p.position = bounds.offset
        elif isinstance(start, int) and not isinstance(start, bool):
            p.position = start
        else:
            raise ValueError(f"unknown start position {start!r}")


def _discard(future: asyncio.Future[Response]) -> None:
    if not future.cancelled():
        future.exception()
