"""Pause, resume and auto-pause: Liftbridge's way of letting idle partitions cost nothing.

**Paused** is a flag on the partition's metadata record, written by the controller (``PauseStream``, ``tidelog
stream pause``, or the auto-pause sweep below) and so kept in etcd: it survives restarts. Every replica acts on it
(:class:`~tidelog.broker.partitions.partition.Partition` is closed by the
:class:`~tidelog.broker.manager.PartitionManager`): the leader unsubscribes from NATS and closes its log, each
follower stops fetching and closes its copy. A paused partition holds no file descriptor, no NATS subscription
and no memory, and a broker that starts does not open it.

A plain NATS message published on a paused partition's subject is therefore **not stored**: nobody subscribes to
the subject for the partition, as in Liftbridge (where a paused partition likewise unsubscribes). Streams that
must keep every NATS message should not pause (leave ``autoPauseTime`` unset), or be written through the API.

**Resume** clears the flag; every replica then opens the partition again as after a restart (the leader
subscribes to NATS again). What resumes it:

- a publish through the API: gRPC ``Publish``/``PublishAsync`` and the wire protocol's produce and
  transactional append. With ``resumeAll`` given at pause time, every paused partition of the stream resumes,
  not only the one written to (Liftbridge's rule);
- a gRPC ``Subscribe`` with ``resume`` set; without it the subscribe fails with PARTITION_PAUSED
  (``FAILED_PRECONDITION``, as Liftbridge answers), and so do subscriptions open when the partition is paused;
- a wire fetch or list-offsets (the native consumer always reads as if ``resume`` were set: it was told to read
  the partition), and a cursor request to a paused ``__cursors`` partition;
- ``tidelog stream resume`` (``SET_STREAM_STATE``).

A resume waits until this broker's metadata shows it applied (and, here at its leader, the partition open), so
the request that resumed the partition is then served by it.

**Auto-pause**: a stream's ``autoPauseTime`` (or the broker's ``auto_pause_time_ms``; ``__cursors`` uses
``cursors_stream_auto_pause_time_ms``) pauses a partition that received no message for that long. With
``autoPauseDisableIfSubscribers`` (or ``auto_pause_disable_if_subscribers``; always for ``__cursors``, as
Liftbridge) not while it is read: a gRPC subscription is open on it, or a wire fetch read it within the last
:data:`FETCH_SUBSCRIBER_WINDOW` seconds. One task per broker sweeps the partitions it leads (:class:`Pauses`),
not a timer per partition, and only when one can be due: it sleeps until the earliest deadline it knows of (at
least :data:`SWEEP_PERIOD`), woken early when this broker starts leading a partition or a led stream's settings
change. With auto-pause off, an idle broker never sweeps. A partition's idle time counts from the last message it
received, or from when this broker started leading it (a resume restarts the count).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from tidelog.broker.manager import PartitionManager
from tidelog.broker.partitions.followed import FollowedPartition
from tidelog.broker.partitions.partition import Partition
from tidelog.broker.streams import StreamAdmin
from tidelog.clock import Clock, SystemClock
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot, PartitionKey
from tidelog.protocol.cursors import CURSORS_STREAM
from tidelog.protocol.errors import NotLeaderError, PartitionPausedError, UnavailableError

log = logging.getLogger(__name__)

SWEEP_PERIOD = 1.0
"""The shortest time between two auto-pause sweeps (a partition pauses at most this late)."""
FETCH_SUBSCRIBER_WINDOW = 5.0
"""A wire fetch of a partition within this many seconds counts as a subscriber (a consumer long-polls)."""
_WINDOW_NS = int(FETCH_SUBSCRIBER_WINDOW * 1e9)
_SETTLE_WAIT = 10.0  # seconds a request waits for this broker to open a partition another broker resumed


def _paused(snap: MetadataSnapshot, stream: str, partition: int) -> bool:
    record = snap.partition(stream, partition)
    return record is not None and record.paused


class Pauses:
    """Resumes paused partitions for requests, counts readers, and runs the auto-pause sweep."""

    def __init__(
        self,
        manager: PartitionManager,
        admin: StreamAdmin,
        mirror: MetadataMirror,
        *,
        auto_pause_ms: int = 0,
        disable_if_subscribers: bool = False,
        cursors_auto_pause_ms: int = 0,
        clock: Clock | None = None,
    ) -> None:
        """The broker defaults: ``auto_pause_ms`` (0: off) and ``disable_if_subscribers`` for streams without
        their own setting; ``cursors_auto_pause_ms`` for ``__cursors``."""
        self._manager = manager
        self._admin = admin
        self._mirror = mirror
        self._auto_pause_ms = auto_pause_ms
        self._disable_if_subscribers = disable_if_subscribers
        self._cursors_auto_pause_ms = cursors_auto_pause_ms
        self._clock: Clock = clock or SystemClock()
        self._subscriptions: dict[PartitionKey, int] = {}  # open gRPC subscriptions per partition
        self._fetched: dict[PartitionKey, int] = {}  # monotonic ns of the last wire fetch per partition
        self._sweeper: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()  # a partition led anew or a stream altered: its deadline may come first

    # ------------------------------------------------------------------------------------------ resume

    async def resume(self, stream: str, partition: int) -> None:
        """Resume ``partition`` if it is paused, with every paused partition of the stream when it was paused
        with ``resume_all``; return once this broker's metadata shows it."""
        snap = self._mirror.snapshot
        record = snap.partition(stream, partition)
        if record is None or not record.paused:
            return
        ids = [partition]
        if record.resume_all:
            ids = sorted({partition, *(p.id for p in snap.partitions_of(stream) if p.paused)})
        log.info("resuming %s partition(s) %s for a request", stream, ",".join(map(str, ids)))
        await self._admin.set_paused(stream, ids, False)

    async def leader(self, stream: str, partition: int) -> Partition:
        """The partition this broker leads, resumed first when paused; the precise error otherwise."""
        try:
            return self._manager.leader_of(stream, partition)
        except PartitionPausedError:
            await self.resume(stream, partition)
        except NotLeaderError as exc:
            await self._settle(stream, partition, exc)
        return self._manager.leader_of(stream, partition)

    async def reader(self, stream: str, partition: int, *, isr_replica: bool) -> Partition | FollowedPartition:
        """Where a subscriber reads (:meth:`PartitionManager.reader_of`), resumed first when paused."""
        try:
            return self._manager.reader_of(stream, partition, isr_replica=isr_replica)
        except PartitionPausedError:
            await self.resume(stream, partition)
        except NotLeaderError as exc:
            await self._settle(stream, partition, exc)
        return self._manager.reader_of(stream, partition, isr_replica=isr_replica)

    async def _settle(self, stream: str, partition: int, not_leader: NotLeaderError) -> None:
        """After NOT_LEADER: if this broker is applying a resume right now (another broker resumed the partition
        and forwarded the request here before this one's metadata showed it), wait until the partition is open;
        re-raise otherwise."""
        record = self._mirror.snapshot.partition(stream, partition)  # as of the last change fully applied
        if record is None or not record.paused:
            raise not_leader
        try:
            await self._mirror.wait_for(lambda s: not _paused(s, stream, partition), _SETTLE_WAIT)
        except TimeoutError:
            raise UnavailableError(f"partition {stream}/{partition} is being resumed; retry") from None

    # ------------------------------------------------------------------------------------------ readers

    @contextlib.contextmanager
    def subscribed(self, stream: str, partition: int) -> Iterator[None]:
        """Count a gRPC subscription of the partition while it is open."""
        key = (stream, partition)
        self._subscriptions[key] = self._subscriptions.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._subscriptions[key] - 1
            if left:
                self._subscriptions[key] = left
            else:
                del self._subscriptions[key]

    def fetched(self, stream: str, partition: int) -> None:
        """A wire fetch read the partition (a consumer: a subscriber for auto-pause)."""
        self._fetched[(stream, partition)] = self._clock.monotonic_ns()

    def has_subscribers(self, key: PartitionKey) -> bool:
        if self._subscriptions.get(key):
            return True
        last = self._fetched.get(key)
        return last is not None and self._clock.monotonic_ns() - last < _WINDOW_NS

    # ------------------------------------------------------------------------------------------ auto-pause

    def auto_pause_of(self, stream: StreamRecord) -> tuple[int, bool]:
        """The stream's auto-pause time in ms (0: never) and whether readers keep it from pausing."""
        if stream.name == CURSORS_STREAM:
            return self._cursors_auto_pause_ms, True
        config = stream.config
        ms = self._auto_pause_ms if config.auto_pause_time_ms is None else config.auto_pause_time_ms
        keep = config.auto_pause_disable_if_subscribers
        return ms, self._disable_if_subscribers if keep is None else keep

    def start(self) -> None:
        if self._sweeper is None:
            self._manager.add_lead_listener(self._woken.set)
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="auto-pause")

    async def stop(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            await asyncio.gather(sweeper, return_exceptions=True)

    async def _sweep_forever(self) -> None:
        delay: float | None = SWEEP_PERIOD
        while True:
            await self._sleep(delay)
            try:
                await self.sweep()
                delay = self.next_sweep_in()
            except Exception:
                log.exception("the auto-pause sweep failed; trying again in %.0f s", SWEEP_PERIOD)
                delay = SWEEP_PERIOD

    async def _sleep(self, delay: float | None) -> None:
        """Sleep ``delay`` seconds (None: until woken) or until :attr:`_woken`; woken, still SWEEP_PERIOD since
        the start (creating many partitions wakes it once each)."""
        self._woken.clear()
        start = self._clock.monotonic_ns()
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._woken.wait())]
        if delay is not None:
            waits.append(asyncio.ensure_future(self._clock.sleep(delay)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        left = SWEEP_PERIOD - (self._clock.monotonic_ns() - start) / 1e9
        if self._woken.is_set() and left > 0:
            await self._clock.sleep(left)

    def next_sweep_in(self) -> float | None:
        """Seconds until the earliest auto-pause deadline among the partitions led here (at least
        SWEEP_PERIOD); None when none has auto-pause on."""
        now = self._clock.now_ns()
        earliest: int | None = None
        for partition in self._manager.partitions():
            ms, _ = self.auto_pause_of(partition.stream)
            if ms <= 0 or partition.record.paused or partition.record.reassign_to:
                continue
            due = max(partition.latest_received_ns, partition.led_since_ns) + ms * 1_000_000
            earliest = due if earliest is None else min(earliest, due)
        if earliest is None:
            return None
        return max(SWEEP_PERIOD, (earliest - now) / 1e9)

    def idle(self) -> list[Partition]:
        """The partitions led here that are due to be auto-paused now."""
        now = self._clock.now_ns()
        due = []
        for partition in self._manager.partitions():
            ms, keep_if_read = self.auto_pause_of(partition.stream)
            if ms <= 0 or partition.record.paused or partition.record.reassign_to:
                continue  # a partition being moved stays open: its new replicas fetch from it
            idle_since = max(partition.latest_received_ns, partition.led_since_ns)
            if now - idle_since < ms * 1_000_000:
                continue
            key = (partition.stream.name, partition.record.id)
            if keep_if_read and self.has_subscribers(key):
                continue
            due.append(partition)
        return due

    async def sweep(self) -> list[PartitionKey]:
        """Pause every idle partition led here (:meth:`idle`); the ones paused."""
        paused: list[PartitionKey] = []
        for partition in self.idle():
            name, pid = partition.stream.name, partition.record.id
            ms, _ = self.auto_pause_of(partition.stream)
            log.info("%s received no message in %d ms: auto-pausing it", partition.name, ms)
            try:
                await self._admin.set_paused(name, [pid], True)
            except Exception as exc:  # the controller changing, the stream deleted meanwhile: next sweep
                log.warning("could not auto-pause %s: %s", partition.name, exc)
                continue
            paused.append((name, pid))
        now = self._clock.monotonic_ns()
        for key in [k for k, at in self._fetched.items() if now - at >= _WINDOW_NS]:
            del self._fetched[key]
        return paused
