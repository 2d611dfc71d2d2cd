"""Reassignment decisions on partition records (pure functions): start, complete, cancel, progress, and the
fewest-moves, rack-aware plans that take replicas off brokers."""

from __future__ import annotations

import msgspec
import pytest

from tidelog.metadata import reassignment_plans as plans
from tidelog.metadata.records import BrokerRecord, PartitionRecord, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol.errors import InvalidArgumentError

from .helpers import part

LIVE = frozenset("abcd")


def _moving(record: PartitionRecord, target: str) -> PartitionRecord:
    return plans.start(record, tuple(target))


def test_start_adds_the_new_replicas_and_remembers_both_sides() -> None:
    record = part("s", "abc", "a", "abc", 4)
    moving = _moving(record, "abd")
    assert moving.replicas == ("a", "b", "c", "d")
    assert (moving.reassign_from, moving.reassign_to) == (("a", "b", "c"), ("a", "b", "d"))
    assert (moving.leader, moving.isr, moving.leader_epoch) == ("a", ("a", "b", "c"), 4)
    assert plans.adding(moving) == ("d",)
    assert plans.removing(moving) == ("c",)
    assert plans.start(record, ("a", "b", "c")) == record  # the same replicas: nothing to do


def test_a_paused_partition_is_resumed_by_its_move() -> None:
    """A paused partition runs in neither role, so its new replicas could never catch up: a decommission waited
    for ever on the auto-paused ``__cursors`` partition (nemesis). Moving it resumes it (it pauses again when idle)."""
    paused = msgspec.structs.replace(part("s", "a", "a", "a"), paused=True, paused_ns=5, resume_all=True)
    moving = plans.start(paused, ("b",), now_ns=9)
    assert (moving.paused, moving.resume_all, moving.paused_ns, moving.resumed_ns) == (False, False, 5, 9)
    assert moving.reassign_to == ("b",)


def test_a_new_target_replaces_the_one_in_progress_and_cancel_still_restores_the_old_record() -> None:
    record = part("s", "ab", "a", "ab", 2)
    moving = _moving(record, "ac")
    assert plans.start(moving, ("a", "c"), 500).throttle_bps == 500  # the same one: only its throttle
    again = plans.start(moving, ("a", "d"), 700, live=LIVE)
    assert (again.replicas, again.isr, again.leader) == (("a", "b", "d"), ("a", "b"), "a")
    assert (again.reassign_from, again.reassign_to, again.throttle_bps) == (("a", "b"), ("a", "d"), 700)
    assert plans.cancel(again, LIVE) == record
    assert plans.start(moving, ("a", "b"), live=LIVE) == record  # back to where it started: a cancel


def test_a_new_target_drops_the_brokers_it_no_longer_adds_and_moves_a_leader_among_them() -> None:
    moving = _moving(part("s", "ab", "a", "ab", 2), "cd")
    led_by_c = msgspec.structs.replace(moving, leader="c", isr=("a", "b", "c"), leader_epoch=3)
    again = plans.start(led_by_c, ("b", "e"), live=LIVE | {"e"})
    assert (again.replicas, again.isr, again.leader, again.leader_epoch) == (("a", "b", "e"), ("a", "b"), "a", 4)


def test_a_new_target_may_not_drop_the_in_sync_replicas_min_isr_needs() -> None:
    moving = _moving(part("s", "ab", "a", "a", 2), "cde")  # b behind; c, d, e caught up
    synced = msgspec.structs.replace(moving, isr=("a", "c", "d", "e"))
    with pytest.raises(InvalidArgumentError, match=r"ISR from 4 to 1 \(it drops c, d, e, in sync\), below min_isr 2"):
        plans.start(synced, ("a", "b", "f"), live=LIVE, min_isr=2)
    only_new = msgspec.structs.replace(moving, leader="d", isr=("d", "e"))
    with pytest.raises(InvalidArgumentError, match="would drop every in-sync replica"):
        plans.start(only_new, ("a", "b", "f"), live=LIVE)
    assert plans.start(synced, ("c", "d", "f"), live=LIVE, min_isr=2).isr == ("a", "c", "d")


