"""The linearizability checker: hand-built histories for each violation, simulated concurrent logs that must pass,
mutations of them that must fail, the offset-by-offset check cross-checked against the general search, and a
3000-operation history checked in well under a couple of seconds. No processes."""

from __future__ import annotations

import dataclasses
import heapq
import random
import time
from collections.abc import Hashable
from typing import Literal

import pytest

from tidelog.testing.linearizability import (
    Append,
    Indeterminate,
    LinearizabilityError,
    LogHistory,
    Ok,
    Read,
    ReadResult,
    Result,
    WrongOffset,
)

Method = Literal["auto", "offsets", "search"]
BOTH: tuple[Method, ...] = ("offsets", "search")


@dataclasses.dataclass(frozen=True)
class Rec:
    """One operation as a test builds or simulates it; ``completed is None``: the client never heard back."""

    client: str
    op: Append | Read
    invoked: float
    completed: float | None = None
    result: Result | None = None


def build(recs: list[Rec], final: list[Hashable] | None, *, initial_end: int = 0) -> LogHistory:
    history = LogHistory(initial_end=initial_end)
    for rec in recs:
        op_id = history.invoke(rec.client, rec.op, at=rec.invoked)
        if rec.completed is not None and rec.result is not None:
            history.complete(op_id, rec.result, at=rec.completed)
    if final is not None:
        history.final_log(final)
    return history


def kinds(history: LogHistory, method: Method = "auto") -> list[str]:
    report = history.check(method)
    return [v.kind for v in report.violations]


def ok(offset: int, value: bytes, t0: float, t1: float, client: str = "c") -> Rec:
    return Rec(client, Append(offset, value), t0, t1, Ok(offset))


def refused(offset: int, value: bytes, t0: float, t1: float, end: int | None = None) -> Rec:
    return Rec("f", Append(offset, value), t0, t1, WrongOffset(end))


def read(values: tuple[Hashable, ...], t0: float, t1: float) -> Rec:
    return Rec("r", Read(), t0, t1, ReadResult(values))


# ---- hand-built histories ----


def test_a_sequential_history_passes_with_a_witness_in_order() -> None:
    recs = [ok(0, b"a", 0, 1), refused(0, b"x", 2, 3, end=1), ok(1, b"b", 4, 5), read((b"a", b"b"), 6, 7)]
    for method in BOTH:
        report = build(recs, [b"a", b"b"]).check(method)
        assert report.ok, str(report)
        assert report.witness == (0, 1, 2, 3)
        report.raise_if_failed()
        assert str(report).startswith("linearizable")


def test_two_successes_at_one_offset_are_reported() -> None:
    history = build([ok(0, b"a", 0, 1, "c1"), ok(0, b"b", 2, 3, "c2")], [b"a"])
    report = history.check()
    assert [v.kind for v in report.violations] == ["duplicate-success", "lost-success"]
    message = report.violations[0].message
    assert "expected offset 0" in message and "op 0 by c1" in message and "op 1 by c2" in message
    with pytest.raises(LinearizabilityError, match="duplicate-success"):
        report.raise_if_failed()


def test_a_success_must_land_exactly_at_its_expected_offset() -> None:
    recs = [Rec("c", Append(0, b"a"), 0, 1, Ok(1))]
    assert kinds(build(recs, [b"a"])) == ["misplaced-success"]
    assert kinds(build([ok(0, b"a", 0, 1)], [])) == ["lost-success"]
    assert kinds(build([ok(0, b"a", 0, 1)], [b"z"])) == ["unexplained-value", "lost-success"]


def test_final_values_must_come_from_one_applied_append_at_its_offset() -> None:
    assert kinds(build([refused(0, b"a", 0, 1)], [b"a"])) == ["refused-value-visible"]
    indeterminate = Rec("c", Append(1, b"a"), 0, 1, Indeterminate("timeout"))
    assert kinds(build([indeterminate], [b"a"])) == ["misplaced-value"]
    twice = build([ok(0, b"a", 0, 1)], [b"a", b"a"])
    assert "duplicate-value" in kinds(twice)


