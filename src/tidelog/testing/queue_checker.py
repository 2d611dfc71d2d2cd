"""A queue checker with Jepsen's vocabulary: the anomalies its Kafka-style queue workload looks for, over a
recorded history of sends, polls and replica states (issue 23, item 3).

The definitions are Jepsen's, restated for tidelog (a *key* is a stream partition, an offset is a log offset):

``lost-write``
    A send acknowledged at offset *o* that no poll ever returned, although polls of its key returned offsets
    above *o*: readers went past it, so it is gone.
``unseen``
    A send acknowledged at offset *o* that no poll returned, and no poll of its key reached past *o* either.
    Not necessarily an anomaly mid-run (nobody has read that far yet); after a final drain of every partition
    it is a loss. Counted apart so a run can tell which it is.
``inconsistent-offsets``
    One offset of a key holding two different values anywhere: in acknowledgements, in polls, on replicas.
``duplicate``
    One value at more than one offset of a key (a retried send written twice).
``nonmonotonic-send``
    One process's acknowledged sends to a key whose offsets do not increase in the order the sends completed.
``nonmonotonic-poll``
    One process's polls of a key returning an offset at or below one it already polled, without a seek (an
    ``assign`` or a rebalance) in between.
``poll-skip``
    One process's consecutive polls of a key jumping from offset *a* to *b* over an offset between them that
    holds a value (some send, poll or replica shows one): the consumer missed a record.
``lost-on-node``
    A replica at rest missing an offset the history shows committed (acknowledged, or polled by a consumer) below
    the partition's high watermark (the highest any replica reports) when it is in the ISR, below its own when it
    is not: the node lost or diverged from the log, the split-brain signal of Jepsen's NATS 2.12 analysis.
``hw-regression``
    A high watermark observed by one process (a consumer's fetch, a replica's checkpoint over time) lower than one
    it observed before.

A history is recorded while a run goes (:meth:`QueueHistory.send`, :meth:`~QueueHistory.poll`,
:meth:`~QueueHistory.seek`, :meth:`~QueueHistory.high_watermark`) and at rest (:meth:`~QueueHistory.replica`);
:meth:`QueueHistory.check` returns a :class:`QueueReport` that counts every anomaly (all of them, zeros
included: a run's report says "0 lost-write", not nothing) with a few examples each. Pure logic, no processes:
the nemesis harness feeds it, the unit tests feed it hand-made histories.
"""

from __future__ import annotations

import enum
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

Key = tuple[str, int]  # (stream, partition)

ANOMALIES = (
    "lost-write",
    "unseen",
    "inconsistent-offsets",
    "duplicate",
    "nonmonotonic-send",
    "nonmonotonic-poll",
    "poll-skip",
    "lost-on-node",
    "hw-regression",
)
"""Every anomaly :meth:`QueueHistory.check` counts, in report order."""

_EXAMPLES = 5  # examples kept per anomaly: an anomaly seen thousands of times names a few and counts the rest


class Outcome(enum.Enum):
    """How a send ended, as Jepsen's op types: ``ok`` acknowledged, ``fail`` definitely not written, ``info``
    unknown (a timeout, a lost connection: it may or may not be in the log)."""

    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class _Send:
    process: str
    value: bytes
    outcome: Outcome
    offset: int | None


@dataclass(frozen=True, slots=True)
class _Poll:
    process: str
    records: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True, slots=True)
class _Seek:
    process: str


@dataclass(frozen=True, slots=True)
class _Replica:
    node: str
    records: dict[int, bytes]
    high_watermark: int
    in_isr: bool


