"""Client workloads for fault tests: producers and a tailing consumer that record everything into a
:class:`~tidelog.testing.history.History` while brokers crash, pause and get cut off.

They use the public client as a careful user would, and classify every outcome the way the checker needs:

- :class:`ProduceLoad` keeps a window of acks-ALL records in flight through a :class:`~tidelog.client.Producer`.
  An acknowledged record is ``acked`` at its offset. A record refused with ``NOT_LEADER`` or
  ``NOT_ENOUGH_REPLICAS`` is ``failed``: the producer retries only those two, and the broker raises both before
  it appends anything, so a record whose *last* attempt got one of them was never stored. Anything else (lost
  connection, TIMEOUT, UNAVAILABLE, no answer at all) is ``indeterminate``.
- The producer retries refusals itself but fails the records of a lost connection (they may be stored), and
  it has no delivery timeout: a paused leader never answers at all. So after any failure, or when the oldest
  record in flight has waited ``stall_timeout``, the load abandons that producer (closing its connections fails
  whatever it still waits for) and carries on with a new one bootstrapped from the brokers currently up.
- :class:`TailConsumer` follows the stream from the start and records each record with the high watermark of
  the fetch response that carried it; when its consumer fails or stalls it continues from the same position
  with a new one, under the same name (one reader's view of the HW must never go back).
- :func:`produce_direct` sends records to one broker's wire port, whatever the metadata says: the client that
  still talks to a deposed or cut-off leader, whose writes must not be acknowledged.

Every record value is unique (``<name>-<sequence>``), so duplicates and lost records can be told apart.
Loops are bounded by a stop event and by timeouts on every wait that could hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tidelog.client import Cluster, Consumer, Producer, RecordMetadata
from tidelog.protocol.connection import Connection
from tidelog.protocol.errors import NotEnoughReplicasError, NotLeaderError, TidelogError
from tidelog.protocol.messages import Acks, ProduceRequest, ProduceResponse
from tidelog.protocol.records import BatchBuilder, Codec
from tidelog.testing.history import History

__all__ = ["Bootstrap", "DirectOutcome", "ProduceLoad", "TailConsumer", "produce_direct", "read_all", "tally"]

log = logging.getLogger(__name__)

Bootstrap = Callable[[], Sequence[str]]
"""Where a new client starts: called for each new producer or consumer (``LocalCluster.bootstrap``)."""

CONNECT_TIMEOUT = 2.0  # loopback: a connect that takes longer goes to a black hole (a cut proxy)
REQUEST_TIMEOUT = 5.0  # metadata and offsets requests; a paused broker never answers
RESTART_BACKOFF = 0.2  # between abandoning a client and starting its successor
ABANDON_ROUNDS = 3


def _refused(exc: BaseException) -> bool:
    """The broker refused before appending (see the module docstring): the record is definitely not stored."""
    return isinstance(exc, NotLeaderError | NotEnoughReplicasError)


def _cluster(bootstrap: Bootstrap) -> Cluster:
    addresses = list(bootstrap())
    if not addresses:
        raise ConnectionError("no broker is up to bootstrap from")
    return Cluster(addresses, connect_timeout=CONNECT_TIMEOUT, request_timeout=REQUEST_TIMEOUT)


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


@dataclass
class ProduceStats:
    """What a :class:`ProduceLoad` saw; ``acks`` holds ``(sent_at, acked_at)`` in ``time.monotonic`` seconds."""

    acked: int = 0
    failed: int = 0
    indeterminate: int = 0
    producers: int = 0
    acks: list[tuple[float, float]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def first_ack_sent_after(self, moment: float) -> float | None:
        """When the first record sent at or after ``moment`` was acknowledged (the end of a failover)."""
        times = [acked for sent, acked in self.acks if sent >= moment]
        return min(times) if times else None

    def acked_between(self, start: float, end: float) -> int:
        return sum(1 for _, acked in self.acks if start <= acked < end)


class _Generation:
    """One producer of a :class:`ProduceLoad` and the records it has in flight. Each has its own, so that a
    producer being given up on (still failing its records) cannot disturb its successor."""

    def __init__(self, producer: Producer, cluster: Cluster) -> None:
        self.producer = producer
        self.cluster = cluster
        self.inflight: dict[asyncio.Future[RecordMetadata], tuple[bytes, float]] = {}
        self.trouble = False  # a record failed: replace this producer


class ProduceLoad:
    """Acks-ALL records to ``stream`` (round robin over its partitions), ``window`` in flight at most and at most
    ``rate`` per second, until stopped. See the module docstring for how outcomes are recorded."""

    def __init__(
        self,
        bootstrap: Bootstrap,
        stream: str,
        history: History,
        *,
        name: str = "p",
        window: int = 32,
        rate: float | None = None,
        stall_timeout: float = 2.0,
        ack_timeout_ms: int = 0,
    ) -> None:
        """``stall_timeout`` is how long the oldest record may wait for its outcome before the producer is
        given up on: the client has no delivery timeout of its own, and a paused broker never answers."""
        self.bootstrap = bootstrap
        self.stream = stream
        self.history = history
        self.name = name
        self.window = window
        self.rate = rate
        self.stall_timeout = stall_timeout
        self.ack_timeout_ms = ack_timeout_ms
        self.stats = ProduceStats()
        self._sequence = 0
        self._abandoning: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Produce until ``stop`` is set, one producer after another; return once every record has an outcome."""
        try:
            while not stop.is_set():
                try:
                    cluster = _cluster(self.bootstrap)
                except ConnectionError:
                    await _sleep_unless(stop, RESTART_BACKOFF)
                    continue
                producer = Producer(cluster=cluster, acks=Acks.ALL, ack_timeout_ms=self.ack_timeout_ms)
                generation = _Generation(producer, cluster)
                self.stats.producers += 1
                try:
                    await self._drive(generation, stop)
                    if not generation.trouble:  # stopping: wait for the records in flight, as a user closing would
                        with contextlib.suppress(TimeoutError, TidelogError):
                            await asyncio.wait_for(asyncio.shield(producer.close()), self.stall_timeout)
                finally:
                    # Given up on in the background: the next producer starts at once (failover is timed).
                    task = asyncio.create_task(self._abandon(generation), name=f"abandon-{self.name}")
                    self._abandoning.add(task)
                    task.add_done_callback(self._abandoning.discard)
                if not stop.is_set():
                    await _sleep_unless(stop, RESTART_BACKOFF)
        finally:
            if self._abandoning:
                await asyncio.gather(*self._abandoning, return_exceptions=True)

    async def _drive(self, generation: _Generation, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        inflight = generation.inflight
        started = loop.time()
        sent = 0
        while not stop.is_set() and not generation.trouble:
            now = loop.time()
            if inflight and time.monotonic() - min(t for _, t in inflight.values()) > self.stall_timeout:
                self._count_error("stalled")
                return
            if len(inflight) >= self.window or (self.rate and sent >= (now - started) * self.rate):
                if inflight:
                    await asyncio.wait(list(inflight), timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.sleep(1 / self.rate if self.rate else 0.01)
                continue
            # <name>.<producer>-<sequence>: unique, and it says which producer instance sent it (a checker's process)
            value = f"{self.name}.{self.stats.producers}-{self._sequence}".encode()
            self._sequence += 1
            sent += 1
            try:
                future = await asyncio.wait_for(generation.producer.send(self.stream, value), self.stall_timeout)
            except (TidelogError, TimeoutError, OSError) as exc:
                self._outcome_unknown(generation, value, exc)  # it may have gone nowhere, but nothing says so
                return
            inflight[future] = (value, time.monotonic())
            future.add_done_callback(functools.partial(self._done, generation))

    def _done(self, generation: _Generation, future: asyncio.Future[RecordMetadata]) -> None:
        entry = generation.inflight.pop(future, None)
        if entry is None:
            return  # already counted as unknown when its producer was given up on
        value, sent_at = entry
        if future.cancelled():
            self._outcome_unknown(generation, value, asyncio.CancelledError())
            return
        exc = future.exception()
        if exc is None:
            meta = future.result()
            self.history.acked(meta.stream, meta.partition, meta.offset, value)
            self.stats.acked += 1
            self.stats.acks.append((sent_at, time.monotonic()))
        elif _refused(exc):
            self.history.failed(value)
            self.stats.failed += 1
            self._count_error(type(exc).__name__)
            generation.trouble = True
        else:
            self._outcome_unknown(generation, value, exc)

    def _outcome_unknown(self, generation: _Generation, value: bytes, exc: BaseException) -> None:
        self.history.indeterminate(value)
        self.stats.indeterminate += 1
        self._count_error(type(exc).__name__)
        generation.trouble = True

    def _count_error(self, kind: str) -> None:
        self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1

    async def _abandon(self, generation: _Generation) -> None:
        """Give up on a producer without waiting for a broker that may never answer.

        Closing the connections fails every request in flight. ``Producer.close`` then flushes what was never
        sent, which opens connections again (possibly to a paused broker), so the connections are closed
        again until the close completes; a few rounds, each bounded. Records still without an outcome after
        that are counted as unknown."""
        closing = asyncio.ensure_future(generation.producer.close())
        for _ in range(ABANDON_ROUNDS):
            await generation.cluster.close()
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(closing), 1.0)
            if closing.done():
                break
        if not closing.done():
            closing.cancel()
        closing.add_done_callback(_retrieve)
        for future, (value, _) in list(generation.inflight.items()):
            generation.inflight.pop(future)
            future.add_done_callback(_retrieve)
            self._outcome_unknown(generation, value, TimeoutError())


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned future's outcome as seen (asyncio would log "exception was never retrieved")."""
    if not future.cancelled():
        future.exception()


@dataclass
class ConsumeStats:
    consumed: int = 0
    consumers: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class TailConsumer:
    """Follows every partition of ``stream`` from the start, recording what it sees (see the module docstring)."""

    def __init__(
        self, bootstrap: Bootstrap, stream: str, history: History, *, name: str = "c", stall_timeout: float = 3.0
    ) -> None:
        self.bootstrap = bootstrap
        self.stream = stream
        self.history = history
        self.name = name
        self.stall_timeout = stall_timeout
        self.stats = ConsumeStats()
        self.positions: dict[int, int] = {}  # partition → next offset to read

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                cluster = _cluster(self.bootstrap)
            except ConnectionError:
                await _sleep_unless(stop, RESTART_BACKOFF)
                continue
            self.stats.consumers += 1
            try:
                await self._follow(cluster, stop)
            except (TidelogError, TimeoutError, OSError) as exc:
                kind = type(exc).__name__
                self.stats.errors[kind] = self.stats.errors.get(kind, 0) + 1
            finally:
                await cluster.close()
            if not stop.is_set():
                await _sleep_unless(stop, RESTART_BACKOFF)

    async def _follow(self, cluster: Cluster, stop: asyncio.Event) -> None:
        info = await asyncio.wait_for(cluster.stream(self.stream, refresh=True), self.stall_timeout)
        consumers = [
            Consumer(
                stream=self.stream,
                cluster=cluster,
                partitions=[p.id],
                start=self.positions.get(p.id, "earliest"),
                max_wait_ms=500,
            )
            for p in info.partitions
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(c.start() for c in consumers)), self.stall_timeout)
            polls = [asyncio.ensure_future(self._read(c, stop)) for c in consumers]
            try:
                done, _ = await asyncio.wait(polls, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # re-raise the first failure: every partition restarts together
            finally:
                for task in polls:
                    task.cancel()
                await asyncio.gather(*polls, return_exceptions=True)
        finally:
            for consumer in consumers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.close(), REQUEST_TIMEOUT)

    async def _read(self, consumer: Consumer, stop: asyncio.Event) -> None:
        """One partition (one consumer each, so a stalled partition does not hide the others' progress)."""
        (partition,) = consumer.partitions
        while not stop.is_set():
            batches = await asyncio.wait_for(consumer.poll(), self.stall_timeout)
            if batches is None:
                return
            hw = consumer.high_watermark(partition)
            for batch in batches:
                for record in batch.records():
                    self.history.consumed(self.name, self.stream, partition, record.offset, record.value or b"", hw)
                    self.stats.consumed += 1
                self.positions[partition] = batch.next_offset