def test_indeterminate_appends_may_land_late_or_never() -> None:
    never = Rec("c", Append(0, b"a"), 0, None, None)
    late = Rec("c", Append(0, b"b"), 1, 2, Indeterminate("leader killed"))
    recs = [never, late, read((), 3, 4), ok(1, b"c", 10, 11)]
    for method in BOTH:
        assert build(recs, [b"b", b"c"]).check(method).ok


def test_a_refusal_inside_the_epoch_it_expected_is_wrong() -> None:
    recs = [ok(0, b"a", 0, 1, "c1"), refused(1, b"x", 2, 3), ok(1, b"b", 4, 5, "c2")]
    report = build(recs, [b"a", b"b"]).check()
    assert [v.kind for v in report.violations] == ["wrong-failure"]
    message = report.violations[0].message
    assert message.startswith("op 1 by f [append(1, b'x') → wrong offset, t=2..3] was refused")
    assert "op 0 by c1" in message and "before it began" in message
    assert "op 2 by c2" in message and "invoked after it ended" in message
    # Overlapping the append at offset 1 (or 0) the refusal is explained: it saw the log end before or after.
    for window in ((2, 4.5), (0.5, 3)):
        shifted = [recs[0], refused(1, b"x", *window), recs[2]]
        assert build(shifted, [b"a", b"b"]).check().ok


def test_a_refusal_must_report_an_end_the_log_had_in_its_window() -> None:
    base = [ok(0, b"a", 0, 1), ok(1, b"b", 2, 3)]
    assert build([*base, refused(5, b"x", 4, 5, end=2)], [b"a", b"b"]).check().ok
    assert kinds(build([*base, refused(5, b"x", 4, 5, end=1)], [b"a", b"b"])) == ["wrong-failure"]
    assert kinds(build([*base, refused(5, b"x", 4, 5, end=7)], [b"a", b"b"])) == ["wrong-failure"]
    assert kinds(build([*base, refused(2, b"x", 4, 5, end=2)], [b"a", b"b"])) == ["wrong-failure"]
    assert kinds(build([refused(5, b"x", -2, -1, end=1), *base], [b"a", b"b"])) == ["wrong-failure"]


def test_reads_must_return_what_the_log_held_in_their_window() -> None:
    base = [ok(0, b"a", 0, 1)]
    assert build([*base, read((b"a",), 2, 3)], [b"a"]).check().ok
    assert kinds(build([*base, read((), 2, 3)], [b"a"])) == ["stale-read"]
    assert kinds(build([*base, read((b"z",), 2, 3)], [b"a"])) == ["stale-read"]
    assert kinds(build([read((b"a",), -2, -1), *base], [b"a"])) == ["stale-read"]


def test_an_append_acknowledged_before_the_one_below_it_was_invoked_is_out_of_order() -> None:
    recs = [Rec("c1", Append(0, b"a"), 5, 6, Indeterminate()), ok(1, b"b", 1, 2, "c2")]
    report = build(recs, [b"a", b"b"]).check()
    assert [v.kind for v in report.violations] == ["out-of-order"]
    assert "op 1 by c2" in report.violations[0].message and "op 0 by c1" in report.violations[0].message


def test_constraints_that_hold_alone_but_not_together_are_not_linearizable() -> None:
    """Two appends concurrent with everything; reads pin the first before t=3.9 and the second after t=5.5, so
    the refusal (t=4..5, expecting offset 1) saw the log end at 1 throughout — no single bound shows it."""
    recs = [
        ok(0, b"a", 0, 10),
        ok(1, b"b", 0, 10),
        read((b"a",), 2, 3.9),
        read((b"a",), 5.5, 7),
        refused(1, b"x", 4, 5),
    ]
    for method in BOTH:
        report = build(recs, [b"a", b"b"]).check(method)
        assert [v.kind for v in report.violations] == ["not-linearizable"], str(report)
    assert "offset 1" in build(recs, [b"a", b"b"]).check().violations[0].message
    recs[4] = refused(1, b"x", 3, 5)  # now it may have run before the first append
    assert build(recs, [b"a", b"b"]).check().ok
    stale = [ok(0, b"a", 0, 10), ok(1, b"b", 0, 10), read((b"a", b"b"), 4, 4.5), read((), 5.5, 6)]
    assert kinds(build(stale, [b"a", b"b"])) == ["not-linearizable"]