@dataclass(frozen=True, slots=True)
class QueueReport:
    """What :meth:`QueueHistory.check` found: a count per anomaly and up to five examples of each."""

    counts: dict[str, int]
    examples: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No anomaly at all. ``unseen`` counts too: call :meth:`check` after a final drain of every partition."""
        return not any(self.counts.values())

    def __str__(self) -> str:
        lines = [", ".join(f"{self.counts[name]} {name}" for name in ANOMALIES)]
        for name in ANOMALIES:
            lines += [f"  {name}: {example}" for example in self.examples.get(name, ())]
        return "\n".join(lines)


class _Found:
    """Anomalies as they are found: counts, and the first few examples."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(ANOMALIES, 0)
        self.examples: dict[str, list[str]] = defaultdict(list)

    def add(self, anomaly: str, example: str) -> None:
        self.counts[anomaly] += 1
        if len(self.examples[anomaly]) < _EXAMPLES:
            self.examples[anomaly].append(example)

    def report(self) -> QueueReport:
        return QueueReport(dict(self.counts), {name: tuple(found) for name, found in self.examples.items()})


def _where(key: Key, offset: int) -> str:
    return f"{key[0]}/{key[1]}@{offset}"


class QueueHistory:
    """The events of one run, in the order they completed (record from tasks of one loop, not from threads)."""

    def __init__(self) -> None:
        self._sends: dict[Key, list[_Send]] = defaultdict(list)
        self._events: dict[Key, list[_Poll | _Seek]] = defaultdict(list)  # polls and seeks, in order
        self._hws: dict[tuple[str, Key], list[int]] = defaultdict(list)
        self._replicas: dict[Key, list[_Replica]] = defaultdict(list)

    # ------------------------------------------------------------------------------------------- recording

    def send(
        self, process: str, stream: str, partition: int, value: bytes, outcome: Outcome, offset: int | None = None
    ) -> None:
        """A send completed: ``offset`` is where an acknowledged one was written (``None`` otherwise)."""
        if outcome is Outcome.OK and offset is None:
            raise ValueError("an acknowledged send has an offset")
        self._sends[(stream, partition)].append(_Send(process, value, outcome, offset))

    def poll(self, process: str, stream: str, partition: int, records: Iterable[tuple[int, bytes]]) -> None:
        """``process`` polled ``records`` (``(offset, value)``, in the order returned) from one partition."""
        self._events[(stream, partition)].append(_Poll(process, tuple(records)))

    def seek(self, process: str, stream: str, partition: int) -> None:
        """``process`` moved its position in a partition (assign, seek, rebalance): its next poll may go back."""
        self._events[(stream, partition)].append(_Seek(process))

    def high_watermark(self, process: str, stream: str, partition: int, high_watermark: int) -> None:
        """``process`` (a consumer, or a node reporting its own) observed ``high_watermark``, in order."""
        self._hws[(process, (stream, partition))].append(high_watermark)

    def replica(
        self,
        node: str,
        stream: str,
        partition: int,
        records: Iterable[tuple[int, bytes]],
        high_watermark: int,
        *,
        in_isr: bool = True,
    ) -> None:
        """A replica's log at rest (``(offset, value)``), its high watermark (exclusive) and ISR membership."""
        self._replicas[(stream, partition)].append(_Replica(node, dict(records), high_watermark, in_isr))

    # ------------------------------------------------------------------------------------------- checking

    def check(self) -> QueueReport:
        found = _Found()
        for key in sorted({*self._sends, *self._events, *self._replicas}):
            values = self._values_by_offset(key, found)
            polled = self._polled(key)
            self._check_sends(key, polled, found)
            self._check_duplicates(key, values, found)
            self._check_polls(key, values, found)
            self._check_replicas(key, polled, found)
        for (process, key), seen in sorted(self._hws.items()):
            for before, after in itertools.pairwise(seen):
                if after < before:
                    found.add("hw-regression", f"{process} saw the HW of {key[0]}/{key[1]} go from {before} to {after}")
        return found.report()

    def _polled(self, key: Key) -> dict[int, bytes]:
        return {
            offset: value for event in self._events[key] if isinstance(event, _Poll) for offset, value in event.records
        }

    def _values_by_offset(self, key: Key, found: _Found) -> dict[int, bytes]:
        """Every offset's value by any observation; an offset seen with two values is ``inconsistent-offsets``."""
        seen: dict[int, set[bytes]] = defaultdict(set)
        for send in self._sends[key]:
            if send.outcome is Outcome.OK and send.offset is not None:
                seen[send.offset].add(send.value)
        for offset, value in self._all_polled(key):
            seen[offset].add(value)
        for replica in self._replicas[key]:
            for offset, value in replica.records.items():
                seen[offset].add(value)
        values = {}
        for offset, candidates in sorted(seen.items()):
            if len(candidates) > 1:
                found.add("inconsistent-offsets", f"{_where(key, offset)} holds {sorted(candidates)!r:.200}")
            values[offset] = min(candidates)
        return values

    def _all_polled(self, key: Key) -> Iterable[tuple[int, bytes]]:
        for event in self._events[key]:
            if isinstance(event, _Poll):
                yield from event.records

    def _check_sends(self, key: Key, polled: dict[int, bytes], found: _Found) -> None:
        polled_values = set(polled.values())
        highest_read = max(polled, default=-1)
        last_by_process: dict[str, int] = {}
        for send in self._sends[key]:
            if send.outcome is not Outcome.OK or send.offset is None:
                continue
            previous = last_by_process.get(send.process)
            if previous is not None and send.offset <= previous:
                found.add(
                    "nonmonotonic-send",
                    f"{send.process} was acknowledged at {_where(key, send.offset)} after {previous}",
                )
            last_by_process[send.process] = send.offset
            if send.value in polled_values:
                continue
            if highest_read > send.offset:
                found.add("lost-write", f"{send.value!r:.60} acknowledged at {_where(key, send.offset)}, read past it")
            else:
                found.add("unseen", f"{send.value!r:.60} acknowledged at {_where(key, send.offset)}, never read")

    def _check_duplicates(self, key: Key, values: dict[int, bytes], found: _Found) -> None:
        offsets: dict[bytes, list[int]] = defaultdict(list)
        for offset, value in values.items():
            offsets[value].append(offset)
        for value, where in offsets.items():
            if len(where) > 1:
                found.add("duplicate", f"{value!r:.60} at offsets {where[:10]} of {key[0]}/{key[1]}")

    def _check_polls(self, key: Key, values: dict[int, bytes], found: _Found) -> None:
        position: dict[str, int] = {}  # each process's last polled offset since its last seek
        for event in self._events[key]:
            if isinstance(event, _Seek):
                position.pop(event.process, None)
                continue
            for offset, _value in event.records:
                last = position.get(event.process)
                if last is not None and offset <= last:
                    found.add("nonmonotonic-poll", f"{event.process} polled {_where(key, offset)} after {last}")
                elif last is not None and offset > last + 1:
                    missed = [o for o in range(last + 1, min(offset, last + 1 + 10_000)) if o in values]
                    if missed:
                        found.add(
                            "poll-skip",
                            f"{event.process} went from {_where(key, last)} to {offset}, over {missed[:10]}",
                        )
                position[event.process] = offset

    def _check_replicas(self, key: Key, polled: dict[int, bytes], found: _Found) -> None:
        committed = dict(polled)
        for send in self._sends[key]:
            if send.outcome is Outcome.OK and send.offset is not None:
                committed.setdefault(send.offset, send.value)
        partition_hw = max((replica.high_watermark for replica in self._replicas[key]), default=0)
        for replica in self._replicas[key]:
            bound = partition_hw if replica.in_isr else replica.high_watermark
            missing = [o for o in sorted(committed) if o < bound and o not in replica.records]
            if missing:
                found.add(
                    "lost-on-node",
                    f"{replica.node} lacks {len(missing)} committed offset(s) of {key[0]}/{key[1]} below the HW "
                    f"{bound}, from {missing[0]}",
                )
