"""The offset-by-offset linearizability check, used by :meth:`LogHistory.check` when the final log is known.

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

The operations, the sequential specification and the violation kinds are in :mod:`tidelog.testing.linearizability`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable
from dataclasses import dataclass, field

from tidelog.testing.history import Violation
from tidelog.testing.linearizability import (
    _MAX_EXAMPLES,
    Append,
    ReadResult,
    WrongOffset,
    _describe,
    _Outcome,
    _Record,
    _t,
)

# ---- offset by offset: the chain of instants at which the final log's appends took effect ----

Interval = tuple[float, float]  # closed; a point interval is one possible instant


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
