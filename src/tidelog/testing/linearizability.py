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

**How it is checked, and why offset by offset is sound.** Values are unique per append, and an append only lands
at the offset it names, so the final log fixes *which* appends took effect and in *what order*: the one holding
offset ``k`` is the ``k``-th to apply. The only freedom left in a linearization is the instant ``p_k`` at which
each of those appends takes effect; failed appends and reads change nothing, so they commute with each other and
only need an instant inside their window at which the log end (the "epoch", ``p_(k-1)`` to ``p_k``) is what they
observed. Every such constraint involves at most two neighbouring instants, ``p_(k-1)`` and ``p_k``: the
constraint graph is a chain. So the check runs offset by offset, carrying from offset ``k-1`` to ``k`` only the
set of instants at which ``p_(k-1)`` can lie (a union of intervals); it is exact — the history is linearizable iff
no set becomes empty — and its cost grows with the number of operations, not with the concurrency (3000
operations take milliseconds). A witness order is read back from the sets and replayed against the
specification before it is reported, so a flaw in this reasoning would surface as an error, not a false pass.

Without a final log this decomposition does not apply (which indeterminate appends landed is unknown), and the
checker falls back to the general Wing–Gong–Lowe search: depth-first over "linearize one minimal operation next",
memoized on (set of linearized operations, log state), where the log state is the log's length plus a hash
chained over its values. That search is exponential in the worst case and is meant for small histories; its
state budget makes it report "inconclusive" rather than run for ever. ``check(method="search")`` runs it even when
a final log is known (treated as one last read), which the tests use to cross-check the two methods.