async def read_all(bootstrap: Bootstrap, stream: str, timeout: float) -> dict[int, list[tuple[int, bytes]]]:
    """Every committed record of every partition, from the start to the HW as the leaders report it now.

    Leadership may move while it reads (balancing): a retriable error starts the read over, until ``timeout``.
    """
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await _read_all_once(bootstrap, stream)
            except TidelogError as exc:
                if not exc.retriable:
                    raise
                log.info("reading %s again after %r", stream, exc)
                await asyncio.sleep(RESTART_BACKOFF)


async def _read_all_once(bootstrap: Bootstrap, stream: str) -> dict[int, list[tuple[int, bytes]]]:
    cluster = _cluster(bootstrap)
    out: dict[int, list[tuple[int, bytes]]] = {}
    try:
        info = await cluster.stream(stream, refresh=True)
        for p in info.partitions:
            records = out.setdefault(p.id, [])
            consumer = Consumer(stream=stream, cluster=cluster, partitions=[p.id], stop_at_end=True)
            try:
                async for record in consumer:
                    records.append((record.offset, record.value or b""))
            finally:
                await consumer.close()
    finally:
        await cluster.close()
    return out


class DirectOutcome(NamedTuple):
    """One write of :func:`produce_direct`: ``acked`` (at ``offset``), ``failed`` (refused) or
    ``indeterminate``; ``detail`` names the error; ``at`` is ``time.monotonic()`` when the outcome came."""

    outcome: str
    offset: int
    detail: str
    at: float

    def __str__(self) -> str:
        return f"acked at {self.offset}" if self.outcome == "acked" else f"{self.outcome} ({self.detail})"