def test_a_history_may_start_on_a_log_that_already_has_records() -> None:
    recs = [ok(10, b"a", 0, 1), refused(10, b"x", 2, 3, end=11), read((b"a",), 4, 5), refused(3, b"y", 0, 5)]
    for method in BOTH:
        assert build(recs, [b"a"], initial_end=10).check(method).ok
    assert kinds(build(recs, [b"a"], initial_end=11)) == ["misplaced-value", "lost-success"]


def test_without_a_final_log_the_search_decides() -> None:
    good = [ok(0, b"a", 0, 1), read((b"a",), 2, 3)]
    report = build(good, None).check()
    assert report.ok and report.method == "search" and report.stats["search_states"] >= 2
    bad = [ok(0, b"a", 0, 1), read((b"a",), 2, 3), read((), 4, 5)]
    report = build(bad, None).check()
    assert [v.kind for v in report.violations] == ["not-linearizable"]
    assert "op 2 by r" in report.violations[0].message
    with pytest.raises(ValueError, match="final_log"):
        build(good, None).check("offsets")


def test_the_search_reports_inconclusive_when_out_of_budget() -> None:
    recs, final = simulate(3, clients=4, ops=30)
    report = build(recs, final).check("search", budget=3)
    assert [v.kind for v in report.violations] == ["inconclusive"]


def test_recording_rejects_what_would_make_the_history_ambiguous() -> None:
    history = LogHistory()
    a = history.invoke("c", Append(0, b"a"))
    with pytest.raises(ValueError, match="unique"):
        history.invoke("c", Append(1, b"a"))
    r = history.invoke("c", Read())
    with pytest.raises(ValueError, match="cannot complete"):
        history.complete(r, Ok(0))
    history.complete(a, Ok(0))
    with pytest.raises(ValueError, match="already complete"):
        history.complete(a, Ok(0))
    with pytest.raises(ValueError, match="without gaps"):
        history.final_log({0: b"a", 2: b"b"})
    history.final_log({0: b"a"})
    assert history.check().ok


def test_times_come_from_the_injected_clock_or_an_event_counter() -> None:
    now = [100.0]
    history = LogHistory(clock=lambda: now[0])
    a = history.invoke("c", Append(0, b"a"))
    now[0] = 101.5
    history.complete(a, Ok(0))
    history.final_log([])
    assert "t=100..101.5" in history.check().violations[0].message
    counted = LogHistory()
    a, b = counted.invoke("c1", Append(0, b"a")), counted.invoke("c2", Append(0, b"b"))
    counted.complete(a, Ok(0))
    counted.complete(b, Ok(0))
    counted.final_log([b"a"])
    assert "t=0..2" in counted.check().violations[0].message


# ---- a simulated concurrent log ----


