"""A history checker for fault tests: what clients were told and what replicas hold, checked against the
guarantees of replication (ARCHITECTURE.md, "Replication"; issue 4, item 9).

A fault test records what happened while it ran — produces acknowledged with acks ALL, produces that failed,
records each consumer saw with the high watermark (HW) it was shown — and, once the cluster is at rest, each
replica's log. :meth:`History.check` then looks for violations, each reported as one sentence:

- **lost**: an acknowledged record is missing from the final read of its partition, or from an ISR replica at
  rest (an ack under ALL means every ISR member had it, and leaders are only ever elected from the ISR);
- **conflict**: one offset of a partition holds two different values anywhere: in acks, in what any consumer
  saw, in any replica below its HW, in the final read;
- **uncommitted read**: a consumer saw an offset at or above the HW it was shown with it;
- **HW went back**: a consumer was shown a lower HW than it had been shown before;
- **ISR divergence**: at rest, two ISR replicas differ below the HW (the highest HW any ISR replica reports,
  since followers checkpoint theirs lazily and may report less);
- **refused write visible**: a write the broker definitely refused (``failed``) is in committed data.

Only committed data is compared: a replica's records at or above its own HW are an uncommitted tail, which a
replica that left the ISR may still hold until it truncates, and which is allowed to differ.

Duplicates (one value at several offsets of a partition) are *notes*, not violations: a producer without
idempotence that retries after a lost ack writes twice, legitimately. ``History(duplicates_are_violations=True)``
makes them violations for idempotent producers. Values should therefore be unique per attempt (a test's sequence
number), or duplicates cannot be told from repeated payloads.

The checker is pure logic, unit-tested without processes. :func:`read_replica` reads a partition's log straight
from a broker's data directory at rest, to feed :meth:`History.replica_log`.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tidelog.local.cluster import LocalCluster
from tidelog.protocol.records import decode_records, iter_batches
from tidelog.storage.checkpoint import HW_CHECKPOINT_FILE, HighWatermarkCheckpoint
from tidelog.storage.log import Log

__all__ = [
    "CheckReport",
    "History",
    "HistoryViolationError",
    "ReplicaSnapshot",
    "Violation",
    "partition_dir",
    "read_replica",
]

PartitionKey = tuple[str, int]
_READ_BYTES = 4 * 1024 * 1024
_MAX_EXAMPLES = 5  # a violation with thousands of instances names a few and counts the rest


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken guarantee. ``kind`` is a short tag (``lost``, ``conflict`` ...); ``message`` a full sentence."""

    kind: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