def test_completion_waits_until_every_target_is_in_sync() -> None:
    moving = _moving(part("s", "abc", "a", "abc"), "abd")
    assert plans.complete(moving, LIVE) is None  # d is catching up
    synced = msgspec.structs.replace(moving, isr=("a", "b", "c", "d"))
    done = plans.complete(synced, LIVE)
    assert done is not None
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == (("a", "b", "d"), ("a", "b", "d"), "a", 0)
    assert (done.reassign_to, done.reassign_from) == ((), ())


def test_completion_moves_leadership_to_the_first_target_when_the_leader_leaves() -> None:
    moving = msgspec.structs.replace(_moving(part("s", "ab", "a", "ab", 7), "cb"), isr=("a", "b", "c"))
    done = plans.complete(moving, LIVE)
    assert done is not None
    assert (done.replicas, done.leader, done.leader_epoch, done.isr) == (("c", "b"), "c", 8, ("c", "b"))


def test_completion_waits_for_a_live_leader() -> None:
    moving = msgspec.structs.replace(_moving(part("s", "ab", "a", "ab"), "ac"), isr=("a", "b", "c"))
    assert plans.complete(moving, frozenset("bc")) is None  # failover goes first
    assert plans.complete(msgspec.structs.replace(moving, leader=""), LIVE) is None


def test_cancel_restores_the_old_replicas_and_hands_leadership_back() -> None:
    moving = _moving(part("s", "ab", "a", "ab", 2), "cd")
    undone = plans.cancel(moving, LIVE)
    assert (undone.replicas, undone.isr, undone.leader, undone.leader_epoch) == (("a", "b"), ("a", "b"), "a", 2)
    led_by_new = msgspec.structs.replace(moving, leader="c", isr=("a", "c"), leader_epoch=3)
    back = plans.cancel(led_by_new, LIVE)
    assert (back.replicas, back.isr, back.leader, back.leader_epoch) == (("a", "b"), ("a",), "a", 4)


def test_cancel_refuses_to_lose_committed_records_or_go_below_min_isr() -> None:
    moving = _moving(part("s", "ab", "a", "ab"), "cd")
    only_new = msgspec.structs.replace(moving, leader="c", isr=("c", "d"))
    with pytest.raises(InvalidArgumentError, match="none of its original replicas"):
        plans.cancel(only_new, LIVE)
    one_old = msgspec.structs.replace(moving, isr=("a", "c", "d"))
    with pytest.raises(InvalidArgumentError, match="below min_isr 2"):
        plans.cancel(one_old, LIVE, min_isr=2)
    with pytest.raises(InvalidArgumentError, match="not being reassigned"):
        plans.cancel(part("s", "ab", "a", "ab"), LIVE)


def test_targets_are_checked() -> None:
    record = part("s", "ab", "a", "ab")
    with pytest.raises(InvalidArgumentError, match="empty"):
        plans.check_target(record, (), LIVE, 1)
    with pytest.raises(InvalidArgumentError, match="twice"):
        plans.check_target(record, ("a", "a"), LIVE, 1)
    with pytest.raises(InvalidArgumentError, match="x is not a live broker"):
        plans.check_target(record, ("a", "x"), LIVE, 1)
    with pytest.raises(InvalidArgumentError, match="fewer than the stream's min_isr 2"):
        plans.check_target(record, ("c",), LIVE, 2)
    plans.check_target(record, ("b", "c"), LIVE, 2)
    moving = _moving(record, "ax")  # x is in the replicas only because it was being added: not good enough
    with pytest.raises(InvalidArgumentError, match="x is not a live broker"):
        plans.check_target(moving, ("a", "x"), LIVE, 1)
    plans.check_target(moving, ("b", "c"), LIVE - {"b"}, 1)  # b held it before: it may be down for now


