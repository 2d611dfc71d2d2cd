"""A checker for the consumer group fault scenario: what members consumed and committed, and what the group's
committed offsets were seen to be, checked against the guarantees of ``docs/durability.md`` ("Consumer groups and
committed offsets").

The scenario records, for one stream and one group:

- every record the producers were told is stored (acks ALL), by partition and offset (:meth:`GroupHistory.acked`);
- each run of each member process (:meth:`GroupHistory.member_run`): the events it wrote
  (:mod:`tidelog.testing.group_member`), in order: partitions assigned and revoked, records handed out, commits
  acknowledged. A run SIGKILLed simply ends;
- the group's committed offsets, read over and over while everything ran, in the order they were read
  (:meth:`GroupHistory.sample`), and read once more at the end (:meth:`GroupHistory.final`).

:meth:`GroupHistory.check` then reports each broken guarantee as a :class:`~tidelog.testing.history.Violation`:

- **offset went back**: a committed offset read lower than one read before it (only an explicit reset may
  lower it, and the scenario makes none);
- **not consumed**: an acknowledged record below the final committed offset that no member consumed (at least
  once: every committed record was processed);
- **wrong value**: a member consumed, at an acknowledged offset, another value than the one acknowledged there;
- **duplicates over the bound**: in a partition, more records were consumed again than its members had consumed
  without a commit acknowledging them. A *session* is one run's holding of one partition, from ``assigned`` to
  ``revoked`` or the run's end; what a session consumed but did not get committed is the distance from its last
  acknowledged commit (or, without one, its first record) to one past the last record it consumed. Consumers
  that resume from the last acknowledged commit read again at most those records, so the deliveries beyond the
  first of each offset cannot be more than their sum. A consumer that resumed from an older offset than one
  already acknowledged, or a fenced member whose commit set the offset back, would exceed it.

The checker is pure logic, unit-tested without processes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tidelog.testing.history import Violation

__all__ = ["GroupCheckReport", "GroupHistory", "Session"]

_EXAMPLES = 5


@dataclass
class Session:
    """One run's holding of one partition: the offsets it consumed, in order, and its acknowledged commits."""

    run: str
    partition: int
    consumed: list[int] = field(default_factory=list)
    commits: list[int] = field(default_factory=list)

    @property
    def uncommitted(self) -> int:
        """Records consumed here that no commit acknowledged here covers (see the module docstring)."""
        if not self.consumed:
            return 0
        covered = max(self.commits, default=self.consumed[0])
        return max(0, max(self.consumed) + 1 - covered)


