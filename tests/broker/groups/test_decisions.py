"""What each group change makes of a group's record, and what it refuses (pure: no etcd)."""

from __future__ import annotations

import pytest

from tidelog.broker.groups.decisions import (
    decide_join,
    decide_leave,
    decide_new_coordinator,
    decide_reconcile,
    pick_coordinator,
)
from tidelog.metadata.group_records import GroupMember, GroupRecord, check_id
from tidelog.protocol.errors import (
    GroupRefusedError,
    InvalidArgumentError,
    UnavailableError,
    UnknownGroupError,
    UnknownMemberError,
)

COUNTS = {"s": 4, "t": 2}
LIVE = ("b0", "b1", "b2")


def group(coordinator: str = "b0", *members: GroupMember, epoch: int = 10) -> GroupRecord:
    return GroupRecord("g", coordinator, epoch, tuple(members))


def test_a_new_group_goes_to_the_broker_coordinating_fewest_groups() -> None:
    others = {"x": group("b0"), "y": group("b0"), "z": group("b1")}
    record = decide_join(None, "g", "c1", ["s"], COUNTS, LIVE, others, 7, 0)
    assert (record.coordinator, record.epoch) == ("b2", 7)
    assert record.members == (GroupMember("c1", ("s",), (("s", (0, 1, 2, 3)),)),)
    assert pick_coordinator((), {}) is None
    with pytest.raises(UnavailableError):
        decide_join(None, "g", "c1", ["s"], COUNTS, (), {}, 7, 0)


def test_joining_rebalances_and_takes_the_new_epoch() -> None:
    first = decide_join(None, "g", "c1", ["s", "t"], COUNTS, LIVE, {}, 5, 0)
    second = decide_join(first, "g", "c2", ["s"], COUNTS, LIVE, {"g": first}, 9, 0)
    assert second.epoch == 9 and second.coordinator == first.coordinator
    owned = {m.id: set(m.partitions()) for m in second.members}
    assert len(owned["c1"]) == 3 and len(owned["c2"]) == 3
    assert all(stream == "s" for stream, _ in owned["c2"])


def test_joins_that_would_store_nothing_valid_are_refused() -> None:
    with pytest.raises(GroupRefusedError, match="no such stream nope"):
        decide_join(None, "g", "c1", ["s", "nope"], COUNTS, LIVE, {}, 5, 0)
    record = decide_join(None, "g", "c1", ["s"], COUNTS, LIVE, {}, 5, 0)
    with pytest.raises(GroupRefusedError, match="already a member"):
        decide_join(record, "g", "c1", ["s"], COUNTS, LIVE, {}, 6, 0)


def test_leaving() -> None:
    with pytest.raises(UnknownGroupError):
        decide_leave(None, "g", "c1", COUNTS, 5)
    record = decide_join(None, "g", "c1", ["s"], COUNTS, LIVE, {}, 5, 0)
    with pytest.raises(UnknownMemberError):
        decide_leave(record, "g", "c2", COUNTS, 6)
    assert decide_leave(record, "g", "c1", COUNTS, 6) is None, "the last member leaving deletes the group"
    both = decide_join(record, "g", "c2", ["s"], COUNTS, LIVE, {}, 6, 0)
    left = decide_leave(both, "g", "c2", COUNTS, 7)
    assert left is not None and left.epoch == 7 and len(list(left.members[0].partitions())) == 4


def test_failover_picks_another_live_broker() -> None:
    record = decide_join(None, "g", "c1", ["s"], COUNTS, ("b0",), {}, 5, 0)
    moved = decide_new_coordinator(record, LIVE, {"g": record, "h": group("b1")}, 8)
    assert (moved.coordinator, moved.epoch, moved.members) == ("b2", 8, record.members)
    with pytest.raises(GroupRefusedError, match="no group coordinator candidates"):
        decide_new_coordinator(record, ("b0",), {}, 8)


def test_reconcile_replaces_a_dead_coordinator_and_drops_deleted_streams() -> None:
    record = decide_join(None, "g", "c1", ["s", "t"], COUNTS, LIVE, {}, 5, 0)
    assert decide_reconcile(record, COUNTS, LIVE, {"g": record}, 6) is None
    dead = decide_reconcile(record, COUNTS, ("b1",), {"g": record}, 6)
    assert dead is not None and (dead.coordinator, dead.epoch) == ("b1", 6)
    no_t = decide_reconcile(record, {"s": 4}, LIVE, {"g": record}, 6)
    assert no_t is not None and no_t.members == (GroupMember("c1", ("s",), (("s", (0, 1, 2, 3)),)),)


@pytest.mark.parametrize("value", ["", "x" * 256, "a/b", "a b", "tab\t", "\x00"])
def test_bad_ids_are_refused(value: str) -> None:
    with pytest.raises(InvalidArgumentError):
        check_id("groupId", value)


def test_good_ids_pass() -> None:
    check_id("groupId", "x" * 255)
    check_id("consumerId", "__group:orders-1.é")