def simulate(
    seed: int, *, clients: int = 8, ops: int = 200, p_lost: float = 0.08, p_no_end: float = 0.3, p_read: float = 0.1
) -> tuple[list[Rec], list[Hashable]]:
    """Clients doing expected-offset appends and reads against one log. Each request takes effect atomically at
    a random instant of its window; a lost request (a killed leader) takes effect or not, and its client hears a
    timeout or nothing. Clients expect the end they last learned, sometimes off by a little."""
    rng = random.Random(seed)
    log: list[Hashable] = []
    recs: dict[int, Rec] = {}
    known = [0] * clients
    # (time, tie-break, event, client, key of the operation, lost?, answer on its way)
    queue: list[tuple[float, int, str, int, int, bool, Result | None]] = []
    seq = 0

    def push(
        at: float, what: str, client: int, key: int = -1, lost: bool = False, answer: Result | None = None
    ) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(queue, (at, seq, what, client, key, lost, answer))

    for c in range(clients):
        push(rng.random(), "invoke", c)
    while queue:
        now, seq_key, what, c, rec_key, lost, answer = heapq.heappop(queue)
        if what == "invoke":
            if len(recs) >= ops:
                continue
            op: Append | Read = Read()
            if rng.random() >= p_read:
                expected = known[c] if rng.random() < 0.7 else max(0, known[c] + rng.randint(-2, 2))
                op = Append(expected, f"c{c}-{len(recs)}".encode())
            recs[seq_key] = Rec(f"c{c}", op, now)
            lost = rng.random() < p_lost
            if not lost or rng.random() < 0.5:
                push(now + rng.uniform(0, 1), "apply", c, seq_key, lost)
            else:
                push(now + rng.uniform(0, 2), "respond", c, seq_key)
        elif what == "apply":
            rec = recs[rec_key]
            result: Result | None
            if isinstance(rec.op, Read):
                result = ReadResult(tuple(log))
            elif len(log) == rec.op.expected_offset:
                log.append(rec.op.value)
                result = Ok(rec.op.expected_offset)
            else:
                result = WrongOffset(None if rng.random() < p_no_end else len(log))
            push(now + rng.uniform(0, 1), "respond", c, rec_key, answer=None if lost else result)
        else:
            rec, result = recs[rec_key], answer
            if result is None and isinstance(rec.op, Append) and rng.random() < 0.5:
                result = Indeterminate("timeout")
            if result is not None:
                recs[rec_key] = dataclasses.replace(rec, completed=now, result=result)
            if isinstance(result, Ok):
                known[c] = result.offset + 1
            elif isinstance(result, WrongOffset):
                known[c] = result.actual_end if result.actual_end is not None else len(log)
            elif isinstance(result, ReadResult):
                known[c] = len(result.values)
            push(now + rng.uniform(0, 0.3), "invoke", c)
    return list(recs.values()), log


def test_simulated_histories_are_linearizable() -> None:
    for seed in range(30):
        recs, final = simulate(seed)
        report = build(recs, final).check()
        assert report.ok, f"seed {seed}: {report}"
        assert report.stats["ok"] == len(final) - sum(
            1 for r in recs if isinstance(r.op, Append) and r.op.value in final and not isinstance(r.result, Ok)
        )
        assert report.stats["failed"] > 0 and report.stats["indeterminate"] > 0


def test_small_simulated_histories_pass_both_methods_with_a_witness() -> None:
    for seed in range(40):
        recs, final = simulate(seed, clients=4, ops=25)
        for method in BOTH:
            report = build(recs, final).check(method)
            assert report.ok and report.witness is not None, f"seed {seed} {method}: {report}"


def chain_of(recs: list[Rec], final: list[Hashable]) -> list[int]:
    index = {r.op.value: i for i, r in enumerate(recs) if isinstance(r.op, Append)}
    return [index[v] for v in final]


def mutations(
    recs: list[Rec], final: list[Hashable], rng: random.Random
) -> list[tuple[str, list[Rec], list[Hashable]]]:
    """Changes that each make the history certainly not linearizable (where the run offers the material)."""
    out: list[tuple[str, list[Rec], list[Hashable]]] = []
    chain = chain_of(recs, final)
    refusals = [i for i, r in enumerate(recs) if isinstance(r.result, WrongOffset)]
    oks = [k for k, i in enumerate(chain) if isinstance(recs[i].result, Ok)]
    if refusals:  # a refused append claimed to have succeeded: two successes, or one not in the final log
        i = rng.choice(refusals)
        op = recs[i].op
        assert isinstance(op, Append)
        out.append(
            (
                "refusal-acked",
                [*recs[:i], dataclasses.replace(recs[i], result=Ok(op.expected_offset)), *recs[i + 1 :]],
                final,
            )
        )
        out.append(("refused-visible", recs, [*final[:-1], op.value] if final else [op.value]))
    if len(final) >= 2:
        k = rng.randrange(len(final) - 1)
        out.append(("swapped", recs, [*final[:k], final[k + 1], final[k], *final[k + 2 :]]))
    if oks:
        k = max(oks)
        out.append(("truncated", recs, final[:k]))
        k = rng.choice(oks)
        done = recs[chain[k]].completed
        assert done is not None
        out.append(("stale-read", [*recs, read(tuple(final[:k]), done + 1e-6, done + 2e-6)], final))
        if k >= 1:
            below = recs[chain[k - 1]].invoked
            moved = dataclasses.replace(recs[chain[k]], invoked=below - 2, completed=below - 1)
            out.append(("time-travel", [*recs[: chain[k]], moved, *recs[chain[k] + 1 :]], final))
    for k in range(1, len(chain)):  # a gap between offset k-1 acknowledged and offset k invoked
        before, after = recs[chain[k - 1]], recs[chain[k]]
        if isinstance(before.result, Ok) and before.completed is not None and before.completed < after.invoked:
            mid = (before.completed + after.invoked) / 2
            out.append(("refused-in-epoch", [*recs, refused(k, b"x", mid, mid)], final))
            break
    return out