class HistoryViolationError(AssertionError):
    """Raised by :meth:`CheckReport.raise_if_failed`; an ``AssertionError`` so pytest shows it as a failure."""

    def __init__(self, report: CheckReport) -> None:
        self.report = report
        super().__init__(str(report))


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :meth:`History.check` found: violations (the run is wrong) and notes (worth knowing, not wrong)."""

    violations: tuple[Violation, ...]
    notes: tuple[str, ...] = ()
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise HistoryViolationError(self)

    def __str__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.stats.items())
        head = "history OK" if self.ok else f"history has {len(self.violations)} violation(s)"
        lines = [f"{head} ({counts})" if counts else head]
        lines += [f"  {v}" for v in self.violations]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Consumed:
    consumer: str
    offset: int
    value: bytes
    high_watermark: int


@dataclass(frozen=True, slots=True)
class _Replica:
    broker_id: str
    records: dict[int, bytes]
    high_watermark: int
    in_isr: bool


class History:
    """Events of one fault-test run, recorded from any number of producer and consumer tasks (not threads)."""

    def __init__(self, *, duplicates_are_violations: bool = False) -> None:
        self.duplicates_are_violations = duplicates_are_violations
        self._acked: dict[PartitionKey, list[tuple[int, bytes]]] = defaultdict(list)
        self._failed: set[bytes] = set()
        self._indeterminate: set[bytes] = set()
        self._consumed: dict[PartitionKey, list[_Consumed]] = defaultdict(list)
        self._replicas: dict[PartitionKey, list[_Replica]] = defaultdict(list)
        self._final: dict[PartitionKey, dict[int, bytes]] = {}

    # ---- recording ----

    def acked(self, stream: str, partition: int, offset: int, value: bytes) -> None:
        """A produce acknowledged with acks ALL at ``offset``: it must survive every fault."""
        self._acked[(stream, partition)].append((offset, value))

    def acknowledged(self, stream: str, partition: int) -> list[tuple[int, bytes]]:
        """The records acknowledged so far in ``stream``/``partition``, as ``(offset, value)``."""
        return list(self._acked.get((stream, partition), []))

    def failed(self, value: bytes) -> None:
        """A produce the broker definitely refused (e.g. not enough replicas): it must never become visible."""
        self._failed.add(value)

    def indeterminate(self, value: bytes) -> None:
        """A produce whose outcome is unknown (timeout, lost connection): it may or may not be there."""
        self._indeterminate.add(value)

    def consumed(
        self, consumer: str, stream: str, partition: int, offset: int, value: bytes, high_watermark_seen: int
    ) -> None:
        """``consumer`` read ``value`` at ``offset``, delivered with ``high_watermark_seen`` (exclusive). Record a
        consumer's reads in the order it made them: the HW check depends on it."""
        self._consumed[(stream, partition)].append(_Consumed(consumer, offset, value, high_watermark_seen))

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
        """A replica's whole log at rest, with its HW; ``in_isr`` from the partition's metadata at that time."""
        self._replicas[(stream, partition)].append(_Replica(broker_id, dict(records), high_watermark, in_isr))

    def final_read(self, stream: str, partition: int, records: Iterable[tuple[int, bytes]]) -> None:
        """What a consumer read from the start to the HW after the run: every acknowledged record must be here."""
        self._final[(stream, partition)] = dict(records)

    # ---- checking ----

    def check(self) -> CheckReport:
        """Every violation and note, over every partition mentioned anywhere in the history."""
        violations: list[Violation] = []
        notes: list[str] = []
        keys = sorted({*self._acked, *self._consumed, *self._replicas, *self._final})
        for key in keys:
            violations += self._check_lost(key, notes)
            violations += self._check_conflicts(key)
            violations += self._check_consumers(key)
            violations += self._check_isr(key)
            violations += self._check_refused(key)
            dup = self._duplicates(key)
            if dup:
                if self.duplicates_are_violations:
                    violations.append(Violation("duplicate", dup))
                else:
                    notes.append(dup)
        stats = {
            "acked": sum(len(v) for v in self._acked.values()),
            "failed": len(self._failed),
            "indeterminate": len(self._indeterminate),
            "consumed": sum(len(v) for v in self._consumed.values()),
            "replicas": sum(len(v) for v in self._replicas.values()),
        }
        return CheckReport(tuple(violations), tuple(notes), stats)

    def _check_lost(self, key: PartitionKey, notes: list[str]) -> list[Violation]:
        acked = self._acked.get(key, [])
        if not acked:
            return []
        found: list[Violation] = []
        final = self._final.get(key)
        isr = [r for r in self._replicas.get(key, []) if r.in_isr]
        if final is None and not isr:
            notes.append(f"{_name(key)}: no final read and no ISR replica recorded, so losses were not checked")
        if final is not None:
            missing = [(o, v) for o, v in acked if final.get(o) != v]
            if missing:
                found.append(
                    Violation(
                        "lost",
                        f"{_name(key)}: {len(missing)} acknowledged record(s) missing from the final read, "
                        f"e.g. {_examples(missing, final)}",
                    )
                )
        for replica in isr:
            # Present with the acknowledged value is what counts: a replica's HW is checkpointed lazily (and
            # not at all by a broker killed with SIGKILL), so an ack above its recorded HW is no loss.
            lacking = [(o, v) for o, v in acked if replica.records.get(o) != v]
            if lacking:
                found.append(
                    Violation(
                        "lost",
                        f"{_name(key)}: ISR replica {replica.broker_id} (HW {replica.high_watermark}) lacks "
                        f"{len(lacking)} acknowledged record(s), "
                        f"e.g. {_examples(lacking, replica.records)}",
                    )
                )
        return found

    def _committed(self, key: PartitionKey) -> Iterable[tuple[str, int, bytes]]:
        """Every committed observation of the partition as ``(who saw it, offset, value)``."""
        for offset, value in self._acked.get(key, []):
            yield "an ack", offset, value
        for c in self._consumed.get(key, []):
            if c.offset < c.high_watermark:  # above the HW it is an uncommitted read, reported on its own
                yield f"consumer {c.consumer}", c.offset, c.value
        for r in self._replicas.get(key, []):
            for offset, value in r.records.items():
                if offset < r.high_watermark:
                    yield f"replica {r.broker_id}", offset, value
        for offset, value in self._final.get(key, {}).items():
            yield "the final read", offset, value

    def _check_conflicts(self, key: PartitionKey) -> list[Violation]:
        first: dict[int, tuple[str, bytes]] = {}
        conflicts: list[str] = []
        for who, offset, value in self._committed(key):
            seen = first.setdefault(offset, (who, value))
            if seen[1] != value:
                conflicts.append(f"offset {offset}: {seen[0]} has {_show(seen[1])}, {who} has {_show(value)}")
        if not conflicts:
            return []
        return [
            Violation(
                "conflict",
                f"{_name(key)}: {len(conflicts)} offset observation(s) disagree with an earlier one; "
                + "; ".join(conflicts[:_MAX_EXAMPLES]),
            )
        ]

    def _check_consumers(self, key: PartitionKey) -> list[Violation]:
        found: list[Violation] = []
        last_hw: dict[str, int] = {}
        for c in self._consumed.get(key, []):
            if c.offset >= c.high_watermark:
                found.append(
                    Violation(
                        "uncommitted-read",
                        f"{_name(key)}: consumer {c.consumer} saw offset {c.offset} at or above the HW "
                        f"{c.high_watermark} it was shown",
                    )
                )
            previous = last_hw.get(c.consumer)
            if previous is not None and c.high_watermark < previous:
                found.append(
                    Violation(
                        "hw-went-back",
                        f"{_name(key)}: consumer {c.consumer} was shown HW {c.high_watermark} after HW {previous}",
                    )
                )
            last_hw[c.consumer] = max(c.high_watermark, previous or 0)
        return found

    def _check_isr(self, key: PartitionKey) -> list[Violation]:
        isr = [r for r in self._replicas.get(key, []) if r.in_isr]
        if len(isr) < 2:
            return []
        hw = max(r.high_watermark for r in isr)
        reference = isr[0]
        expected = {o: v for o, v in reference.records.items() if o < hw}
        found: list[Violation] = []
        for replica in isr[1:]:
            actual = {o: v for o, v in replica.records.items() if o < hw}
            if actual == expected:
                continue
            differing = sorted(o for o in expected.keys() | actual.keys() if expected.get(o) != actual.get(o))
            shown = ", ".join(
                f"{o}: {_show(expected.get(o))} vs {_show(actual.get(o))}" for o in differing[:_MAX_EXAMPLES]
            )
            found.append(
                Violation(
                    "isr-divergence",
                    f"{_name(key)}: ISR replicas {reference.broker_id} and {replica.broker_id} differ at "
                    f"{len(differing)} offset(s) below HW {hw} ({shown})",
                )
            )
        return found

    def _check_refused(self, key: PartitionKey) -> list[Violation]:
        if not self._failed:
            return []
        visible = sorted({(o, v) for _, o, v in self._committed(key) if v in self._failed})
        if not visible:
            return []
        return [
            Violation(
                "refused-write-visible",
                f"{_name(key)}: {len(visible)} write(s) the broker refused are committed, e.g. "
                + ", ".join(f"{_show(v)} at offset {o}" for o, v in visible[:_MAX_EXAMPLES]),
            )
        ]

    def _duplicates(self, key: PartitionKey) -> str | None:
        offsets_of: dict[bytes, set[int]] = defaultdict(set)
        for _, offset, value in self._committed(key):
            offsets_of[value].add(offset)
        dups = {v: sorted(o) for v, o in offsets_of.items() if len(o) > 1}
        if not dups:
            return None
        shown = ", ".join(f"{_show(v)} at {o}" for v, o in list(dups.items())[:_MAX_EXAMPLES])
        return f"{_name(key)}: {len(dups)} value(s) stored at more than one offset ({shown})"


