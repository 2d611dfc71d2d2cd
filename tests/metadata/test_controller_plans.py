"""The controller's pure plans: worked cases for each rule, then Hypothesis properties over random clusters."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.metadata.controller_plans import (
    AlterIsrError,
    AlterIsrRejection,
    AlterIsrRequest,
    ChangeReason,
    PartitionChange,
    decide_alter_isr,
    failover,
    plan_balance,
    plan_controlled_shutdown,
    plan_failover,
)
from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamConfig, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot


def part(replicas: str, leader: str, isr: str, epoch: int = 0, *, stream: str = "s", pid: int = 0) -> PartitionRecord:
    """A partition written compactly: ``part("abc", "a", "ab", 3)``."""
    return PartitionRecord(stream, pid, tuple(replicas), leader, tuple(isr), epoch)


def snap(live: str, *parts: PartitionRecord, unclean: dict[str, bool | None] | None = None) -> MetadataSnapshot:
    streams = {
        p.stream: StreamRecord(
            p.stream,
            p.stream,
            "",
            1,
            len(p.replicas),
            0,
            StreamConfig(unclean_leader_election=(unclean or {}).get(p.stream)),
        )
        for p in parts
    }
    return MetadataSnapshot(
        1,
        streams,
        {(p.stream, p.id): p for p in parts},
        {b: BrokerRecord(b, "127.0.0.1", 1, 2, 0) for b in live},
    )


def new_of(changes: Iterable[PartitionChange]) -> list[PartitionRecord]:
    return [c.new for c in changes]


# ---- failover ----


def test_a_dead_leader_is_replaced_by_the_first_live_isr_replica() -> None:
    change = failover(part("abc", "a", "abc", 4), {"b", "c"}, set(), False)
    assert change == PartitionChange(part("abc", "a", "abc", 4), part("abc", "b", "bc", 5), ChangeReason.FAILOVER)


def test_failover_follows_replica_order_and_keeps_isr_order() -> None:
    change = failover(part("cab", "c", "bac", 1), {"a", "b"}, set(), False)
    assert change is not None and change.new == part("cab", "a", "ba", 2)


def test_failover_skips_brokers_that_are_shutting_down() -> None:
    change = failover(part("abc", "a", "abc"), {"b", "c"}, {"b"}, False)
    assert change is not None and change.new == part("abc", "c", "bc", 1)


def test_failover_never_elects_outside_the_isr_by_default() -> None:
    change = failover(part("abc", "a", "a", 2), {"b", "c"}, set(), False)
    assert change == PartitionChange(part("abc", "a", "a", 2), part("abc", "", "a", 3), ChangeReason.OFFLINE)
    # Staying offline changes nothing, not even the epoch.
    assert failover(part("abc", "", "a", 3), {"b", "c"}, set(), False) is None


def test_an_offline_partition_elects_the_isr_member_that_comes_back() -> None:
    change = failover(part("abc", "", "ab", 3), {"b", "c"}, set(), False)
    assert change == PartitionChange(part("abc", "", "ab", 3), part("abc", "b", "b", 4), ChangeReason.FAILOVER)


def test_unclean_election_takes_the_first_live_replica_with_an_isr_of_itself() -> None:
    change = failover(part("abc", "a", "a", 2), {"c", "b"}, set(), True)
    assert change == PartitionChange(part("abc", "a", "a", 2), part("abc", "b", "b", 3), ChangeReason.UNCLEAN)
    assert failover(part("abc", "", "a", 3), {"c"}, {"b"}, True) == PartitionChange(
        part("abc", "", "a", 3), part("abc", "c", "c", 4), ChangeReason.UNCLEAN
    )


def test_a_live_isr_member_shutting_down_prevents_unclean_election() -> None:
    change = failover(part("abc", "a", "ab", 2), {"b", "c"}, {"b"}, True)
    assert change is not None and change.reason is ChangeReason.OFFLINE and change.new == part("abc", "", "ab", 3)


def test_with_nobody_alive_the_partition_goes_offline_even_with_unclean_election() -> None:
    change = failover(part("ab", "a", "ab", 0), set(), set(), True)
    assert change is not None and change.new == part("ab", "", "ab", 1)


def test_dead_followers_leave_the_isr_without_an_epoch_bump() -> None:
    change = failover(part("abc", "a", "abc", 7), {"a", "b"}, set(), False)
    assert change == PartitionChange(part("abc", "a", "abc", 7), part("abc", "a", "ab", 7), ChangeReason.SHRINK_ISR)


def test_a_healthy_partition_or_a_live_leader_shutting_down_is_left_alone() -> None:
    assert failover(part("abc", "a", "abc"), {"a", "b", "c"}, set(), False) is None
    assert failover(part("abc", "a", "ab"), {"a", "b", "c"}, {"a"}, False) is None


def test_stream_config_overrides_the_unclean_default() -> None:
    parts = [part("ab", "a", "a", stream=name) for name in ("on", "off", "default")]
    snapshot = snap("b", *parts, unclean={"on": True, "off": False, "default": None})
    by_stream = {c.new.stream: c.reason for c in plan_failover(snapshot, unclean_default=False)}
    assert by_stream == {"on": ChangeReason.UNCLEAN, "off": ChangeReason.OFFLINE, "default": ChangeReason.OFFLINE}
    by_stream = {c.new.stream: c.reason for c in plan_failover(snapshot, unclean_default=True)}
    assert by_stream == {"on": ChangeReason.UNCLEAN, "off": ChangeReason.OFFLINE, "default": ChangeReason.UNCLEAN}


def test_plan_failover_lists_leader_changes_before_isr_shrinks() -> None:
    snapshot = snap("bc", part("abc", "b", "abc", pid=0), part("abc", "a", "abc", pid=1), part("bc", "b", "bc", pid=2))
    changes = plan_failover(snapshot)
    assert [(c.new.id, c.reason) for c in changes] == [(1, ChangeReason.FAILOVER), (0, ChangeReason.SHRINK_ISR)]


# ---- balance ----


def test_balance_moves_leadership_to_the_preferred_replica_only_where_it_can() -> None:
    moves = part("abc", "b", "abc", 3, pid=0)
    snapshot = snap(
        "abcd",
        moves,
        part("abc", "a", "abc", pid=1),  # already preferred
        part("abc", "b", "bc", pid=2),  # preferred not in the ISR: still catching up
        part("dbc", "b", "dbc", pid=3),  # preferred shutting down
        part("ebc", "b", "ebc", pid=4),  # preferred dead
        part("abc", "e", "aec", pid=5),  # leader dead: failover's business
        part("abc", "", "a", pid=6),  # offline: failover's business
    )
    changes = plan_balance(snapshot, {"d"})
    assert changes == [PartitionChange(moves, part("abc", "a", "abc", 4), ChangeReason.PREFERRED)]


# ---- controlled shutdown ----


def test_controlled_shutdown_hands_off_leadership_and_leaves_isrs() -> None:
    snapshot = snap(
        "abcd",
        part("abc", "a", "abc", 2, pid=0),  # led: moves to b
        part("bac", "b", "bac", pid=1),  # followed in the ISR: leaves it
        part("a", "a", "a", pid=2),  # replication factor 1: still led
        part("acd", "a", "ac", pid=3),  # c shutting down too, d out of the ISR: still led
        part("cab", "c", "c", pid=4),  # followed outside the ISR: untouched
        part("ab", "", "ab", pid=5),  # offline: untouched (a may be the one it waits for)
        part("dba", "d", "db", pid=6),  # not a replica's business
    )
    plan = plan_controlled_shutdown(snapshot, "a", {"c"})
    assert plan.still_leading == 2
    assert [(c.new, c.reason) for c in plan.changes] == [
        (part("abc", "b", "bc", 3, pid=0), ChangeReason.SHUTDOWN_MOVE),
        (part("bac", "b", "bc", pid=1), ChangeReason.SHUTDOWN_LEAVE),
    ]


def test_controlled_shutdown_does_not_hand_off_to_a_dead_isr_member() -> None:
    plan = plan_controlled_shutdown(snap("ac", part("abc", "a", "abc")), "a")
    assert plan.changes[0].new == part("abc", "c", "bc", 1)
    assert plan_controlled_shutdown(snap("a", part("ab", "a", "ab")), "a").still_leading == 1


# ---- AlterIsr ----


def alter(
    record: PartitionRecord | None, leader: str, epoch: int, isr: str, live: str = "abcd", down: str = ""
) -> PartitionRecord:
    return decide_alter_isr(record, AlterIsrRequest("s", 0, leader, epoch, tuple(isr)), set(live), set(down))


def rejection(
    record: PartitionRecord | None, leader: str, epoch: int, isr: str, live: str = "abcd", down: str = ""
) -> AlterIsrError:
    with pytest.raises(AlterIsrError) as caught:
        alter(record, leader, epoch, isr, live, down)
    return caught.value


def test_alter_isr_sets_the_isr_in_replica_order_without_an_epoch_bump() -> None:
    assert alter(part("abc", "b", "b", 3), "b", 3, "cb") == part("abc", "b", "bc", 3)
    assert alter(part("abc", "b", "abc", 3), "b", 3, "b") == part("abc", "b", "b", 3)


@pytest.mark.parametrize(
    ("record", "leader", "epoch", "isr", "live", "down", "reason", "retriable"),
    [
        (None, "a", 0, "a", "abc", "", AlterIsrRejection.UNKNOWN_PARTITION, False),
        (part("abc", "b", "ab", 4), "a", 3, "a", "abc", "", AlterIsrRejection.STALE_EPOCH, False),
        (part("abc", "a", "ab", 4), "a", 5, "a", "abc", "", AlterIsrRejection.NEWER_EPOCH, True),
        (part("abc", "a", "ab", 4), "b", 4, "b", "abc", "", AlterIsrRejection.NOT_LEADER, False),
        (part("abc", "", "ab", 4), "a", 4, "a", "abc", "", AlterIsrRejection.NOT_LEADER, False),
        (part("abc", "a", "ab", 4), "a", 4, "", "abc", "", AlterIsrRejection.INVALID_ISR, False),
        (part("abc", "a", "ab", 4), "a", 4, "ad", "abcd", "", AlterIsrRejection.INVALID_ISR, False),
        (part("abc", "a", "ab", 4), "a", 4, "bc", "abc", "", AlterIsrRejection.INVALID_ISR, False),
        (part("abc", "a", "ab", 4), "a", 4, "b", "ac", "", AlterIsrRejection.INVALID_ISR, False),
        (part("abc", "a", "ab", 4), "a", 4, "b", "abc", "b", AlterIsrRejection.INVALID_ISR, False),
        (part("abc", "a", "ab", 4), "a", 4, "abc", "ab", "", AlterIsrRejection.INVALID_ISR, False),
        (part("abc", "a", "ab", 4), "a", 4, "abc", "abc", "c", AlterIsrRejection.INVALID_ISR, False),
    ],
    ids=[
        "unknown",
        "stale",
        "newer",
        "not-leader",
        "offline",
        "empty",
        "stranger",
        "step-down-adds",
        "step-down-to-dead",
        "step-down-to-leaving",
        "adds-dead",
        "adds-leaving",
    ],
)
def test_alter_isr_rejections(
    record: PartitionRecord | None,
    leader: str,
    epoch: int,
    isr: str,
    live: str,
    down: str,
    reason: AlterIsrRejection,
    retriable: bool,
) -> None:
    error = rejection(record, leader, epoch, isr, live, down)
    assert error.reason is reason and error.retriable is retriable and error.current == record
    assert reason.value in str(error)


def test_a_leader_steps_down_to_a_live_in_sync_replica_one_epoch_later() -> None:
    assert alter(part("abc", "a", "abc", 4), "a", 4, "cb") == part("abc", "b", "bc", 5)
    assert alter(part("abc", "a", "abc", 4), "a", 4, "cb", live="ac") == part("abc", "c", "bc", 5)


def test_alter_isr_may_keep_a_dead_member_it_does_not_add() -> None:
    assert alter(part("abc", "a", "abc", 1), "a", 1, "ac", live="ab") == part("abc", "a", "ac", 1)


# ---- properties ----

BROKERS = "abcde"


@st.composite
def partitions(draw: st.DrawFn, pid: int) -> PartitionRecord:
    replicas = draw(st.lists(st.sampled_from(BROKERS), min_size=1, max_size=4, unique=True))
    isr = draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    leader = draw(st.sampled_from(["", *isr]))
    stream = draw(st.sampled_from(["s", "t"]))
    return PartitionRecord(stream, pid, tuple(replicas), leader, tuple(isr), draw(st.integers(0, 5)))


@st.composite
def clusters(draw: st.DrawFn) -> tuple[MetadataSnapshot, frozenset[str], bool]:
    count = draw(st.integers(0, 8))
    parts = [draw(partitions(pid)) for pid in range(count)]
    live = "".join(draw(st.sets(st.sampled_from(BROKERS))))
    unclean = {s: draw(st.sampled_from([None, True, False])) for s in "st"}
    down = frozenset(draw(st.sets(st.sampled_from(BROKERS))))
    return snap(live, *parts, unclean=unclean), down, draw(st.booleans())


def check_record(change: PartitionChange) -> None:
    old, new = change.old, change.new
    assert (new.stream, new.id, new.replicas) == (old.stream, old.id, old.replicas)
    assert new != old
    assert new.isr, "an ISR is never emptied"
    assert set(new.isr) <= set(new.replicas)
    if new.leader:
        assert new.leader in new.isr
    assert new.leader_epoch == old.leader_epoch + (new.leader != old.leader)


def apply(snapshot: MetadataSnapshot, changes: Iterable[PartitionChange]) -> MetadataSnapshot:
    parts = dict(snapshot.partitions)
    for change in changes:
        assert parts[(change.old.stream, change.old.id)] == change.old
        parts[(change.new.stream, change.new.id)] = change.new
    return MetadataSnapshot(snapshot.revision + 1, snapshot.streams, parts, snapshot.brokers)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_failover_keeps_the_invariants_and_reaches_a_fixpoint(
    cluster: tuple[MetadataSnapshot, frozenset[str], bool],
) -> None:
    snapshot, down, unclean = cluster
    live = set(snapshot.brokers)
    changes = plan_failover(snapshot, down, unclean)
    for change in changes:
        check_record(change)
        old, new = change.old, change.new
        if change.reason is ChangeReason.UNCLEAN:
            assert new.isr == (new.leader,) and not set(old.isr) & live
        else:
            assert set(new.isr) <= set(old.isr), "failover never adds to the ISR"
        if new.leader:
            assert new.leader in live and (new.leader == old.leader or new.leader not in down)
        if change.reason in (ChangeReason.FAILOVER, ChangeReason.SHRINK_ISR):
            assert set(new.isr) == set(old.isr) & live
    assert plan_failover(apply(snapshot, changes), down, unclean) == []


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_balance_keeps_the_invariants_and_reaches_a_fixpoint(
    cluster: tuple[MetadataSnapshot, frozenset[str], bool],
) -> None:
    snapshot, down, _ = cluster
    changes = plan_balance(snapshot, down)
    for change in changes:
        check_record(change)
        assert change.new.leader == change.new.replicas[0] and change.new.isr == change.old.isr
    assert plan_balance(apply(snapshot, changes), down) == []


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from(BROKERS))
def test_controlled_shutdown_keeps_the_invariants(
    cluster: tuple[MetadataSnapshot, frozenset[str], bool], leaving: str
) -> None:
    snapshot, down, _ = cluster
    plan = plan_controlled_shutdown(snapshot, leaving, down)
    for change in plan.changes:
        check_record(change)
        assert leaving not in change.new.isr and change.new.leader != leaving
        assert set(change.new.isr) < set(change.old.isr)
    after = apply(snapshot, plan.changes)
    assert plan.still_leading == sum(1 for p in after.partitions.values() if p.leader == leaving)
    assert plan_controlled_shutdown(after, leaving, down).changes == ()


@settings(max_examples=300, deadline=None)
@given(clusters(), st.sampled_from(BROKERS), st.integers(0, 6), st.lists(st.sampled_from(BROKERS), unique=True))
def test_alter_isr_either_refuses_or_keeps_the_invariants(
    cluster: tuple[MetadataSnapshot, frozenset[str], bool], leader: str, epoch: int, isr: list[str]
) -> None:
    snapshot, down, _ = cluster
    record = next(iter(snapshot.partitions.values()), None)
    try:
        new = decide_alter_isr(record, AlterIsrRequest("s", 0, leader, epoch, tuple(isr)), set(snapshot.brokers), down)
    except AlterIsrError as error:
        assert error.current == record
        return
    assert record is not None
    if leader not in isr:  # stepping down: to a live member of the old ISR, one epoch later, without the leader
        assert new.leader_epoch == epoch + 1 and new.leader in record.isr and leader not in new.isr
        assert new.leader in snapshot.brokers and new.leader not in down and set(new.isr) <= set(record.isr)
        return
    assert msgspec.structs.replace(new, isr=record.isr) == record
    assert new.leader == leader and new.leader_epoch == epoch and leader in new.isr
    assert set(new.isr) <= set(new.replicas)
    assert all(b in snapshot.brokers and b not in down for b in set(new.isr) - set(record.isr))
