"""What every nemesis run checks on top of :class:`~tidelog.testing.history.History`: Jepsen's queue anomalies
(:mod:`tidelog.testing.queue_checker`), replicas byte-identical up to the high watermark at rest, and
availability (acknowledged writes per second in each phase of the run).

- :class:`QueueRecordingHistory` is a ``History`` that also feeds a
  :class:`~tidelog.testing.queue_checker.QueueHistory`: the workloads record once, both checkers read. The
  ``History`` check stays because it covers what the queue checker does not: an *uncommitted read* (a record
  shown at or above the HW it came with) and a *refused write visible* (a write the broker definitely refused,
  found in committed data).
- :func:`replica_digests` hashes each replica's stored batches (their bytes, headers and CRCs included) up to a
  high watermark, read from its data directory once the brokers are stopped: two ISR replicas whose digests
  differ hold different bytes below the HW even if every record's value agrees.
- :func:`availability` splits a run into phases from the nemesis's schedule (``quiet`` between faults, one
  phase per fault kind in force) and counts the writes acknowledged in each, per second.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidelog.protocol.records import iter_batches
from tidelog.storage.log import Log
from tidelog.testing.history import History, partition_dir
from tidelog.testing.queue_checker import Outcome, QueueHistory, QueueReport

__all__ = [
    "QueueRecordingHistory",
    "ReplicaSeen",
    "availability",
    "format_availability",
    "replica_digests",
    "replicas_differ",
]

PRODUCER = "p"  # the load's records, in ack order (one producer at a time: ProduceLoad abandons before it starts anew)
FINAL = "final-read"
_READ_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReplicaSeen:
    """A replica recorded at rest: which broker, its checkpointed HW, whether the metadata had it in the ISR."""

    broker_id: str
    high_watermark: int
    in_isr: bool


class QueueRecordingHistory(History):
    """A :class:`History` that records the same events into :attr:`queue` (see the module docstring)."""

    def __init__(self, *, duplicates_are_violations: bool = False) -> None:
        super().__init__(duplicates_are_violations=duplicates_are_violations)
        self.queue = QueueHistory()
        self._acks: list[tuple[str, int, int, bytes]] = []
        self.replicas_seen: dict[tuple[str, int], list[ReplicaSeen]] = {}

    def acked(self, stream: str, partition: int, offset: int, value: bytes) -> None:
        super().acked(stream, partition, offset, value)
        self._acks.append((stream, partition, offset, value))

    def consumed(
        self, consumer: str, stream: str, partition: int, offset: int, value: bytes, high_watermark_seen: int
    ) -> None:
        super().consumed(consumer, stream, partition, offset, value, high_watermark_seen)
        self.queue.poll(consumer, stream, partition, [(offset, value)])
        self.queue.high_watermark(consumer, stream, partition, high_watermark_seen)

    def final_read(self, stream: str, partition: int, records: Iterable[tuple[int, bytes]]) -> None:
        records = list(records)
        super().final_read(stream, partition, records)
        self.queue.seek(FINAL, stream, partition)
        self.queue.poll(FINAL, stream, partition, records)

    def replica_log(
        self,
        broker_id: str,
        stream: str,
        partition: int,
        records: Iterable[tuple[int, bytes]],
        high_watermark: int,
        *,
        in_isr: bool = True,
    ) -> None:
        records = list(records)
        super().replica_log(broker_id, stream, partition, records, high_watermark, in_isr=in_isr)
        self.queue.replica(broker_id, stream, partition, records, high_watermark, in_isr=in_isr)
        seen = self.replicas_seen.setdefault((stream, partition), [])
        seen.append(ReplicaSeen(broker_id, high_watermark, in_isr))

    def check_queue(self) -> QueueReport:
        """The queue checker's report. Acknowledgements go in as sends of the producer instance that sent them
        (``<name>.<producer>`` in each value), in the order they were *sent* (its ``-<n>``): the load keeps many
        records in flight, and their acks may complete out of order (a retried batch) while the offsets still
        follow the sends, which is what ``nonmonotonic-send`` is about."""
        for stream, partition, offset, value in sorted(self._acks, key=_send_order):
            self.queue.send(_process(value), stream, partition, value, Outcome.OK, offset)
        self._acks.clear()
        return self.queue.check()


def _process(value: bytes) -> str:
    """Who sent ``value``: its ``<name>.<producer>`` part. One ProduceLoad runs producer instances one after
    another, but an abandoned one may still get acks while its successor writes: two processes, not one."""
    name, _, number = value.rpartition(b"-")
    return name.decode(errors="replace") if name and number.isdigit() else PRODUCER


def _send_order(ack: tuple[str, int, int, bytes]) -> tuple[bytes, int]:
    name, _, number = ack[3].rpartition(b"-")
    return (name, int(number)) if number.isdigit() else (ack[3], -1)


# ---- replicas byte-identical up to the HW ----


async def replica_digests(data_dir: Path, stream: str, partition: int, upto: int) -> tuple[str, int] | None:
    """SHA-256 of a stopped replica's batches that end at or below offset ``upto`` and how many offsets they
    cover; ``None`` without such a replica. Only at rest, like :func:`~tidelog.testing.history.read_replica`."""
    path = partition_dir(data_dir, stream, partition)
    if path is None:
        return None
    digest = hashlib.sha256()
    log = await Log.open_async(path)
    try:
        offset, covered = log.start_offset, log.start_offset
        end = min(log.end_offset, upto)
        while offset < end:  # each read returns at least one batch, so this ends within end - start rounds
            data = log.read(offset, _READ_BYTES)
            if not data:
                break
            next_offset = offset + 1
            for pos, header in iter_batches(data):
                if header.next_offset > upto:
                    return digest.hexdigest(), covered
                if header.next_offset > offset:
                    digest.update(bytes(data[pos : pos + header.size]))
                    covered = header.next_offset
                next_offset = max(next_offset, header.next_offset)
            offset = next_offset
    finally:
        await log.close()
    return digest.hexdigest(), covered


async def replicas_differ(
    data_dirs: dict[str, Path], stream: str, partition: int, seen: Sequence[ReplicaSeen]
) -> list[str]:
    """One sentence per ISR replica whose stored bytes differ from the first ISR replica's up to the partition's
    HW (the highest any ISR replica checkpointed; an ISR member holds everything below it)."""
    isr = [replica for replica in seen if replica.in_isr and replica.broker_id in data_dirs]
    if len(isr) < 2:
        return []
    upto = max(replica.high_watermark for replica in isr)
    digests = {}
    for replica in isr:
        digests[replica.broker_id] = await replica_digests(data_dirs[replica.broker_id], stream, partition, upto)
    first = isr[0].broker_id
    return [
        f"{stream}/{partition}: replica {replica.broker_id} differs from {first} below HW {upto} "
        f"({_show(digests[replica.broker_id])} vs {_show(digests[first])})"
        for replica in isr[1:]
        if digests[replica.broker_id] != digests[first]
    ]


def _show(digest: tuple[str, int] | None) -> str:
    return "no replica" if digest is None else f"sha256 {digest[0][:12]} over offsets below {digest[1]}"


# ---- availability ----


def availability(
    acks: Sequence[tuple[float, float]], events: Sequence[tuple[float, str, str]], started: float, ended: float
) -> dict[str, tuple[int, float]]:
    """Writes acknowledged and seconds spent per phase, from ``acks`` (``(sent_at, acked_at)``, monotonic) and a
    schedule's ``events`` (``(seconds since started, "start X"/"stop X", target)``) between ``started`` and
    ``ended``. A phase is ``quiet`` when no fault is in force, else the fault's name."""
    bounds: list[tuple[float, str]] = [(started, "quiet")]
    for at, what, _target in events:
        verb, _, fault = what.partition(" ")
        bounds.append((started + at, fault if verb == "start" else "quiet"))
    bounds.append((ended, ""))
    acked_at = sorted(acked for _, acked in acks)
    phases: dict[str, tuple[int, float]] = {}
    for (begin, phase), (finish, _) in itertools.pairwise(bounds):
        if finish <= begin:
            continue
        count = _count_between(acked_at, begin, finish)
        before = phases.get(phase, (0, 0.0))
        phases[phase] = (before[0] + count, before[1] + finish - begin)
    return phases


def _count_between(ordered: Sequence[float], begin: float, finish: float) -> int:
    return bisect.bisect_left(ordered, finish) - bisect.bisect_left(ordered, begin)


def format_availability(phases: dict[str, tuple[int, float]]) -> str:
    return ", ".join(
        f"{name} {count / seconds:.1f} acks/s ({count} in {seconds:.1f}s)"
        for name, (count, seconds) in sorted(phases.items())
        if seconds > 0
    )