def _name(key: PartitionKey) -> str:
    return f"{key[0]}/{key[1]}"


def _show(value: bytes | None) -> str:
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _examples(missing: list[tuple[int, bytes]], present: dict[int, bytes]) -> str:
    shown = [f"offset {o} ({_show(v)}, found {_show(present.get(o))})" for o, v in missing[:_MAX_EXAMPLES]]
    more = len(missing) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


# ---- replicas at rest ----


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """A replica's log as found on disk: every record's ``(offset, value)`` and the checkpointed HW.

    The HW checkpoint is written lazily, so it may be behind the HW the replica last knew (never ahead).
    """

    records: list[tuple[int, bytes]]
    high_watermark: int
    log_end: int


def partition_dir(data_dir: Path, stream: str, partition: int, *, created_ns: int | None = None) -> Path | None:
    """``<data_dir>/streams/<stream>@<created_ns>/<partition>``; the newest incarnation when ``created_ns`` is
    not given (a stream deleted and created again leaves an older directory until the broker removes it)."""
    root = Path(data_dir) / "streams"
    if created_ns is not None:
        path = root / f"{stream}@{created_ns}" / str(partition)
        return path if path.is_dir() else None
    found: list[tuple[int, Path]] = []
    for incarnation in root.glob(f"{stream}@*") if root.is_dir() else ():
        name, _, stamp = incarnation.name.rpartition("@")
        if name == stream and stamp.isdigit() and (incarnation / str(partition)).is_dir():
            found.append((int(stamp), incarnation / str(partition)))
    return max(found)[1] if found else None