def test_mutated_histories_are_not_linearizable() -> None:
    rng = random.Random(7)
    seen: set[str] = set()
    for seed in range(30):
        recs, final = simulate(seed, clients=8, ops=150)
        for name, mutated, mutated_final in mutations(recs, final, rng):
            seen.add(name)
            report = build(mutated, mutated_final).check()
            assert not report.ok, f"seed {seed}: mutation {name} passed"
            if len(mutated) <= 60:
                assert not build(mutated, mutated_final).check("search").ok
    assert seen == {
        "refusal-acked",
        "refused-visible",
        "swapped",
        "truncated",
        "stale-read",
        "time-travel",
        "refused-in-epoch",
    }


def test_small_mutations_fail_both_methods() -> None:
    rng = random.Random(11)
    for seed in range(30):
        recs, final = simulate(seed, clients=3, ops=15)
        for name, mutated, mutated_final in mutations(recs, final, rng):
            for method in BOTH:
                report = build(mutated, mutated_final).check(method)
                assert not report.ok, f"seed {seed}: mutation {name} passed {method}"


def jitter(recs: list[Rec], rng: random.Random) -> list[Rec]:
    """Move some windows and answers at random: histories near the edge, linearizable or not."""
    out: list[Rec] = []
    for rec in recs:
        if rec.completed is not None and rng.random() < 0.4:
            a, b = rec.invoked + rng.uniform(-1.5, 1.5), rec.completed + rng.uniform(-1.5, 1.5)
            rec = dataclasses.replace(rec, invoked=min(a, b), completed=max(a, b))
        if isinstance(rec.result, WrongOffset) and rng.random() < 0.2:
            rec = dataclasses.replace(rec, result=WrongOffset(rng.choice([None, 0, 1, 2, 3])))
        out.append(rec)
    return out


def test_the_offset_check_agrees_with_the_general_search() -> None:
    """The decomposition is exact: on thousands of perturbed small histories both methods give one verdict."""
    rng = random.Random(5)
    verdicts = {True: 0, False: 0}
    for seed in range(1500):
        recs, final = simulate(seed, clients=3, ops=rng.randint(4, 12), p_lost=0.2, p_read=0.2)
        recs = jitter(recs, rng)
        by_offsets = build(recs, final).check("offsets")
        by_search = build(recs, final).check("search")
        assert by_offsets.ok == by_search.ok, f"seed {seed}:\n{by_offsets}\n{by_search}\n{recs}\n{final}"
        verdicts[by_offsets.ok] += 1
    assert min(verdicts.values()) > 200, verdicts  # both verdicts well exercised


def test_three_thousand_operations_from_eight_clients_check_quickly() -> None:
    recs, final = simulate(1, clients=8, ops=3000)
    history = build(recs, final)
    started = time.perf_counter()
    report = history.check()
    elapsed = time.perf_counter() - started
    assert report.ok, str(report)
    assert report.witness is None  # too long to be useful
    assert elapsed < 2.0, f"{elapsed:.2f}s"
    mutated = [*recs, refused(0, b"x", -2, -1, end=len(final))]  # an end from the future
    assert kinds(build(mutated, final)) == ["wrong-failure"]
