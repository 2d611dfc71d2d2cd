"""The group assignor: every partition assigned exactly once to a member consuming its stream, loads balanced
within one when members consume the same streams, and as few partitions moved as a membership change needs."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.groups.assignment import Assignment, assign

STREAMS = ["a", "b", "c"]


def owners(assignment: Assignment) -> dict[tuple[str, int], str]:
    found: dict[tuple[str, int], str] = {}
    for member, streams in assignment.items():
        for stream, ids in streams.items():
            for p in ids:
                assert (stream, p) not in found, f"{stream}/{p} assigned twice"
                found[(stream, p)] = member
    return found


def loads(assignment: Assignment) -> list[int]:
    return [sum(len(ids) for ids in streams.values()) for streams in assignment.values()]


members_st = st.lists(st.text("mnopqrstuvwxyz", min_size=1, max_size=3), min_size=1, max_size=8, unique=True)
counts_st = st.fixed_dictionaries({s: st.integers(0, 12) for s in STREAMS})


@given(
    st.dictionaries(
        st.text("mnopqrstuvwxyz", min_size=1, max_size=3),
        st.sets(st.sampled_from(STREAMS), min_size=1),
        min_size=1,
        max_size=8,
    ),
    counts_st,
)
def test_every_partition_of_a_consumed_stream_goes_to_exactly_one_eligible_member(
    subscriptions: Mapping[str, set[str]], counts: Mapping[str, int]
) -> None:
    result = assign(subscriptions, counts)
    found = owners(result)
    wanted = {(s, p) for subs in subscriptions.values() for s in subs for p in range(counts[s])}
    assert set(found) == wanted
    for (stream, _), member in found.items():
        assert stream in subscriptions[member]
    assert set(result) == set(subscriptions)


@given(members_st, st.sets(st.sampled_from(STREAMS), min_size=1), counts_st)
def test_members_of_the_same_streams_are_balanced_within_one(
    members: list[str], streams: set[str], counts: Mapping[str, int]
) -> None:
    result = assign({m: streams for m in members}, counts)
    assert max(loads(result)) - min(loads(result)) <= 1


@given(members_st, st.integers(0, 40), st.data())
def test_a_leaving_member_moves_only_its_own_partitions(members: list[str], count: int, data: st.DataObject) -> None:
    before = assign({m: {"a"} for m in members}, {"a": count})
    leaver = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != leaver]
    after = assign({m: {"a"} for m in rest}, {"a": count}, before)
    old, new = owners(before), owners(after)
    for key, member in old.items():
        if member != leaver:
            assert new.get(key) == member, f"{key} moved from {member} to {new.get(key)}"
    if rest:
        assert max(loads(after)) - min(loads(after)) <= 1


@given(members_st, st.integers(0, 40))
def test_a_joining_member_takes_partitions_only_from_members_above_the_new_average(
    members: list[str], count: int
) -> None:
    before = assign({m: {"a"} for m in members}, {"a": count})
    after = assign({m: {"a"} for m in [*members, "newcomer"]}, {"a": count}, before)
    moved = {key for key, member in owners(after).items() if owners(before)[key] != member}
    assert all(owners(after)[key] == "newcomer" for key in moved), "partitions only move to the newcomer"
    assert len(moved) == count // (len(members) + 1)
    assert max(loads(after)) - min(loads(after)) <= 1


def test_the_same_inputs_give_the_same_assignment() -> None:
    subscriptions = {"x": ["a", "b"], "y": ["b"], "z": ["a", "b", "c"]}
    counts = {"a": 5, "b": 7, "c": 3}
    assert assign(subscriptions, counts) == assign(dict(reversed(subscriptions.items())), counts)


def test_partitions_of_a_deleted_stream_are_dropped() -> None:
    before = assign({"x": ["a", "b"]}, {"a": 2, "b": 2})
    after = assign({"x": ["a", "b"]}, {"a": 2}, before)
    assert after == {"x": {"a": [0, 1]}}


@given(
    st.dictionaries(
        st.text("mnopqrstuvwxyz", min_size=1, max_size=3),
        st.sets(st.sampled_from(STREAMS), min_size=1),
        min_size=1,
        max_size=8,
    ),
    counts_st,
)
def test_no_single_move_would_even_out_members_of_different_streams(
    subscriptions: Mapping[str, set[str]], counts: Mapping[str, int]
) -> None:
    result = assign(subscriptions, counts)
    load = dict(zip(result, loads(result), strict=True))
    for (stream, _), member in owners(result).items():
        for other, streams in subscriptions.items():
            assert not (stream in streams and load[other] <= load[member] - 2), (
                f"{member} holds {load[member]}, {other} only {load[other]} and could take a {stream} partition"
            )