async def read_replica(
    data_dir: Path, stream: str, partition: int, *, created_ns: int | None = None
) -> ReplicaSnapshot | None:
    """Read a partition's log from a broker's data directory; ``None`` if the broker has no such replica.

    Only at rest: the broker must not be running (opening the log runs recovery, which may truncate a torn tail
    exactly as the broker itself would on its next start). Keyless ``None`` values read as ``b""``.
    """
    path = partition_dir(data_dir, stream, partition, created_ns=created_ns)
    if path is None:
        return None
    log = await Log.open_async(path)
    try:
        records: list[tuple[int, bytes]] = []
        offset, end = log.start_offset, log.end_offset
        while offset < end:  # each read returns at least one batch, so this ends within end - start rounds
            data = log.read(offset, _READ_BYTES)
            if not data:
                break
            next_offset = offset + 1
            for pos, header in iter_batches(data):
                next_offset = max(next_offset, header.next_offset)
                if header.is_control:  # transaction markers, not records anyone produced
                    continue
                records.extend(
                    (r.offset, r.value or b"") for r in decode_records(data, pos, header=header) if r.offset >= offset
                )
            offset = next_offset
    finally:
        await log.close()
    hw = await asyncio.to_thread(HighWatermarkCheckpoint(path / HW_CHECKPOINT_FILE).read, 0)
    return ReplicaSnapshot(records, hw, end)


async def read_cluster_replica(
    cluster: LocalCluster, broker_id: str, stream: str, partition: int
) -> ReplicaSnapshot | None:
    """A local cluster broker's replica of a partition as stored on disk; only while the broker is not running."""
    handle = cluster.broker(broker_id)
    if handle.running:
        raise RuntimeError(f"stop or kill broker {broker_id} before reading its files")
    return await read_replica(handle.data_dir, stream, partition)
