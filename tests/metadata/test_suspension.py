"""The controller's fail-to-safety decisions, as pure functions: who may suspend a partition, and which head an
operator may confirm."""

from __future__ import annotations

import msgspec
import pytest

from tidelog.metadata.records import PartitionRecord
from tidelog.metadata.suspension import (
    HeadRejection,
    LeaderBounds,
    SuspendRequest,
    SuspensionError,
    check_leader,
    decide_reset_head,
    decide_suspend,
)

RECORD = PartitionRecord("s", 0, ("a", "b", "c"), "a", ("a", "b"), leader_epoch=5)
SUSPENDED = msgspec.structs.replace(RECORD, suspended="a lost records", suspended_ns=1)
NOW = 1_700_000_000_000_000_000


def refused(reason: HeadRejection) -> pytest.RaisesExc[SuspensionError]:
    return pytest.raises(SuspensionError, match=f"^{reason.value}: ")


def test_the_leader_of_the_current_epoch_suspends_with_its_evidence() -> None:
    new = decide_suspend(RECORD, SuspendRequest("s", 0, "a", 5, "replica b fetched from 9"), NOW)
    assert new == msgspec.structs.replace(RECORD, suspended="replica b fetched from 9", suspended_ns=NOW)
    assert new.leader_epoch == RECORD.leader_epoch  # no epoch bump: the same leadership goes on, suspended


def test_the_first_evidence_stands() -> None:
    assert decide_suspend(SUSPENDED, SuspendRequest("s", 0, "a", 5, "something else"), NOW) == SUSPENDED


@pytest.mark.parametrize(
    ("request_", "reason", "retriable"),
    [
        (SuspendRequest("s", 0, "a", 4, "old"), HeadRejection.STALE_EPOCH, False),  # a deposed leader
        (SuspendRequest("s", 0, "a", 6, "new"), HeadRejection.NEWER_EPOCH, True),  # the controller lags
        (SuspendRequest("s", 0, "b", 5, "not me"), HeadRejection.NOT_LEADER, False),
    ],
)
def test_only_the_current_leadership_may_suspend(
    request_: SuspendRequest, reason: HeadRejection, retriable: bool
) -> None:
    with refused(reason) as info:
        decide_suspend(RECORD, request_, NOW)
    assert info.value.retriable is retriable
    assert info.value.current == RECORD


def test_an_unknown_partition_cannot_be_suspended() -> None:
    with refused(HeadRejection.UNKNOWN_PARTITION):
        decide_suspend(None, SuspendRequest("s", 0, "a", 5, "x"), NOW)


def test_reset_head_needs_a_live_leader() -> None:
    assert check_leader(SUSPENDED, "s/0", {"a", "b"}) == SUSPENDED
    with refused(HeadRejection.NO_LEADER) as info:
        check_leader(SUSPENDED, "s/0", {"b", "c"})
    assert info.value.retriable
    with refused(HeadRejection.NO_LEADER):
        check_leader(msgspec.structs.replace(SUSPENDED, leader=""), "s/0", {"a"})
    with refused(HeadRejection.UNKNOWN_PARTITION):
        check_leader(None, "s/0", {"a"})


def test_reset_head_confirms_the_log_end_by_default_one_epoch_later() -> None:
    new = decide_reset_head(SUSPENDED, LeaderBounds(5, 7, 10), None)
    assert new == msgspec.structs.replace(RECORD, leader_epoch=6, head_epoch=6, head_offset=10)
    assert not new.suspended and new.suspended_ns == 0


@pytest.mark.parametrize("head", [7, 8, 10])
def test_reset_head_takes_any_head_from_the_hw_to_the_log_end(head: int) -> None:
    new = decide_reset_head(SUSPENDED, LeaderBounds(5, 7, 10), head)
    assert (new.head_epoch, new.head_offset) == (6, head)


@pytest.mark.parametrize(
    ("head", "says"),
    [(11, "beyond the leader's log end 10; records cannot be invented"), (6, "below the high watermark 7")],
)
def test_reset_head_refuses_a_head_outside_the_leaders_bounds(head: int, says: str) -> None:
    with refused(HeadRejection.BAD_OFFSET) as info:
        decide_reset_head(SUSPENDED, LeaderBounds(5, 7, 10), head)
    assert says in str(info.value) and not info.value.retriable


def test_reset_head_on_a_partition_that_takes_appends_is_refused() -> None:
    with refused(HeadRejection.NOT_SUSPENDED) as info:
        decide_reset_head(RECORD, LeaderBounds(5, 7, 10), None)
    assert "not suspended" in str(info.value) and not info.value.retriable


def test_reset_head_counts_the_leaders_own_unrecorded_suspension() -> None:
    new = decide_reset_head(RECORD, LeaderBounds(5, 10, 10, suspended="found just now"), None)
    assert (new.leader_epoch, new.head_offset, new.suspended) == (6, 10, "")


def test_reset_head_waits_for_the_leader_to_take_the_current_record() -> None:
    with refused(HeadRejection.LEADER_LAGS) as info:
        decide_reset_head(SUSPENDED, LeaderBounds(4, 7, 10), None)
    assert info.value.retriable