def test_progress_says_what_a_partition_waits_for() -> None:
    moving = _moving(part("s", "abc", "a", "a"), "abd")
    assert plans.progress(moving, ("a", "b", "d"), LIVE, 2) == plans.Progress(
        "waiting", "below min-ISR (1 in sync, min_isr 2)"
    )
    assert plans.progress(moving, ("a", "b", "d"), frozenset("abc"), 1).detail.startswith("d not running")
    assert plans.progress(moving, ("a", "b", "d"), LIVE, 1) == plans.Progress("in-progress", "catching up: b, d")
    assert plans.progress(part("s", "abd", "a", "abd"), ("a", "b", "d"), LIVE).state == "complete"
    assert plans.progress(part("s", "abc", "a", "abc"), ("a", "b", "d"), LIVE).state == "other"


def _snapshot(parts: list[PartitionRecord], racks: dict[str, str]) -> MetadataSnapshot:
    brokers = {b: BrokerRecord(b, "h", 1, 1, 0, rack) for b, rack in racks.items()}
    streams = {p.stream: StreamRecord(p.stream, p.stream, "", 1, len(p.replicas), 0) for p in parts}
    return MetadataSnapshot(streams=streams, partitions={(p.stream, p.id): p for p in parts}, brokers=brokers)


def test_moving_off_a_broker_changes_only_its_replica_and_spreads_the_moves() -> None:
    parts = [part(f"s{i}", "abc", "a", "abc") for i in range(4)]
    snap = _snapshot(parts, {b: "" for b in "abcde"})
    moves, stuck = plans.plan_off(snap, ["c"], "abde")
    assert stuck == []
    targets = [t for _, t in moves]
    assert all(t[:2] == ("a", "b") and t[2] in "de" for t in targets)  # one replica each, in place
    assert sorted(t[2] for t in targets) == ["d", "d", "e", "e"]  # least loaded first: the moves spread


def test_moving_off_a_broker_prefers_a_rack_the_partition_does_not_use() -> None:
    snap = _snapshot([part("s", "ab", "a", "ab")], {"a": "r1", "b": "r2", "c": "r1", "d": "r3"})
    moves, _ = plans.plan_off(snap, ["b"], "acd")
    assert moves[0][1] == ("a", "d")  # not c, first by name: it shares rack r1 with a


def test_a_partition_with_nowhere_to_go_is_reported_not_moved() -> None:
    snap = _snapshot([part("s", "ab", "a", "ab")], {"a": "", "b": ""})
    moves, stuck = plans.plan_off(snap, ["b"], "a")
    assert moves == []
    assert [note for _, note in stuck] == ["no other broker can take its replica on b"]


def test_a_gone_target_is_replaced_in_place_rack_aware_never_by_a_broker_being_removed() -> None:
    # s: a,b → a,c (b being removed, say by a decommission); c dies while catching up. d shares a's rack, e not.
    moving = _moving(part("s", "ab", "a", "ab"), "ac")
    still = part("t", "ab", "a", "ab")  # not moving: plan_off's, not re-targeted
    racks = {"a": "r1", "b": "r2", "c": "r2", "d": "r1", "e": "r3"}
    retargets, stuck = plans.plan_retargets(_snapshot([moving, still], racks), ["c"], "abde")
    assert (retargets, stuck) == ([(moving, ("a", "e"))], [])  # not b (removed), not d (a's rack)
    new = plans.start(moving, ("a", "e"), live=frozenset("abde"))
    assert (new.replicas, new.reassign_from, new.reassign_to) == (("a", "b", "e"), ("a", "b"), ("a", "e"))
    assert plans.cancel(new, frozenset("abde")) == part("s", "ab", "a", "ab")
    detail = plans.progress(new, ("a", "c"), frozenset("abde")).detail  # --verify of the first plan
    assert detail.startswith("being reassigned to a,e instead; c is not running"), detail
    _, nowhere = plans.plan_retargets(_snapshot([moving], racks), ["c"], "ab")
    assert [note for _, note in nowhere] == ["no other live broker can take the place of c in its target"]
