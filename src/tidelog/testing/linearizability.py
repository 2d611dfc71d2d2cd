"""A linearizability checker for expected-offset appends on one partition (issue 5, "Tests").

A test records what concurrent clients did to one partition — ``append(expected_offset, value)`` and whole-log
reads, each with the time it was invoked and the time its answer came back — and, at rest, the partition's final
content. :meth:`LogHistory.check` decides whether some sequential run of a log with compare-and-append explains
every answer, and otherwise says in sentences which operations cannot all be right:

- **duplicate-success**: two appends were acknowledged at one expected offset;
- **misplaced-success**: an append was acknowledged at an offset other than the one it expected;
- **lost-success**: an acknowledged append's value is not at its offset in the final log;
- **unexplained-value** / **refused-value-visible** / **misplaced-value** / **duplicate-value**: a final value
  that no append wrote, that a failed append wrote, that sits at an offset its append did not expect, or that
  sits at two offsets;
- **wrong-failure**: an append failed with "wrong offset" although the log end was its expected offset during its
  whole window (or the actual end it was told was not the log end at any point of its window);
- **stale-read**: a read returned content that the log did not hold at any point of its window;
- **out-of-order**: an append completed before the append holding the offset below it was even invoked;
- **not-linearizable**: no order exists, for a reason that takes several operations to state.

The sequential specification: the log is a sequence of values, initially ``initial_end`` records of no interest.
``append(e, v)`` applies iff the log end equals ``e`` (→ ``Ok(e)``), else changes nothing
(→ ``WrongOffset(end)``). An :class:`Indeterminate` append (timeout, lost connection, killed leader) may take
effect at any point after it was invoked, or never. A ``Read`` returns the values after ``initial_end``.

**How it is checked.** This module is the API: the operations and their results, the recording
(:class:`LogHistory`), the report, the checks that need no ordering, and the choice of method. The two methods
live beside it. With a final log, :mod:`tidelog.testing.linearizability_chain` checks offset by offset — exact,
its cost growing with the number of operations rather than the concurrency, its witness replayed against the
specification before it is reported. Without one, :mod:`tidelog.testing.linearizability_search` runs the general
Wing–Gong–Lowe search, exponential in the worst case and bounded by a state budget (→ "inconclusive").
``check(method="search")`` runs the search even when a final log is known, which the tests use to cross-check the
two methods.

Real-time order is strict: an operation precedes another only if it completed strictly before the other was
invoked. Times come from an injected clock, an explicit ``at=``, or (by default) a counter of recorded events,
which is exact for asyncio tasks that record synchronously before sending and after receiving.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tidelog.testing.history import Violation

__all__ = [
    "Append",
    "Indeterminate",
    "LinearizabilityError",
    "LinearizabilityReport",
    "LogHistory",
    "Ok",
    "Operation",
    "Read",
    "ReadResult",
    "Result",
    "Violation",
    "WrongOffset",
]

_MAX_EXAMPLES = 5
_MAX_VIOLATIONS = 20
_WITNESS_LIMIT = 200  # a witness of thousands of operations helps nobody; small histories get one


# ---- operations and results ----


@dataclass(frozen=True, slots=True)
class Append:
    """Append ``value`` iff the log end is ``expected_offset``. ``value`` must be unique within the history."""

    expected_offset: int
    value: Hashable


@dataclass(frozen=True, slots=True)
class Read:
    """Read every value after the history's ``initial_end``."""


@dataclass(frozen=True, slots=True)
class Ok:
    """The append landed; ``offset`` is where the broker says it did (it must be the expected offset)."""

    offset: int


@dataclass(frozen=True, slots=True)
class WrongOffset:
    """The append was refused, nothing written. ``actual_end`` is the end the broker reported, if it did."""

    actual_end: int | None = None


@dataclass(frozen=True, slots=True)
class Indeterminate:
    """Timeout, lost connection, leader killed: the append may or may not have landed (now or later)."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What a :class:`Read` returned: the values after ``initial_end``, in offset order."""

    values: tuple[Hashable, ...]


Operation = Append | Read
Result = Ok | WrongOffset | Indeterminate | ReadResult


@dataclass(slots=True)
class _Record:
    id: int
    client: str
    op: Operation
    invoked: float
    completed: float = math.inf  # inf until complete(); an indeterminate append is treated as open-ended anyway
    result: Result | None = None  # None: never completed, which for an append is indeterminate

    @property
    def applied_by(self) -> float:
        """The latest instant this append can take effect: its completion if acknowledged, else never bounded."""
        return self.completed if isinstance(self.result, Ok) else math.inf