Real-time order is strict: an operation precedes another only if it completed strictly before the other was
invoked. Times come from an injected clock, an explicit ``at=``, or (by default) a counter of recorded events,
which is exact for asyncio tasks that record synchronously before sending and after receiving.
"""

from __future__ import annotations

import bisect
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


# ---- offset by offset: the chain of instants at which the final log's appends took effect ----

Interval = tuple[float, float]  # closed; a point interval is one possible instant


@dataclass(slots=True)
class _Outcome:
    violations: list[Violation]
    witness: list[int] | None
    states: int = 0


@dataclass(slots=True)
class _Chain:
    """The appends of the final log in offset order (``appends[k]`` took effect ``k``-th), the bounds on each one's
    instant ``p_k``, and per epoch ``k`` (log end ``initial_end + k``, from ``p_(k-1)`` to ``p_k``) the windows of
    refused appends that must see some other epoch: ``p_(k-1) >= start or p_k <= end``."""

    appends: list[_Record]
    lo: list[float]
    hi: list[float]
    avoid: list[list[tuple[float, float, _Record]]]
    placed: list[tuple[_Record, int, bool]] = field(default_factory=list)  # (op, epoch, exact) for the witness


def _check_chain(records: list[_Record], final: list[Hashable], initial_end: int) -> _Outcome:
    """Exact check given the final log (see the module docstring): bounds first, each broken one a sentence of
    its own; then the sets of possible instants, carried from offset to offset."""
    by_value = {r.op.value: r for r in records if isinstance(r.op, Append)}
    appends = [by_value[v] for v in final]
    n = len(appends)
    chain = _Chain(appends, [r.invoked for r in appends], [r.applied_by for r in appends], [[] for _ in range(n)])
    found = _check_order(chain, initial_end)
    for r in records:
        if isinstance(r.op, Append) and isinstance(r.result, WrongOffset):
            if r.result.actual_end is None:
                found += _constrain_refusal(chain, r, r.op.expected_offset - initial_end, initial_end)
            elif r.result.actual_end == r.op.expected_offset:
                found.append(
                    Violation(
                        "wrong-failure",
                        f"{_describe(r)} was refused, reporting as the log end the very offset it expected",
                    )
                )
            else:
                found += _constrain_end(chain, r, r.result.actual_end - initial_end, initial_end, "wrong-failure")
        elif isinstance(r.result, ReadResult):
            values = r.result.values
            if list(values) != final[: len(values)]:
                diff = next((i for i, (a, b) in enumerate(zip(values, final, strict=False)) if a != b), len(final))
                found.append(
                    Violation(
                        "stale-read",
                        f"{_describe(r)} returned content that is not a prefix of the "
                        f"final log (first difference at offset {initial_end + diff})",
                    )
                )
            else:
                found += _constrain_end(chain, r, len(values), initial_end, "stale-read")
    if found:
        return _Outcome(found, None)
    solved = _solve(chain)
    if isinstance(solved, int):
        return _Outcome([_unsolvable(chain, solved, initial_end)], None)
    witness = _witness(chain, solved)
    problem = _replay(witness, records, final, initial_end)
    if problem is not None:
        raise RuntimeError(f"linearizability checker bug: its own witness does not replay: {problem}")
    return _Outcome([], [r.id for _, _, r in witness])


def _check_order(chain: _Chain, initial_end: int) -> list[Violation]:
    """An append acknowledged before the append below it was invoked: no instants can be in offset order."""
    found: list[Violation] = []
    latest: _Record | None = None
    for k, r in enumerate(chain.appends):
        if latest is not None and latest.invoked > r.applied_by:
            found.append(
                Violation(
                    "out-of-order",
                    f"{_describe(r)} holds offset {initial_end + k} but was "
                    f"acknowledged before {_describe(latest)}, which holds an offset below it, "
                    "was invoked",
                )
            )
        if latest is None or r.invoked > latest.invoked:
            latest = r
    return found


def _constrain_refusal(chain: _Chain, r: _Record, j: int, initial_end: int) -> list[Violation]:
    """A refusal without a reported end only needs the log end to differ from ``initial_end + j`` once."""
    n, start, end = len(chain.appends), r.invoked, r.completed
    if not 0 <= j <= n:  # the log end was never that offset
        chain.placed.append((r, j, False))
        return []
    settled_before = j == 0 or chain.appends[j - 1].applied_by < start
    empty_after = j == n or chain.appends[j].invoked > end
    if settled_before and empty_after:
        below = (
            f"the log held {initial_end} records from the start"
            if j == 0
            else (f"offset {initial_end + j - 1} was written by {_describe(chain.appends[j - 1])} before it began")
        )
        above = (
            f"offset {initial_end + j} is empty in the final log"
            if j == n
            else (f"offset {initial_end + j} was written by {_describe(chain.appends[j])}, invoked after it ended")
        )
        return [
            Violation(
                "wrong-failure",
                f"{_describe(r)} was refused, but the log end was its expected offset throughout: {below}, and {above}",
            )
        ]
    if j == 0:
        chain.hi[0] = min(chain.hi[0], end)
    elif j == n:
        chain.lo[n - 1] = max(chain.lo[n - 1], start)
    else:
        chain.avoid[j].append((start, end, r))
    chain.placed.append((r, j, False))
    return []


def _constrain_end(chain: _Chain, r: _Record, j: int, initial_end: int, kind: str) -> list[Violation]:
    """An observed log end ``initial_end + j`` (reported by a refusal or implied by a read) must be the log end
    at some instant of the window: ``p_(j-1) <= end`` and ``p_j >= start``."""
    n, start, end = len(chain.appends), r.invoked, r.completed
    seen = initial_end + j
    if not 0 <= j <= n:
        return [
            Violation(
                kind,
                f"{_describe(r)} saw the log end at {seen}, but the log only ever ended between "
                f"{initial_end} and {initial_end + n}",
            )
        ]
    found: list[Violation] = []
    if j >= 1 and chain.appends[j - 1].invoked > end:
        found.append(
            Violation(
                kind,
                f"{_describe(r)} saw the log end at {seen}, but offset {seen - 1} was "
                f"written by {_describe(chain.appends[j - 1])}, invoked only after it ended",
            )
        )
    if j < n and chain.appends[j].applied_by < start:
        found.append(
            Violation(
                kind,
                f"{_describe(r)} saw the log end at {seen}, but offset {seen} was already "
                f"written by {_describe(chain.appends[j])}, acknowledged before it began",
            )
        )
    if j >= 1:
        chain.hi[j - 1] = min(chain.hi[j - 1], end)
    if j < n:
        chain.lo[j] = max(chain.lo[j], start)
    chain.placed.append((r, j, True))
    return found


def _solve(chain: _Chain) -> list[float] | int:
    """Instants ``p_0 <= p_1 <= ...`` meeting every bound and every refusal, or the first index with none left.

    ``sets[k]`` holds every instant ``p_k`` can take with a consistent choice for ``p_0 .. p_(k-1)``. Given
    ``p_k = y``, the best ``p_(k-1)`` is the latest possible one not after ``y`` (refusals only ever want it
    later), so ``y`` is possible unless some refusal of epoch ``k`` ended before ``y`` but began after that
    latest instant: each refusal removes the open interval ``(its end, first y whose latest p_(k-1) reaches its
    start)``.
    """
    sets: list[list[Interval]] = []
    for k in range(len(chain.appends)):
        lo, hi = chain.lo[k], chain.hi[k]
        if k == 0:
            current = [(lo, hi)] if lo <= hi else []
        else:
            previous = sets[-1]
            lo = max(lo, previous[0][0])
            bad = [(end, _first_reaching(previous, start)) for start, end, _ in chain.avoid[k]]
            current = _subtract_open(lo, hi, sorted(b for b in bad if b[0] < b[1]))
        if not current:
            return k
        sets.append(current)
    if not sets:
        return []
    instants = [sets[-1][0][0]]
    for k in range(len(sets) - 1, 0, -1):
        instants.append(_latest_not_after(sets[k - 1], instants[-1]))
    return instants[::-1]


def _first_reaching(intervals: list[Interval], x: float) -> float:
    """The least ``y`` such that ``intervals`` hold a point in ``[x, y]``."""
    starts = [a for a, _ in intervals]
    i = max(bisect.bisect_right(starts, x) - 1, 0)
    for a, b in intervals[i:]:
        if x <= b:
            return max(a, x)
    return math.inf


def _latest_not_after(intervals: list[Interval], y: float) -> float:
    i = bisect.bisect_right([a for a, _ in intervals], y) - 1
    return min(intervals[i][1], y)


def _subtract_open(lo: float, hi: float, bad: list[Interval]) -> list[Interval]:
    """``[lo, hi]`` minus the open intervals ``bad`` (sorted by start), as closed intervals."""
    pieces: list[Interval] = []
    cursor = lo
    for a, b in bad:
        if cursor > hi:
            break
        if a >= cursor:
            pieces.append((cursor, min(a, hi)))
        cursor = max(cursor, b)
    if cursor <= hi and not math.isinf(cursor):
        pieces.append((cursor, hi))
    return pieces


def _unsolvable(chain: _Chain, k: int, initial_end: int) -> Violation:
    """Each bound held on its own; together they leave no instant for the append at offset ``k``."""
    involved = chain.appends[max(k - 1, 0) : k + 1] + [r for _, _, r in chain.avoid[k]]
    involved += [r for r, j, exact in chain.placed if exact and j in (k, k + 1)]
    shown = "; ".join(_describe(r) for r in involved[:_MAX_EXAMPLES])
    more = f" and {len(involved) - _MAX_EXAMPLES} more" if len(involved) > _MAX_EXAMPLES else ""
    return Violation(
        "not-linearizable",
        f"no order explains the log up to offset {initial_end + k}: the append "
        f"there cannot take effect at any instant consistent with the appends below it and with what "
        f"these operations observed: {shown}{more}",
    )


def _witness(chain: _Chain, instants: list[float]) -> list[tuple[float, int, _Record]]:
    """Every operation at an instant of its window, sorted; ties put epoch-``j`` observers (rank ``2j``) between
    the appends that open (``2j - 1``) and close (``2j + 1``) that epoch."""
    keyed = [(p, 2 * k + 1, r) for k, (p, r) in enumerate(zip(instants, chain.appends, strict=True))]
    n = len(instants)
    for r, j, exact in chain.placed:
        start, end = r.invoked, r.completed
        if exact:
            keyed.append((max(start, instants[j - 1]) if j >= 1 else start, 2 * j, r))
        elif not 0 <= j <= n or (j >= 1 and instants[j - 1] >= start):
            keyed.append((start, 2 * bisect.bisect_left(instants, start), r))
        else:
            keyed.append((end, 2 * bisect.bisect_right(instants, end), r))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return keyed


def _replay(
    order: list[tuple[float, int, _Record]], records: list[_Record], final: list[Hashable], initial_end: int
) -> str | None:
    """Run ``order`` against the sequential specification; a description of the first mismatch, or ``None``."""
    log: list[Hashable] = []
    for at, _, r in order:
        end = initial_end + len(log)
        latest = r.applied_by if isinstance(r.op, Append) and not isinstance(r.result, WrongOffset) else r.completed
        if not r.invoked <= at <= latest:
            return f"{_describe(r)} placed at t={_t(at)}, outside its window"
        if isinstance(r.op, Append) and isinstance(r.result, WrongOffset):
            if end == r.op.expected_offset or r.result.actual_end not in (None, end):
                return f"{_describe(r)} placed at log end {end}"
        elif isinstance(r.op, Append):
            if end != r.op.expected_offset:
                return f"{_describe(r)} applied at log end {end}"
            log.append(r.op.value)
        elif isinstance(r.result, ReadResult) and list(r.result.values) != log:
            return f"{_describe(r)} placed where the log holds {len(log)} values"
    return None if log == final else "the witness does not produce the final log"


# ---- the general search (Wing & Gong, with Lowe's memoization) ----

_APPLY, _REFUSE, _READ = 0, 1, 2
_ABSENT = object()


def _search(records: list[_Record], final: list[Hashable] | None, initial_end: int, budget: int) -> _Outcome:
    """Depth-first: linearize the first pending call whose effect matches the state, restart from the oldest
    entry; on reaching the return of an operation not yet linearized, undo the last choice. Calls and returns sit
    in a doubly linked list in time order, from which a linearized operation is lifted (and restored on undo).
    Indeterminate appends have no return, so they never force a backtrack: left in the list, they never happened.
    A final log is one last read, and an append may only land where the final log holds its value."""
    ops = [r for r in records if isinstance(r.op, Append) or isinstance(r.result, ReadResult)]
    spec: list[tuple[int, int, object, int | None]] = []  # (kind, offset or length, value or hash, actual end)
    for r in ops:
        if isinstance(r.op, Append):
            refused = isinstance(r.result, WrongOffset)
            actual = r.result.actual_end if isinstance(r.result, WrongOffset) else None
            spec.append((_REFUSE if refused else _APPLY, r.op.expected_offset, r.op.value, actual))
        else:
            assert isinstance(r.result, ReadResult)
            spec.append((_READ, initial_end + len(r.result.values), _chain_hash(r.result.values), None))
    events = [(r.invoked, 0, i) for i, r in enumerate(ops)]
    events += [(r.completed, 1, i) for i, r in enumerate(ops) if isinstance(r.result, Ok | WrongOffset | ReadResult)]
    if final is not None:
        spec.append((_READ, initial_end + len(final), _chain_hash(final), None))
        events += [(math.inf, 0, len(ops)), (math.inf, 1, len(ops))]
    events.sort()
    size = len(events)
    head, tail = 0, size + 1
    nxt, prv = [*range(1, size + 2), tail], [head, *range(size + 1)]
    entry_op = [-1] + [op for _, _, op in events] + [-1]
    entry_ret = [False] + [ret == 1 for _, ret, _ in events] + [False]
    call_at, ret_at = [0] * len(spec), [-1] * len(spec)
    for e in range(1, size + 1):
        (ret_at if entry_ret[e] else call_at)[entry_op[e]] = e

    def step(i: int, length: int, h: int) -> tuple[int, int] | None:
        kind, offset, value, actual = spec[i]
        if kind == _APPLY:
            index = length - initial_end
            landing = final[index] if final is not None and 0 <= index < len(final) else _ABSENT
            if length == offset and (final is None or landing == value):
                return length + 1, hash((h, value))
        elif kind == _REFUSE:
            if length != offset and actual in (None, length):
                return length, h
        elif (length, h) == (offset, value):
            return length, h
        return None

    def unlink(e: int) -> None:
        nxt[prv[e]], prv[nxt[e]] = nxt[e], prv[e]

    def relink(e: int) -> None:
        nxt[prv[e]] = prv[nxt[e]] = e

    seen: set[tuple[int, int, int]] = set()
    stack: list[tuple[int, int, int]] = []  # (op, length before, hash before)
    linearized, length, h = 0, initial_end, 0
    deepest, blocker = 0, -1
    entry = nxt[head]
    while entry != tail:
        i = entry_op[entry]
        if not entry_ret[entry]:
            after = step(i, length, h)
            if after is not None and (linearized | 1 << i, *after) not in seen:
                seen.add((linearized | 1 << i, *after))
                if len(seen) > budget:
                    return _Outcome(
                        [
                            Violation(
                                "inconclusive",
                                f"the search gave up after {budget} states; "
                                "record the final log so the offset-by-offset check applies",
                            )
                        ],
                        None,
                        len(seen),
                    )
                stack.append((i, length, h))
                linearized, (length, h) = linearized | 1 << i, after
                unlink(call_at[i])
                if ret_at[i] >= 0:
                    unlink(ret_at[i])
                entry = nxt[head]
                continue
            entry = nxt[entry]
            continue
        if len(stack) >= deepest:
            deepest, blocker = len(stack), i
        if not stack:
            return _Outcome([_stuck(ops, blocker, deepest, len(seen))], None, len(seen))
        i, length, h = stack.pop()
        linearized &= ~(1 << i)
        if ret_at[i] >= 0:
            relink(ret_at[i])
        relink(call_at[i])
        entry = nxt[call_at[i]]
    return _Outcome([], [ops[i].id for i, _, _ in stack if i < len(ops)], len(seen))


def _stuck(ops: list[_Record], blocker: int, deepest: int, states: int) -> Violation:
    what = _describe(ops[blocker]) if blocker < len(ops) else "the final log"
    return Violation(
        "not-linearizable",
        f"no order explains the history: the longest consistent order places "
        f"{deepest} operation(s), after which {what} can never be placed (search visited {states} "
        "states)",
    )


def _chain_hash(values: Sequence[Hashable]) -> int:
    """The log-state hash of ``values``, chained as :func:`_search` extends it append by append."""
    h = 0
    for v in values:
        h = hash((h, v))
    return h
