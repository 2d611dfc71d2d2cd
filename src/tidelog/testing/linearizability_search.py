"""The general linearizability search, used by :meth:`LogHistory.check` when no final log is known.

Without a final log the offset-by-offset decomposition of :mod:`tidelog.testing.linearizability_chain` does not
apply (which indeterminate appends landed is unknown), and the checker falls back to the general Wing–Gong–Lowe
search: depth-first over "linearize one minimal operation next", memoized on (set of linearized operations, log
state), where the log state is the log's length plus a hash chained over its values. That search is exponential in
the worst case and is meant for small histories; its state budget makes it report "inconclusive" rather than run
for ever. ``check(method="search")`` runs it even when a final log is known (treated as one last read), which the
tests use to cross-check the two methods.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from tidelog.testing.history import Violation
from tidelog.testing.linearizability import Append, Ok, ReadResult, WrongOffset, _describe, _Outcome, _Record

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