# ---- the report ----


class LinearizabilityError(AssertionError):
    """Raised by :meth:`LinearizabilityReport.raise_if_failed`; an ``AssertionError`` so pytest shows a failure."""

    def __init__(self, report: LinearizabilityReport) -> None:
        self.report = report
        super().__init__(str(report))


@dataclass(frozen=True, slots=True)
class LinearizabilityReport:
    """What :meth:`LogHistory.check` found. ``witness`` lists operation ids in a valid linearization order
    (appends that never took effect are left out), for histories of at most 200 operations that passed."""

    violations: tuple[Violation, ...]
    method: str
    witness: tuple[int, ...] | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise LinearizabilityError(self)

    def __str__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.stats.items())
        head = "linearizable" if self.ok else f"not linearizable: {len(self.violations)} violation(s)"
        lines = [f"{head} (checked by {self.method}; {counts})"]
        lines += [f"  {v}" for v in self.violations]
        return "\n".join(lines)


@dataclass(slots=True)
class _Outcome:
    """What a method (offset by offset, or the search) hands back to :meth:`LogHistory.check`."""

    violations: list[Violation]
    witness: list[int] | None
    states: int = 0


# ---- recording ----


class LogHistory:
    """Operations on one partition, recorded from any number of client tasks, and the final log at rest."""

    def __init__(self, *, initial_end: int = 0, clock: Callable[[], float] | None = None) -> None:
        self.initial_end = initial_end
        self._clock = clock
        self._ticks = itertools.count()
        self._records: list[_Record] = []
        self._values: set[Hashable] = set()
        self._final: list[Hashable] | None = None

    def _now(self, at: float | None) -> float:
        if at is not None:
            return float(at)
        return self._clock() if self._clock is not None else float(next(self._ticks))

    def invoke(self, client: str, op: Operation, *, at: float | None = None) -> int:
        """Record that ``client`` sent ``op``; returns the id to complete it with. Call before sending."""
        if isinstance(op, Append):
            if op.value in self._values:
                raise ValueError(f"value {_show(op.value)} is appended twice; values must be unique per append")
            self._values.add(op.value)
        self._records.append(_Record(len(self._records), client, op, self._now(at)))
        return len(self._records) - 1

    def complete(self, op_id: int, result: Result, *, at: float | None = None) -> None:
        """Record the answer to ``op_id``; call after receiving it. Never completing an append is the same as
        completing it with :class:`Indeterminate`; a read never completed is ignored."""
        record = self._records[op_id]
        if record.result is not None:
            raise ValueError(f"op {op_id} is already complete")
        if isinstance(record.op, Read) != isinstance(result, ReadResult):
            raise ValueError(f"op {op_id} is {record.op} and cannot complete with {result}")
        if isinstance(result, ReadResult):
            result = ReadResult(tuple(result.values))
        record.completed = self._now(at)
        if record.completed < record.invoked:
            raise ValueError(f"op {op_id} completes at {record.completed}, before it was invoked")
        record.result = result

    def final_log(self, values: Sequence[Hashable] | Mapping[int, Hashable]) -> None:
        """The partition's content after ``initial_end``, read at rest: a sequence, or offsets → values."""
        if isinstance(values, Mapping):
            expected = range(self.initial_end, self.initial_end + len(values))
            if sorted(values) != list(expected):
                raise ValueError(f"the final log must cover offsets {self.initial_end}.. without gaps")
            self._final = [values[o] for o in expected]
        else:
            self._final = list(values)

    # ---- checking ----

    def check(
        self, method: Literal["auto", "offsets", "search"] = "auto", *, budget: int = 2_000_000
    ) -> LinearizabilityReport:
        """Every violation found. ``auto`` checks offset by offset when a final log was recorded and searches
        otherwise; ``budget`` bounds the states the search may visit."""
        if method == "auto":
            method = "offsets" if self._final is not None else "search"
        if method == "offsets" and self._final is None:
            raise ValueError("the offset-by-offset check needs final_log(); use method='search' without one")
        records = self._records
        stats = {
            "appends": sum(isinstance(r.op, Append) for r in records),
            "ok": sum(isinstance(r.result, Ok) for r in records),
            "failed": sum(isinstance(r.result, WrongOffset) for r in records),
            "indeterminate": sum(
                isinstance(r.op, Append) and not isinstance(r.result, Ok | WrongOffset) for r in records
            ),
            "reads": sum(isinstance(r.result, ReadResult) for r in records),
        }
        violations = self._check_successes() + self._check_final()
        witness: list[int] | None = None
        if not violations:
            # Imported here: both methods build on the operations and sentences defined in this module.
            from tidelog.testing.linearizability_chain import _check_chain
            from tidelog.testing.linearizability_search import _search

            if method == "offsets":
                assert self._final is not None
                outcome = _check_chain(records, self._final, self.initial_end)
            else:
                outcome = _search(records, self._final, self.initial_end, budget)
                stats["search_states"] = outcome.states
            violations, witness = outcome.violations, outcome.witness
        if len(violations) > _MAX_VIOLATIONS:  # a badly broken run: the first few say enough
            hidden = len(violations) - _MAX_VIOLATIONS
            violations = [*violations[:_MAX_VIOLATIONS], Violation("more", f"{hidden} more violation(s) not shown")]
        return LinearizabilityReport(
            tuple(violations),
            method,
            tuple(witness) if witness is not None and len(records) <= _WITNESS_LIMIT else None,
            stats,
        )

    def _check_successes(self) -> list[Violation]:
        found: list[Violation] = []
        by_offset: dict[int, list[_Record]] = defaultdict(list)
        for r in self._records:
            if isinstance(r.op, Append) and isinstance(r.result, Ok):
                by_offset[r.op.expected_offset].append(r)
                if r.result.offset != r.op.expected_offset:
                    found.append(
                        Violation(
                            "misplaced-success",
                            f"{_describe(r)} was acknowledged at offset {r.result.offset}, not at its expected offset",
                        )
                    )
        for offset, oks in sorted(by_offset.items()):
            if len(oks) > 1:
                found.append(
                    Violation(
                        "duplicate-success",
                        f"{len(oks)} appends succeeded at expected offset "
                        f"{offset}: " + "; ".join(_describe(r) for r in oks[:_MAX_EXAMPLES]),
                    )
                )
        return found

    def _check_final(self) -> list[Violation]:
        if self._final is None:
            return []
        found: list[Violation] = []
        appends = {r.op.value: r for r in self._records if isinstance(r.op, Append)}
        first_at: dict[Hashable, int] = {}
        for offset, value in enumerate(self._final, start=self.initial_end):
            r = appends.get(value)
            if value in first_at:
                found.append(
                    Violation(
                        "duplicate-value",
                        f"the final log holds {_show(value)} at offsets {first_at[value]} and {offset}",
                    )
                )
            first_at.setdefault(value, offset)
            if r is None:
                found.append(
                    Violation(
                        "unexplained-value",
                        f"the final log holds {_show(value)} at offset {offset}, which no recorded append wrote",
                    )
                )
            elif isinstance(r.result, WrongOffset):
                found.append(
                    Violation(
                        "refused-value-visible",
                        f"the final log holds {_show(value)} at offset "
                        f"{offset}, written by {_describe(r)}, which was refused",
                    )
                )
            elif isinstance(r.op, Append) and r.op.expected_offset != offset:
                found.append(
                    Violation(
                        "misplaced-value",
                        f"the final log holds {_show(value)} at offset "
                        f"{offset}, but {_describe(r)} expected offset {r.op.expected_offset}",
                    )
                )
        for r in appends.values():
            if isinstance(r.result, Ok) and isinstance(r.op, Append):
                index = r.op.expected_offset - self.initial_end
                there = self._final[index] if 0 <= index < len(self._final) else None
                if there != r.op.value:
                    found.append(
                        Violation(
                            "lost-success",
                            f"{_describe(r)} succeeded, but the final log holds "
                            f"{_show(there)} at offset {r.op.expected_offset}",
                        )
                    )
        return found


# ---- sentences ----


def _describe(r: _Record) -> str:
    """``op 7 by c2 [append(5, b'v12') → ok, t=10..14]``: enough to find the operation in a test's log."""
    what = f"append({r.op.expected_offset}, {_show(r.op.value)})" if isinstance(r.op, Append) else "read()"
    res = r.result
    if isinstance(res, Ok):
        outcome = "ok"
    elif isinstance(res, WrongOffset):
        outcome = "wrong offset" + (f", end {res.actual_end}" if res.actual_end is not None else "")
    elif isinstance(res, ReadResult):
        outcome = f"{len(res.values)} value(s)"
    else:
        outcome = "indeterminate"
    until = _t(r.completed) if res is not None else ""
    return f"op {r.id} by {r.client} [{what} → {outcome}, t={_t(r.invoked)}..{until}]"


def _t(x: float) -> str:
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return str(int(x)) if x == int(x) else f"{x:.6g}"


def _show(value: object) -> str:
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