def tally(outcomes: Sequence[DirectOutcome]) -> dict[str, int]:
    """How many of each outcome."""
    counts: dict[str, int] = {}
    for each in outcomes:
        counts[each.outcome] = counts.get(each.outcome, 0) + 1
    return counts


async def produce_direct(
    address: str,
    stream: str,
    partition: int,
    history: History,
    *,
    name: str,
    count: int,
    timeout: float,
    ack_timeout_ms: int = 2000,
    stop: asyncio.Event | None = None,
    until_refused: bool = False,
) -> list[DirectOutcome]:
    """Send up to ``count`` acks-ALL records one by one to the broker at ``address`` (``host:port`` of its wire
    listener), bypassing metadata, and record each outcome; returns the outcomes in order (``acked``,
    ``failed``, ``indeterminate``). Stops early once ``stop`` is set, or at the first refusal when
    ``until_refused`` (the broker knows it does not lead: later writes would test something else). Each
    request waits at most ``timeout`` seconds, so the call ends within ``count`` times (``timeout`` plus a
    connect)."""
    host, _, port = address.rpartition(":")
    outcomes: list[DirectOutcome] = []
    connection: Connection | None = None
    try:
        for i in range(count):
            if stop is not None and stop.is_set():
                break
            value = f"{name}-{i}".encode()
            offset, detail = -1, ""
            try:
                if connection is None or connection.closed:
                    connection = await Connection.open(
                        host, int(port), connect_timeout=CONNECT_TIMEOUT, max_frame_bytes=1 << 20, max_in_flight=16
                    )
                builder = BatchBuilder(time.time_ns())
                builder.append(value)
                request = ProduceRequest(stream, partition, Acks.ALL, ack_timeout_ms)
                response = await connection.request(request, builder.build(codec=Codec.NONE), timeout=timeout)
            except TidelogError as exc:
                outcome = "failed" if _refused(exc) else "indeterminate"
                detail = type(exc).__name__
            else:
                header = response.header
                assert isinstance(header, ProduceResponse)
                if header.error is None and header.base_offset >= 0:
                    offset = header.base_offset
                    history.acked(stream, partition, offset, value)
                    outcome = "acked"
                else:
                    outcome, detail = "indeterminate", str(header.error)
            if outcome == "failed":
                history.failed(value)
            elif outcome == "indeterminate":
                history.indeterminate(value)
            outcomes.append(DirectOutcome(outcome, offset, detail, time.monotonic()))
            if outcome == "failed" and until_refused:
                break
            if outcome != "acked":
                await asyncio.sleep(RESTART_BACKOFF)  # a refusing or unreachable broker: no busy loop
    finally:
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
    return outcomes