@dataclass(frozen=True)
class GroupCheckReport:
    """What :meth:`GroupHistory.check` found; ``stats`` are counts worth printing."""

    violations: tuple[Violation, ...]
    notes: tuple[str, ...]
    stats: Mapping[str, int]

    @property
    def ok(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        head = "OK" if self.ok else f"{len(self.violations)} violation(s)"
        lines = [head + ": " + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items()))]
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class GroupHistory:
    """Everything one group fault run recorded (see the module docstring)."""

    def __init__(self) -> None:
        self._acked: dict[int, dict[int, bytes]] = defaultdict(dict)
        self._sessions: list[Session] = []
        self._values: dict[int, list[tuple[str, int, str]]] = defaultdict(list)  # p -> (run, offset, value)
        self._samples: list[tuple[int, int]] = []
        self._final: dict[int, int] = {}
        self.runs = 0

    # ---- recording ----

    def acked(self, partition: int, offset: int, value: bytes) -> None:
        self._acked[partition][offset] = value

    def member_run(self, run: str, events: Iterable[Mapping[str, Any]]) -> None:
        """The events of one run of a member process, in the order it wrote them."""
        self.runs += 1
        current: dict[int, Session] = {}

        def session(p: int) -> Session:
            found = current.get(p)
            if found is None:
                found = current[p] = Session(run, p)
                self._sessions.append(found)
            return found

        for event in events:
            kind = event.get("ev")
            if kind == "assigned":
                for p in event["p"]:
                    current.pop(p, None)
                    session(p)
            elif kind == "revoked":
                for p in event["p"]:
                    current.pop(p, None)
            elif kind == "rec":
                p, offset = int(event["p"]), int(event["o"])
                session(p).consumed.append(offset)
                self._values[p].append((run, offset, str(event.get("v", ""))))
            elif kind == "commit":
                session(int(event["p"])).commits.append(int(event["o"]))

    def sample(self, partition: int, offset: int) -> None:
        """The group's committed offset of ``partition`` as read now (-1: none yet); call in reading order."""
        self._samples.append((partition, offset))

    def final(self, partition: int, offset: int) -> None:
        self.sample(partition, offset)
        self._final[partition] = offset

    # ---- checking ----

    def check(self) -> GroupCheckReport:
        violations: list[Violation] = []
        notes: list[str] = []
        partitions = sorted({*self._acked, *self._final, *(s.partition for s in self._sessions)})
        violations += self._check_regressions()
        consumed_total = duplicates_total = 0
        for p in partitions:
            counts = Counter(o for s in self._sessions if s.partition == p for o in s.consumed)
            consumed_total += sum(counts.values())
            duplicates = sum(n - 1 for n in counts.values())
            duplicates_total += duplicates
            bound = sum(s.uncommitted for s in self._sessions if s.partition == p)
            if duplicates > bound:
                violations.append(
                    Violation(
                        "duplicates over the bound",
                        f"partition {p}: {duplicates} record(s) consumed again, but its members had consumed only "
                        f"{bound} without an acknowledged commit",
                    )
                )
            if duplicates:
                notes.append(f"partition {p}: {duplicates} duplicate deliveries (bound {bound})")
            violations += self._check_consumed(p, counts)
            violations += self._check_values(p)
        stats = {
            "acked": sum(len(v) for v in self._acked.values()),
            "consumed": consumed_total,
            "duplicates": duplicates_total,
            "sessions": len(self._sessions),
            "member_runs": self.runs,
            "samples": len(self._samples),
        }
        return GroupCheckReport(tuple(violations), tuple(notes), stats)

    def _check_regressions(self) -> list[Violation]:
        highest: dict[int, int] = {}
        found: list[str] = []
        for i, (p, offset) in enumerate(self._samples):
            if offset < highest.get(p, -1):
                found.append(f"partition {p}: {highest[p]} then {offset} (read #{i})")
            highest[p] = max(highest.get(p, -1), offset)
        if not found:
            return []
        shown = "; ".join(found[:_EXAMPLES]) + (f"; and {len(found) - _EXAMPLES} more" if len(found) > 5 else "")
        return [Violation("offset went back", f"committed offsets read lower than before: {shown}")]

    def _check_consumed(self, p: int, counts: Mapping[int, int]) -> list[Violation]:
        final = self._final.get(p, -1)
        missing = sorted(o for o in self._acked.get(p, {}) if o < final and o not in counts)
        if not missing:
            return []
        shown = ", ".join(map(str, missing[:_EXAMPLES])) + (" ..." if len(missing) > _EXAMPLES else "")
        return [
            Violation(
                "not consumed",
                f"partition {p}: {len(missing)} acknowledged record(s) below the committed offset {final} were "
                f"consumed by no member: offsets {shown}",
            )
        ]

    def _check_values(self, p: int) -> list[Violation]:
        acked = self._acked.get(p, {})
        wrong = [
            (run, offset, value)
            for run, offset, value in self._values.get(p, [])
            if offset in acked and acked[offset].decode(errors="replace") != value
        ]
        if not wrong:
            return []
        shown = "; ".join(f"{run} read {v!r} at {o}, acked {acked[o]!r}" for run, o, v in wrong[:_EXAMPLES])
        return [Violation("wrong value", f"partition {p}: {len(wrong)} record(s) differ from the acked ones: {shown}")]
